"""The MCP server object: the tools, the ``room://{room}/events`` resource and its push
stream, on the official SDK's :class:`~mcp.server.mcpserver.MCPServer`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import (
    CallToolResult,
    InputRequiredResult,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    ToolAnnotations,
    UnsubscribeRequestParams,
)
from pydantic import ValidationError

from agentrooms import __version__
from agentrooms.errors import AgentroomsError, NotFound
from agentrooms.metrics import count_mcp_error
from agentrooms.rooms import keys
from agentrooms.server.auth import SCOPES, AuthConfig, Principal
from agentrooms.server.limits import HttpLimits
from agentrooms.server.mcp.arguments import check_call, strict_tool
from agentrooms.server.mcp.hints import Hint, error_result, validation_hint
from agentrooms.server.mcp.paths_tools import PathTools
from agentrooms.server.mcp.push import EVENTS_TEMPLATE, LegacySubscriptions, RoomEventsListener
from agentrooms.server.mcp.tools import CHANGES, DESTRUCTIVE, IDEMPOTENT, READ_ONLY, RoomTools
from agentrooms.store.base import Store

__all__ = ["INSTRUCTIONS", "AgentroomsMCP", "build_mcp"]

INSTRUCTIONS = """agentrooms: shared state for a team of agents, organised in rooms.
Loop: join_room -> claim_task with wait (seconds) -> do the work (renew_lease before
the lease expires) -> complete_task (or fail_task) -> claim_task again, until it answers
finished=true; read_new_events (with wait) to see what others did (each event is
returned once). list_rooms, read_plan, list_documents and list_locks show what exists.
Documents: read_document gives value + version; write it
back with write_document and that version; on version_conflict re-read and re-apply.
Errors start with their type and say what to do next. Pass request_id on a call you may
repeat so it is applied once. Hosts can listen to room://{room}/events to be told when
new events arrive."""


class AgentroomsMCP(MCPServer[Any]):
    """The agentrooms MCP server over one store.

    ``principal`` fixes the caller (stdio); without it every call's caller comes from its
    HTTP request, admitted by :class:`agentrooms.server.mcp.http.McpHttp` with ``auth``.
    """

    def __init__(
        self,
        store: Store,
        *,
        principal: Principal | None,
        auth: AuthConfig | None = None,
        limits: HttpLimits | None = None,
    ) -> None:
        self.limits = limits or HttpLimits(rate=None)
        self.tools = RoomTools(store, principal=principal, limits=self.limits)
        super().__init__(
            "agentrooms",
            version=__version__,
            instructions=INSTRUCTIONS,
            log_level="WARNING",
            tools=self._strict_tools(),
        )
        self.store = store
        self.auth = auth
        self.listener = RoomEventsListener(self.tools)
        self.resource(
            EVENTS_TEMPLATE,
            name="room-events",
            description="Where you stand in a room's event log: {cursor, head, unread}. "
            "Listen to it (subscriptions/listen) to be told when events arrive; read them "
            "with read_new_events.",
            mime_type="application/json",
        )(self._events_resource)
        # subscriptions/listen: our handler watches the store instead of an in-process bus
        self._lowlevel_server.add_request_handler(
            "subscriptions/listen", SubscriptionsListenRequestParams, self.listener
        )

    def _strict_tools(self) -> list[Tool]:
        """The tools, each with strict arguments (:mod:`.arguments`)."""
        t, p = self.tools, PathTools(self.tools)
        table: list[tuple[Callable[..., Any], ToolAnnotations]] = [
            (t.list_rooms, READ_ONLY),
            (t.join_room, IDEMPOTENT),
            (t.heartbeat, IDEMPOTENT),
            (t.who_is_online, READ_ONLY),
            (t.read_plan, READ_ONLY),
            (t.add_tasks, CHANGES),
            (t.claim_task, CHANGES),
            (t.renew_lease, IDEMPOTENT),
            (t.complete_task, CHANGES),
            (t.fail_task, CHANGES),
            (t.cancel_task, DESTRUCTIVE),
            (t.read_new_events, CHANGES),
            (t.ack_events, IDEMPOTENT),
            (t.post_event, CHANGES),
            (t.list_documents, READ_ONLY),
            (t.read_document, READ_ONLY),
            (t.write_document, CHANGES),
            (t.delete_document, DESTRUCTIVE),
            (t.list_locks, READ_ONLY),
            (t.acquire_lock, CHANGES),
            (t.extend_lock, IDEMPOTENT),
            (t.release_lock, IDEMPOTENT),
            (p.reserve_paths, CHANGES),
            (p.release_paths, IDEMPOTENT),
            (p.check_paths, READ_ONLY),
        ]
        return [strict_tool(fn, hints, self.limits) for fn, hints in table]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """As the SDK's, but arguments over a size limit (:func:`.arguments.check_call`) or
        that fail validation are a typed error naming each bad argument, and an unknown
        tool lists the known ones."""
        tool = self._tool_manager.get_tool(name)
        if tool is None:
            known = ", ".join(t.name for t in self._tool_manager.list_tools())
            hint = Hint("bad_request", f"there is no tool {name!r}", f"call one of: {known}")
        else:
            refused = check_call(name, arguments, self.limits)
            if refused is None:
                try:
                    return await super().call_tool(name, arguments, context)
                except ToolError as exc:
                    if not isinstance(exc.__cause__, ValidationError):
                        raise
                    names = list(tool.parameters.get("properties", {}))
                    refused = validation_hint(name, exc.__cause__, names)
            hint = refused
        count_mcp_error(hint.type)
        return error_result(hint)

    async def run_stdio_async(self) -> None:
        """Serve stdin/stdout; clients of the handshake revisions may also
        ``resources/subscribe`` to ``room://{room}/events`` here (the watchers live in
        this call's task group, as long as the connection)."""
        async with anyio.create_task_group() as group:
            legacy = LegacySubscriptions(self.listener, group)
            low = self._lowlevel_server
            low.add_request_handler("resources/subscribe", SubscribeRequestParams, legacy.subscribe)
            low.add_request_handler(
                "resources/unsubscribe", UnsubscribeRequestParams, legacy.unsubscribe
            )
            try:
                await super().run_stdio_async()
            finally:
                group.cancel_scope.cancel()

    async def _events_resource(self, room: str, ctx: Context[Any, Any]) -> str:
        try:
            principal = self.tools.principal(ctx)
            handle = self.tools.enter(principal, room, "events:read")
            cursor = await handle.events.cursor(principal.agent)
            head = await self.store.last_seq(handle.name)
        except NotFound as exc:
            raise ResourceNotFoundError(str(exc)) from exc
        except AgentroomsError as exc:
            raise ResourceError(f"{exc.code}: {exc}") from exc
        body = {"cursor": cursor, "head": head, "unread": max(0, head - cursor)}
        return json.dumps(body, separators=(",", ":"))


def build_mcp(
    store: Store,
    *,
    agent: str | None,
    auth: AuthConfig | None = None,
    limits: HttpLimits | None = None,
    rooms: list[str] | None = None,
) -> AgentroomsMCP:
    """The MCP server over ``store`` (which the caller opens and closes).

    With ``agent`` (stdio) every call acts as that agent, with every scope, in ``rooms``
    (all rooms when ``None``). Without it (HTTP) every call acts as its request's bearer
    token says, checked by :mod:`agentrooms.server.auth` with ``auth``; serve it with
    :class:`agentrooms.server.mcp.http.McpHttp`.
    """
    principal = None
    if agent is not None:
        keys.check_name(agent, "agent")
        allowed = None if rooms is None else frozenset(keys.check_name(r, "room") for r in rooms)
        principal = Principal(agent, allowed, SCOPES, None)
    elif auth is None:
        raise ValueError("give the agent (stdio) or the auth config (HTTP)")
    return AgentroomsMCP(store, principal=principal, auth=auth, limits=limits)
