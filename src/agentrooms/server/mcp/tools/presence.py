"""The tools of rooms and presence: list_rooms, join_room, heartbeat, who_is_online."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult

from agentrooms.errors import Forbidden
from agentrooms.rooms import Room
from agentrooms.rooms.presence import MemberPage
from agentrooms.server.auth import Principal
from agentrooms.server.mcp.tools.base import (
    AfterArg,
    Body,
    Budget,
    LimitArg,
    RoomArg,
    StatusArg,
    ToolsBase,
)

ONLINE_IN_JOIN = 50  # members join_room shows; who_is_online pages through the rest


class PresenceTools(ToolsBase):
    """Rooms and presence."""

    async def join_room(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        status: StatusArg = "online",
    ) -> CallToolResult:
        """Call first. Marks you online; returns your cursor, unread events, ready tasks,
        who is online, your role and the documents you may write (writes)."""

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
                page = await r.presence.page(ONLINE_IN_JOIN)
                out |= self._online(page, Budget(self.limits.max_result_bytes // 2))
            out["heartbeat_every"] = round((member.expires_at - member.last_seen) / 2, 1)
            return out | {"role": principal.role, "writes": principal.writes()}

        return await self.run(ctx, room, "presence:write", body)

    def _online(self, page: MemberPage, budget: Budget) -> dict[str, Any]:
        """``{online: {agent: status}, next}`` of a page, cut where the budget ends."""
        online: dict[str, str] = {}
        next_after = page.next_after
        for i, m in enumerate(page.members):
            if not budget.fits([m.agent, m.status]) and i:  # the first always goes
                next_after = page.members[i - 1].agent
                break
            online[m.agent] = m.status
        return {"online": online, "next": next_after}

    async def heartbeat(
        self, room: RoomArg, ctx: Context[Any, Any], status: StatusArg = "online"
    ) -> CallToolResult:
        """Stay online: call every heartbeat_every seconds (from join_room)."""

        async def body(principal: Principal, r: Room) -> Body:
            member = await r.presence.heartbeat(principal.agent, status)
            return {"status": member.status, "expires_in": member.expires_at - member.last_seen}

        return await self.run(ctx, room, "presence:write", body)

    async def who_is_online(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        limit: LimitArg = 100,
        after: AfterArg = None,
    ) -> CallToolResult:
        """Online agents by name with their status; next: pass as after for more."""

        async def body(principal: Principal, r: Room) -> Body:
            page = await r.presence.page(limit, after)
            return self._online(page, Budget(self.limits.max_result_bytes))

        return await self.run(ctx, room, "rooms:read", body)

    async def list_rooms(
        self, ctx: Context[Any, Any], limit: LimitArg = 100, after: AfterArg = None
    ) -> CallToolResult:
        """Rooms you may enter, with ready task counts; next: pass as after for more."""

        async def body(principal: Principal) -> Body:
            if not principal.has("rooms:read"):
                raise Forbidden("this token lacks the 'rooms:read' scope")
            page = await self.rooms.page(
                limit, after, allowed=principal.may_enter, among=principal.rooms
            )
            return {
                "rooms": [
                    {"name": i.name, "description": i.description or None, "ready": i.ready}
                    for i in page.rooms
                ],
                "next": page.next_after,
            }

        return await self.answer(ctx, body)
