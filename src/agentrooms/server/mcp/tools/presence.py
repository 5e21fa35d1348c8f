"""The tools of rooms and presence: list_rooms, join_room, heartbeat, who_is_online."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult

from agentrooms.errors import (
    Forbidden,
)
from agentrooms.rooms import Room
from agentrooms.server.auth import Principal
from agentrooms.server.mcp.tools.base import (
    Body,
    RoomArg,
    StatusArg,
    ToolsBase,
)


class PresenceTools(ToolsBase):
    async def join_room(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        status: StatusArg = "online",
    ) -> CallToolResult:
        """Enter a room: announces you as online and returns where you stand: your event
        cursor, how many events you have not read (unread), how many tasks are ready, who
        is online, your role and which documents you may write. Call it first."""

        async def body(principal: Principal, r: Room) -> Body:
            member = await r.presence.heartbeat(principal.agent, status)
            out: dict[str, Any] = {"room": r.name, "you": principal.agent}
            if principal.has("events:read"):
                cursor = await r.events.cursor(principal.agent)
                head = await r.store.last_seq(r.name)
                out |= {"cursor": cursor, "unread": max(0, head - cursor)}
            if principal.has("plan:read"):
                out["ready"] = await r.plan.ready_count()
            if principal.has("rooms:read"):
                out["online"] = {m.agent: m.status for m in await r.presence.who_is_online()}
            out["heartbeat_every"] = round((member.expires_at - member.last_seen) / 2, 1)
            return out | {"role": principal.role, "writes": principal.writes()}

        return await self.run(ctx, room, "presence:write", body)

    async def heartbeat(
        self, room: RoomArg, ctx: Context[Any, Any], status: StatusArg = "online"
    ) -> CallToolResult:
        """Say you are still here (and what you are doing). Presence expires unless renewed:
        call it every heartbeat_every seconds that join_room returned."""

        async def body(principal: Principal, r: Room) -> Body:
            member = await r.presence.heartbeat(principal.agent, status)
            return {"status": member.status, "expires_in": member.expires_at - member.last_seen}

        return await self.run(ctx, room, "presence:write", body)

    async def who_is_online(self, room: RoomArg, ctx: Context[Any, Any]) -> CallToolResult:
        """Agents whose presence has not expired, with the status each last gave."""

        async def body(principal: Principal, r: Room) -> Body:
            return {"online": {m.agent: m.status for m in await r.presence.who_is_online()}}

        return await self.run(ctx, room, "rooms:read", body)

    async def list_rooms(self, ctx: Context[Any, Any]) -> CallToolResult:
        """The rooms you may enter, with how many tasks are ready in each."""

        async def body(principal: Principal) -> Body:
            if not principal.has("rooms:read"):
                raise Forbidden("this token lacks the 'rooms:read' scope")
            rooms = [i for i in await self.rooms.list() if principal.may_enter(i.name)]
            return {
                "rooms": [
                    {"name": i.name, "description": i.description or None, "ready": i.ready}
                    for i in rooms
                ]
            }

        return await self.answer(ctx, body)
