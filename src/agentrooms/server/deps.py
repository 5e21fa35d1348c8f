"""What routes share: who is calling, the room they may enter, the agent they act as, and
the command id of an ``Idempotency-Key``.

Authorization order, so nothing leaks: the room first (a room outside the token is
answered exactly like an absent one: the library's own ``NotFound``), then the scope
(``403``), then the route's own checks (partition, acting agent).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from agentrooms.rooms import Room, Rooms
from agentrooms.server.access import PRINCIPAL, act_as, command_id, enter, held_grant
from agentrooms.server.auth import Principal
from agentrooms.server.limits import HttpLimits
from agentrooms.server.models import NAME_PATTERN

__all__ = [
    "Access",
    "DocsRead",
    "DocsWrite",
    "EventsRead",
    "EventsWrite",
    "IdempotencyKey",
    "LeaseAcquire",
    "LocksWrite",
    "PlanRead",
    "PlanWrite",
    "PresenceWrite",
    "RoomPath",
    "RoomsRead",
    "RoomsWrite",
    "access",
    "act_as",
    "command_id",
    "enter",
    "held_grant",
    "limits_of",
    "rooms_of",
]

bearer = HTTPBearer(auto_error=False, description="a token minted for one agent: ar_<id>_<secret>")

RoomPath = Annotated[
    str, Path(pattern=NAME_PATTERN, min_length=1, max_length=128, description="the room")
]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=r"^[!-~]{1,64}$",
        description="repeat a command safely: the same key returns the original outcome, "
        "the same key with another body is 422 idempotency_mismatch (scoped per agent)",
    ),
]


@dataclass(frozen=True, slots=True)
class Access:
    """The caller and the room handle it was admitted to."""

    principal: Principal
    room: Room

    @property
    def agent(self) -> str:
        return self.principal.agent


def principal_of(request: Request) -> Principal:
    principal: Principal = request.scope[PRINCIPAL]
    return principal


def rooms_of(request: Request) -> Rooms:
    rooms: Rooms = request.app.state.rooms
    return rooms


def limits_of(request: Request) -> HttpLimits:
    limits: HttpLimits = request.app.state.limits
    return limits


def access(scope: str) -> Callable[..., Awaitable[Access]]:
    """A dependency admitting the caller to the path's room with ``scope``."""

    async def dependency(
        request: Request,
        room: RoomPath,
        _: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    ) -> Access:
        principal = principal_of(request)
        return Access(principal, enter(principal, rooms_of(request), room, scope))

    return dependency


# One alias per scope, for route signatures: ``access: DocsRead``.
RoomsRead = Annotated[Access, Depends(access("rooms:read"))]
RoomsWrite = Annotated[Access, Depends(access("rooms:write"))]
PlanRead = Annotated[Access, Depends(access("plan:read"))]
PlanWrite = Annotated[Access, Depends(access("plan:write"))]
LeaseAcquire = Annotated[Access, Depends(access("lease:acquire"))]
DocsRead = Annotated[Access, Depends(access("docs:read"))]
DocsWrite = Annotated[Access, Depends(access("docs:write"))]
EventsRead = Annotated[Access, Depends(access("events:read"))]
EventsWrite = Annotated[Access, Depends(access("events:write"))]
PresenceWrite = Annotated[Access, Depends(access("presence:write"))]
LocksWrite = Annotated[Access, Depends(access("locks:write"))]
