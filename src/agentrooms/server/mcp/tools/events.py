"""The tools of the event log: read_new_events, ack_events, post_event."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field, JsonValue

from agentrooms.rooms import Room
from agentrooms.server.auth import Principal
from agentrooms.server.deps import command_id
from agentrooms.server.mcp.tools.base import (
    Body,
    RequestId,
    RoomArg,
    ToolsBase,
    WaitArg,
    _event,
)
from agentrooms.server.models import MAX_INT, NAME_PATTERN
from agentrooms.store.types import Event


class EventTools(ToolsBase):
    async def read_new_events(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        limit: Annotated[int, Field(ge=1, le=1000, description="at most this many")] = 100,
        wait: WaitArg = 0.0,
        explicit: Annotated[
            bool, Field(description="keep your cursor until ack_events (at-least-once)")
        ] = False,
        skip_to_latest: Annotated[
            bool,
            Field(description="move your cursor to the newest event without reading (resync)"),
        ] = False,
    ) -> CallToolResult:
        """Events you have not seen yet, oldest first, as {seq, type, data, author}, waiting
        up to wait seconds for one; your cursor moves past them (explicit: only on
        ack_events), so the next call returns only newer ones. more=true: call again."""

        async def body(principal: Principal, r: Room) -> Body:
            agent = principal.agent
            if skip_to_latest:
                return {"events": [], "cursor": await r.events.resync(agent)}

            ack: Literal["auto", "explicit"] = "explicit" if explicit else "auto"

            async def once() -> tuple[list[Event] | None, None]:
                return (await r.events.read_new(agent, limit, ack=ack) or None), None

            events = await self._until(r, wait, once)
            if not events or explicit:
                cursor = await r.events.cursor(agent)
                if not events:
                    return {"events": [], "cursor": cursor}
            else:
                cursor = events[-1].seq
            more = len(events) == limit and await r.store.last_seq(r.name) > events[-1].seq
            return {"events": [_event(e) for e in events], "cursor": cursor, "more": more or None}

        return await self.run(ctx, room, "events:read", body, "events")

    async def ack_events(
        self,
        room: RoomArg,
        seq: Annotated[int, Field(ge=0, le=MAX_INT, description="the last event you handled")],
        ctx: Context[Any, Any],
    ) -> CallToolResult:
        """Move your cursor forward to seq (never back): the events up to it are handled.
        For read_new_events with explicit=true."""

        async def body(principal: Principal, r: Room) -> Body:
            return {"cursor": await r.events.ack(principal.agent, seq)}

        return await self.run(ctx, room, "events:read", body, "events")

    async def post_event(
        self,
        room: RoomArg,
        type: Annotated[
            str,
            Field(pattern=NAME_PATTERN, max_length=128, description="event type, e.g. 'note'"),
        ],
        ctx: Context[Any, Any],
        data: Annotated[JsonValue, Field(description="the event's data (JSON)")] = None,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Append an event to the room's log for every agent to read; you are its author."""

        async def body(principal: Principal, r: Room) -> Body:
            cmd = command_id(principal, request_id)
            seq = await r.events.post(type, data, command_id=cmd, author=principal.agent)
            return {"seq": seq}

        return await self.run(ctx, room, "events:write", body)
