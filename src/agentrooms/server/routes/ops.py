"""The operator API: read-only JSON views of rooms for the on-call engineer, and an SSE
stream that says when a room's log grew (docs/operations.md has the contract).

Every route needs the ``ops:read`` scope (``admin`` implies it). A room outside the
token's rooms is answered as an absent one (404) and left out of the rooms list.
Thresholds of the stuck list are query parameters with the library's defaults.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials

from agentrooms.errors import AgentroomsError, Forbidden
from agentrooms.ops import Ops, Thresholds, as_json
from agentrooms.server.deps import Access, access, bearer, limits_of, principal_of
from agentrooms.server.models import MAX_INT, NAME_PATTERN
from agentrooms.server.routes import COMMON, errors
from agentrooms.server.sse import HEADERS, RETRY, EventStream, comment, error_frame, grown
from agentrooms.store.base import Store

SCOPE = "ops:read"
router = APIRouter(prefix="/ops", tags=["ops"], responses=errors(*COMMON))
OpsRead = Annotated[Access, Depends(access(SCOPE))]
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]
Name = Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)]
_DEFAULT = Thresholds()
STREAM_EVENT = {  # one parsed SSE event of the change stream
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": ["change", "error"]},
        "data": {"type": "string", "description": 'JSON: {"last_seq": n}, or {"error": ...}'},
    },
}


def _ops(request: Request) -> Ops:
    store: Store = request.app.state.store
    return Ops(store)


def thresholds(
    effect_unknown: Annotated[
        float, Query(ge=0, le=86_400 * 365, description="s an effect is unknown before stuck")
    ] = _DEFAULT.effect_unknown,
    waiter_waiting: Annotated[
        float, Query(ge=0, le=86_400 * 365, description="s a lock waiter waits before stuck")
    ] = _DEFAULT.waiter_waiting,
    cursor_lag: Annotated[
        int, Query(ge=0, le=MAX_INT, description="events a cursor lags before stuck")
    ] = _DEFAULT.cursor_lag,
) -> Thresholds:
    return Thresholds(effect_unknown, waiter_waiting, cursor_lag)


Limits = Annotated[Thresholds, Depends(thresholds)]


@router.get("/rooms", summary="Rooms overview: counts, stuck, locks held, online")
async def rooms(
    request: Request,
    _: Bearer,
    limits: Limits,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    after: Name = None,
) -> dict[str, Any]:
    principal = principal_of(request)
    if not principal.has(SCOPE):
        raise Forbidden(f"this token lacks the {SCOPE!r} scope")
    page = await _ops(request).rooms(limit, after, allowed=principal.may_enter, thresholds=limits)
    out: dict[str, Any] = as_json(page)
    return out


@router.get("/rooms/{room}", summary="One room's first screen, in one call")
async def room(request: Request, access: OpsRead, limits: Limits) -> dict[str, Any]:
    out: dict[str, Any] = as_json(await _ops(request).room(access.room.name, limits))
    return out


@router.get("/rooms/{room}/tasks", summary="The room's tasks in id order, paginated")
async def tasks(
    request: Request,
    access: OpsRead,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Name = None,
    status: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    page = await _ops(request).tasks(access.room.name, limit, after, status)
    out: dict[str, Any] = as_json(page)
    return out


@router.get("/rooms/{room}/events", summary="The room's events newest first, filterable")
async def events(
    request: Request,
    access: OpsRead,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    before: Annotated[int | None, Query(ge=1, le=MAX_INT)] = None,
    type: Name = None,
    author: Name = None,
) -> dict[str, Any]:
    page = await _ops(request).events(access.room.name, limit, before, type, author)
    out: dict[str, Any] = as_json(page)
    return out


@router.get(
    "/rooms/{room}/stream",
    summary="Server-Sent Events: 'change' each time the room's log grows",
    response_class=EventStream,
    responses={
        200: {
            "description": "event: change, data: {last_seq}; ': keepalive' when idle",
            "content": {"text/event-stream": {"schema": STREAM_EVENT}},
        }
    },
)
async def stream(request: Request, access: OpsRead) -> EventStream:
    """Woken by the store's watch (not a poll); one ``change`` frame per wake-up with
    the head then (several appends may share one). Ends after the server's stream limit;
    the client reconnects. The first frame carries the head at connect."""
    limits = limits_of(request)
    store, name = access.room.store, access.room.name
    await access.room.scope.read([])  # an absent room is a 404 before the 200
    head = await store.last_seq(name)
    deadline = time.monotonic() + limits.max_stream_seconds
    frames = _changes(store, name, head, deadline, limits.keepalive_seconds)
    return EventStream(frames, headers=HEADERS)


def _change(head: int) -> bytes:
    return f"event: change\ndata: {json.dumps({'last_seq': head})}\n\n".encode()


async def _changes(
    store: Store, room: str, head: int, deadline: float, keepalive: float
) -> AsyncIterator[bytes]:
    yield RETRY
    yield _change(head)
    try:
        while time.monotonic() < deadline:
            new = await grown(store, room, head, deadline, keepalive)
            if new is None:
                yield comment("keepalive")
                continue
            head = new
            yield _change(head)
    except AgentroomsError as exc:  # the 200 is sent: report in-band and end
        yield error_frame(exc)
