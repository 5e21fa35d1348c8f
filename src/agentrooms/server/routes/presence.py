"""Presence: heartbeat (PUT), who is online (GET), leave (DELETE). An agent beats only
for itself: the path's agent must be the token's."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Response

from agentrooms.server.deps import PresenceWrite, RoomsRead, act_as
from agentrooms.server.models import NAME_PATTERN, HeartbeatIn, MemberList, MemberOut
from agentrooms.server.routes import COMMON, errors

router = APIRouter(prefix="/rooms/{room}/presence", tags=["presence"], responses=errors(*COMMON))

AgentPath = Annotated[str, Path(pattern=NAME_PATTERN, min_length=1, max_length=128)]


@router.get("", summary="Members whose heartbeat has not expired")
async def who_is_online(
    access: RoomsRead,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    after: Annotated[str | None, Query(max_length=128)] = None,
) -> MemberList:
    """Every member by agent name; with ``limit`` (or ``after``), one page of them and
    the next page's ``after`` in ``next_after``."""
    if limit is None and after is None:
        members = await access.room.presence.who_is_online()
        return MemberList(members=[MemberOut.of(m) for m in members])
    page = await access.room.presence.page(100 if limit is None else limit, after)
    return MemberList(members=[MemberOut.of(m) for m in page.members], next_after=page.next_after)


@router.put(
    "/{agent}", summary="Heartbeat (TTL judged by the store's clock)", responses=errors(409)
)
async def heartbeat(
    access: PresenceWrite,
    agent: AgentPath,
    body: Annotated[HeartbeatIn | None, Body()] = None,
) -> MemberOut:
    body = body or HeartbeatIn()
    member = await access.room.presence.heartbeat(
        act_as(access.principal, agent), body.status, body.metadata, ttl=body.ttl
    )
    return MemberOut.of(member)


@router.delete("/{agent}", status_code=204, summary="Leave the room", responses=errors(409))
async def leave(access: PresenceWrite, agent: AgentPath) -> Response:
    await access.room.presence.leave(act_as(access.principal, agent))
    return Response(status_code=204)
