"""The operator dashboard: ``/ui`` (the rooms overview) and ``/ui/rooms/{room}`` (one
room's page), plain HTML, CSS and ES modules shipped in this package (``static/``), no
build step and nothing fetched from elsewhere.

Both pages are one shell (``static/index.html``); the page's script reads everything from
the operator API (``/v1/ops/...``) with the bearer token the operator entered (kept in
``sessionStorage``), or without one in dev mode. The shell itself holds no data, but it is
still guarded like the API:

* with an ``Authorization`` header (or in dev mode) the gate admits the caller: a token
  without ``ops:read`` gets ``403``, a room outside the token ``404`` (as an absent room);
* without one on a server that requires tokens the shell is answered with ``401`` (its
  page asks for a token).

``POST /v1/ops/rooms/{room}/stream-tickets`` (``ops:read``) mints the single-use ticket the
page's ``EventSource`` opens the room's stream with (:mod:`agentrooms.server.tickets`).
Static files (``/ui/static/NAME``) are public: they are the package's own code.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field
from starlette.responses import Response

from agentrooms.errors import Forbidden, NotFound
from agentrooms.server.auth import Principal
from agentrooms.server.deps import RoomPath, bearer, enter, rooms_of
from agentrooms.server.envelope import error_response
from agentrooms.server.gate import PRINCIPAL
from agentrooms.server.routes import errors
from agentrooms.server.tickets import mint_ticket

__all__ = ["OPS_READ", "STATIC", "pages", "tickets"]

OPS_READ = "ops:read"
STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "room.js": "text/javascript; charset=utf-8",
    "overview.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# the page's own scripts, styles and API calls only: no inline script, nothing elsewhere
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

pages = APIRouter(include_in_schema=False)
tickets = APIRouter(prefix="/ops/rooms", tags=["operations"])


def _file(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _shell(request: Request, room: str | None) -> Response:
    """The page shell, once the caller may see it (see the module docstring)."""
    principal: Principal | None = request.scope.get(PRINCIPAL)
    if principal is None:  # the shell asks for a token; its API calls send it
        challenge = {"WWW-Authenticate": 'Bearer realm="agentrooms"', **_HEADERS}
        return Response(
            _file("index.html"), 401, headers=challenge, media_type=STATIC["index.html"]
        )
    if room is not None:
        enter(principal, rooms_of(request), room, OPS_READ)
    elif not principal.has(OPS_READ):
        raise Forbidden(f"this token lacks the {OPS_READ!r} scope")
    return Response(_file("index.html"), media_type=STATIC["index.html"], headers=_HEADERS)


@pages.get("/ui")
async def overview(request: Request) -> Response:
    return _shell(request, None)


@pages.get("/ui/rooms/{room}")
async def room_page(request: Request, room: RoomPath) -> Response:
    return _shell(request, room)


@pages.get("/ui/static/{name}")
async def static(name: Annotated[str, Path(max_length=64)]) -> Response:
    media = STATIC.get(name)
    if media is None:
        return error_response(NotFound(f"no dashboard file {name!r}"))
    return Response(_file(name), media_type=media, headers=_HEADERS)


class TicketOut(BaseModel):
    ticket: str = Field(description="single use; good for a few seconds (expires_at)")
    expires_at: float = Field(description="store-clock epoch seconds")
    url: str = Field(description="the stream to open with it: .../stream?ticket=T")


@tickets.post(
    "/{room}/stream-tickets",
    status_code=201,
    summary="A single-use ticket for the room's operator stream (for EventSource)",
    responses=errors(401, 403, 404, 429, 503),
)
async def stream_ticket(
    request: Request,
    room: RoomPath,
    _: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> TicketOut:
    principal: Principal = request.scope[PRINCIPAL]
    entered = enter(principal, rooms_of(request), room, OPS_READ)
    await entered.scope.read([])  # NotFound for an absent room
    minted = await mint_ticket(request.app.state.store, principal, entered.name)
    url = f"/v1/ops/rooms/{entered.name}/stream?ticket={minted.ticket}"
    return TicketOut(ticket=minted.ticket, expires_at=minted.expires_at, url=url)
