"""The path-reservation tools: ``reserve_paths`` (or renew one reservation),
``release_paths`` and ``check_paths``, each a thin translation to
:class:`agentrooms.rooms.paths.Paths`, run through :class:`.tools.RoomTools` (admission,
scopes, rate, error results). The reserving agent is the caller's."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field

from agentrooms.errors import PathsLost, PathsReserved
from agentrooms.rooms import Room
from agentrooms.rooms.globs import MAX_PATTERN
from agentrooms.rooms.paths import MAX_PATTERNS, PathConflict, Reservation
from agentrooms.server.auth import Principal
from agentrooms.server.mcp.hints import Hint
from agentrooms.server.mcp.tools import RoomTools
from agentrooms.server.mcp.tools.base import Body, RoomArg, _Answered

__all__ = ["PathTools"]

# (the limits only: the library checks the syntax, so the list stays short)
PathsArg = Annotated[
    list[Annotated[str, Field(max_length=MAX_PATTERN)]],
    Field(max_length=MAX_PATTERNS, description="globs: src/**, docs/*.md"),
]
ModeArg = Annotated[Literal["exclusive", "shared"], Field(max_length=9)]
IdArg = Annotated[str, Field(max_length=128)]
ReservationArg = Annotated[IdArg, Field(description="the id reserve_paths gave")]


def _reservation(r: Reservation) -> Body:
    return {"id": r.id, "fence": r.fence, "expires_at": round(r.expires_at, 3)}


def _conflict(c: PathConflict) -> Body:
    return {"path": c.pattern, "holder": c.holder, "held": c.held, "mode": c.mode}


def _hint(exc: PathsReserved | PathsLost) -> Hint:
    if isinstance(exc, PathsReserved):
        return Hint(
            exc.code,
            f"{exc.name!r} overlaps {exc.pattern!r}, reserved {exc.mode} by {exc.holder!r}",
            "nothing was reserved: work on other paths, or retry later",
            exc.details(),
        )
    return Hint(
        exc.code,
        str(exc),
        "your changes under it are unprotected: reserve_paths again, then re-check them",
        {"reservation": exc.reservation},
    )


class PathTools:
    """The path tools over the room tools' admission and error handling."""

    def __init__(self, tools: RoomTools) -> None:
        self._tools = tools

    async def _run(
        self, ctx: Context[Any, Any], room: str, scope: str, body: Any
    ) -> CallToolResult:
        async def explained(principal: Principal, r: Room) -> Body:
            try:
                out: Body = await body(principal, r)
            except (PathsReserved, PathsLost) as exc:
                raise _Answered(_hint(exc)) from exc
            return out

        return await self._tools.run(ctx, room, scope, explained, "lock")

    async def reserve_paths(
        self,
        room: RoomArg,
        paths: PathsArg,
        ctx: Context[Any, Any],
        mode: ModeArg = "exclusive",
        ttl: Annotated[float, Field(gt=0, le=86_400)] = 300.0,
        renew: Annotated[IdArg, Field(description="id: extend it instead")] = "",
    ) -> CallToolResult:
        """Reserve paths, all or none, before editing (shared goes with shared)."""

        async def body(principal: Principal, r: Room) -> Body:
            if renew:
                return _reservation(await r.paths.renew(renew, principal.agent, ttl))
            return _reservation(await r.paths.reserve(paths, principal.agent, mode=mode, ttl=ttl))

        return await self._run(ctx, room, "locks:write", body)

    async def release_paths(
        self, room: RoomArg, reservation: ReservationArg, ctx: Context[Any, Any]
    ) -> CallToolResult:
        """Release your reservation (released=false: it had lapsed)."""

        async def body(principal: Principal, r: Room) -> Body:
            return {"released": await r.paths.release(reservation, principal.agent)}

        return await self._run(ctx, room, "locks:write", body)

    async def check_paths(
        self,
        room: RoomArg,
        paths: PathsArg,
        ctx: Context[Any, Any],
        mode: ModeArg = "exclusive",
    ) -> CallToolResult:
        """Other agents' reservations overlapping paths (['**']: all)."""

        async def body(principal: Principal, r: Room) -> Body:
            found = await r.paths.check(paths, principal.agent, mode=mode)
            return {"conflicts": [_conflict(c) for c in found]}

        return await self._run(ctx, room, "rooms:read", body)
