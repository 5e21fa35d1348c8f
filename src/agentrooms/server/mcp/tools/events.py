"""The tools of the event log: read_new_events, read_event, ack_events, post_event."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field, JsonValue

from agentrooms.errors import NotFound
from agentrooms.rooms import Room
from agentrooms.server.access import command_id
from agentrooms.server.auth import Principal
from agentrooms.server.mcp.tools.base import (
    Body,
    Budget,
    OffsetArg,
    RequestId,
    RoomArg,
    ToolsBase,
    WaitArg,
    _event,
    part_of,
)
from agentrooms.server.models import MAX_INT, NAME_PATTERN

Addressee = Annotated[str, Field(max_length=128)]  # a name: the library checks it


class EventTools(ToolsBase):
    """The event log."""

    async def read_new_events(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
        wait: WaitArg = 0.0,
        explicit: Annotated[bool, Field(description="cursor moves only on ack_events")] = False,
        skip_to_latest: Annotated[
            bool,
            Field(description="skip to the newest event, reading none"),
        ] = False,
        inbox: Annotated[
            bool, Field(description="only those addressed to you or your role")
        ] = False,
    ) -> CallToolResult:
        """Events after your cursor, oldest first ({seq, type, data, author}), waiting up
        to wait s for one; each is returned once (explicit: until ack_events). more=true:
        call again. Data cut as {truncated, fetch}: read_event it."""

        async def body(principal: Principal, r: Room) -> Body:
            agent = principal.agent
            if skip_to_latest:
                return {"events": [], "cursor": await r.events.resync(agent, inbox=inbox)}

            ack: Literal["auto", "explicit"] = "explicit" if explicit else "auto"
            roles = [] if principal.role is None else [principal.role]
            more = False
            wait_for = min(wait, self.limits.max_wait)
            if inbox:
                page = await r.events.read_inbox(agent, roles, limit, ack=ack, wait=wait_for)
                events, more = page.events, page.more
            else:
                events = await r.events.read_new(agent, limit, ack=ack, wait=wait_for)
            if not events or explicit or inbox:
                cursor = await r.events.cursor(agent, inbox=inbox)
                if not events:
                    return {"events": [], "cursor": cursor, "more": more or None}
            else:
                cursor = events[-1].seq
            if not inbox:
                more = len(events) == limit and await r.store.last_seq(r.name) > events[-1].seq
            budget = Budget(self.limits.max_result_bytes)
            listed = [_event(e, budget) for e in events]
            return {"events": listed, "cursor": cursor, "more": more or None}

        return await self.run(ctx, room, "events:read", body, "events")

    async def ack_events(
        self,
        room: RoomArg,
        seq: Annotated[int, Field(ge=0, le=MAX_INT, description="last one handled")],
        ctx: Context[Any, Any],
        inbox: Annotated[bool, Field(description="of inbox reads")] = False,
    ) -> CallToolResult:
        """After read_new_events explicit=true: mark events up to seq handled (your
        cursor moves forward only)."""

        async def body(principal: Principal, r: Room) -> Body:
            return {"cursor": await r.events.ack(principal.agent, seq, inbox=inbox)}

        return await self.run(ctx, room, "events:read", body, "events")

    async def post_event(
        self,
        room: RoomArg,
        type: Annotated[
            str,
            Field(pattern=NAME_PATTERN, max_length=128, description="e.g. 'note'"),
        ],
        ctx: Context[Any, Any],
        data: Annotated[JsonValue, Field(description="JSON")] = None,
        to: Annotated[
            list[Addressee], Field(max_length=100, description="inbox of these agents")
        ] = [],  # noqa: B006
        to_roles: Annotated[list[Addressee], Field(max_length=100, description="and roles")] = [],  # noqa: B006
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Append an event to the room's log for all to read; you are its author. to /
        to_roles: also in those agents' and roles' inboxes."""

        async def body(principal: Principal, r: Room) -> Body:
            cmd = command_id(principal, request_id)
            seq = await r.events.post(
                type, data, command_id=cmd, author=principal.agent, to=to, to_roles=to_roles
            )
            return {"seq": seq}

        return await self.run(ctx, room, "events:write", body)

    async def read_event(
        self,
        room: RoomArg,
        seq: Annotated[int, Field(ge=1, le=MAX_INT)],
        ctx: Context[Any, Any],
        offset: OffsetArg = 0,
    ) -> CallToolResult:
        """One event by seq, your cursor unmoved. Data too large for one result comes in
        parts ({json, next_offset}): call again with offset=next_offset, join them."""

        async def body(principal: Principal, r: Room) -> Body:
            found = await r.events.read(seq - 1, 1)
            if not found or found[0].seq != seq:
                raise NotFound(f"no event {seq} in room {r.name!r} (expired or not yet)")
            e = found[0]
            head = {"seq": e.seq, "type": e.type, "author": e.author}
            return head | part_of(e.data, offset, self.limits.max_result_bytes - 512, "data")

        return await self.run(ctx, room, "events:read", body, "events")
