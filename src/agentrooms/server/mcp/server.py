"""The MCP server object: the tools, the ``room://{room}/events`` resource and its push
stream, on the official SDK's :class:`~mcp.server.mcpserver.MCPServer`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolResult,
    InputRequiredResult,
    ListToolsResult,
    PaginatedRequestParams,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    ToolAnnotations,
    UnsubscribeRequestParams,
)
from pydantic import ValidationError

from agentrooms import __version__
from agentrooms.errors import AgentroomsError, BadRequest, NotFound
from agentrooms.metrics import count_mcp_error
from agentrooms.rooms import keys
from agentrooms.server.auth import SCOPES, AuthConfig, Principal
from agentrooms.server.limits import HttpLimits
from agentrooms.server.mcp.arguments import check_call, strict_tool
from agentrooms.server.mcp.hints import Hint, error_result, hint_for, validation_hint
from agentrooms.server.mcp.paths_tools import PathTools
from agentrooms.server.mcp.push import EVENTS_TEMPLATE, LegacySubscriptions, RoomEventsListener
from agentrooms.server.mcp.tools import CHANGES, DESTRUCTIVE, IDEMPOTENT, READ_ONLY, RoomTools
from agentrooms.store.base import Store

__all__ = ["INSTRUCTIONS", "PROFILES", "SCOPE_OF", "AgentroomsMCP", "build_mcp"]

INSTRUCTIONS = """agentrooms: shared state for a team of agents, organised in rooms.
Loop: join_room -> claim_task with wait (seconds) -> do the work (renew_lease before
the lease expires) -> complete_task (or fail_task) -> claim_task again, until it answers
finished=true; read_new_events (with wait) to see what others did (each event is
returned once). list_rooms, read_plan, list_documents and list_locks show what exists.
Documents: read_document gives value + version; write it
back with write_document and that version; on version_conflict re-read and re-apply.
Errors start with their type and say what to do next. Pass request_id on a call you may
repeat so it is applied once. Lists come in pages: pass a result's next as after. A value
too large for one result is cut ({truncated: true}); its fetch says how to get it. Names
are letters, digits and . _ : - (a document: [partition/]name). Hosts can listen to
room://{room}/events to be told when new events arrive."""


# The scope each tool needs: tools/list shows a caller only the tools its token may call.
# A tool missing here is listed to every caller (its call still checks the scope).
SCOPE_OF: dict[str, str] = {
    "list_rooms": "rooms:read",
    "join_room": "presence:write",
    "heartbeat": "presence:write",
    "who_is_online": "rooms:read",
    "read_plan": "plan:read",
    "add_tasks": "plan:write",
    "claim_task": "lease:acquire",
    "renew_lease": "lease:acquire",
    "complete_task": "lease:acquire",
    "fail_task": "lease:acquire",
    "cancel_task": "plan:write",
    "read_new_events": "events:read",
    "read_event": "events:read",
    "ack_events": "events:read",
    "post_event": "events:write",
    "list_documents": "docs:read",
    "read_document": "docs:read",
    "write_document": "docs:write",
    "delete_document": "docs:write",
    "list_locks": "rooms:read",
    "acquire_lock": "locks:write",
    "extend_lock": "locks:write",
    "release_lock": "locks:write",
    "reserve_paths": "locks:write",
    "release_paths": "locks:write",
    "check_paths": "rooms:read",
}

# Profiles: the tool sets a server (stdio: --profile) or an HTTP endpoint URL
# (?profile=worker) offers; None is every tool.
PROFILES: dict[str, frozenset[str] | None] = {
    "full": None,
    "worker": frozenset(
        {
            "join_room",
            "heartbeat",
            "claim_task",
            "renew_lease",
            "complete_task",
            "fail_task",
            "read_new_events",
            "post_event",
        }
    ),
}


def check_profile(name: str) -> str:
    """``name`` if it is a known profile, else ``BadRequest`` naming the known ones."""
    if name not in PROFILES:
        raise BadRequest(f"unknown MCP profile {name!r}; known: {', '.join(PROFILES)}")
    return name


class AgentroomsMCP(MCPServer[Any]):
    """The agentrooms MCP server over one store.

    ``principal`` fixes the caller (stdio); without it every call's caller comes from its
    HTTP request, admitted by :class:`agentrooms.server.mcp.http.McpHttp` with ``auth``.
    ``profile`` (:data:`PROFILES`) is the tool set offered, which an HTTP request may
    choose with ``?profile=``. ``tools/list`` shows a caller only the profile's tools its
    token has the scope for (:data:`SCOPE_OF`); calling another is refused, naming why.
    """

    def __init__(
        self,
        store: Store,
        *,
        principal: Principal | None,
        auth: AuthConfig | None = None,
        limits: HttpLimits | None = None,
        profile: str = "full",
    ) -> None:
        self.profile = check_profile(profile)
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
            (t.read_event, READ_ONLY),
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

    def profile_of(self, request: Any) -> str:
        """The profile an HTTP request asks for (``?profile=``), else the server's."""
        query = getattr(request, "query_params", None)
        asked = None if query is None else query.get("profile")
        return self.profile if asked is None else check_profile(asked)

    def visible(self, principal: Principal, profile: str) -> list[Tool]:
        """The tools ``principal`` is shown under ``profile``."""
        chosen = PROFILES[profile]
        return [
            tool
            for tool in self._tool_manager.list_tools()
            if (chosen is None or tool.name in chosen)
            and (tool.name not in SCOPE_OF or principal.has(SCOPE_OF[tool.name]))
        ]

    async def _handle_list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        try:
            principal = self.tools.principal_of_request(ctx.request)
            profile = self.profile_of(ctx.request)
        except AgentroomsError as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"{exc.code}: {exc}") from exc
        shown = {t.name for t in self.visible(principal, profile)}
        return ListToolsResult(tools=[t for t in await self.list_tools() if t.name in shown])

    def hidden(self, name: str, context: Context[Any, Any] | None) -> Hint | None:
        """Why the caller may not call tool ``name`` (unknown, outside the profile or its
        token's scopes), else ``None``."""
        request = None if context is None else context.request_context.request
        try:
            principal = self.tools.principal_of_request(request)
            profile = self.profile_of(request)
        except AgentroomsError as exc:
            return hint_for(exc)
        known = ", ".join(t.name for t in self.visible(principal, profile)) or "none"
        if self._tool_manager.get_tool(name) is None:
            return Hint("bad_request", f"there is no tool {name!r}", f"call one of: {known}")
        chosen = PROFILES[profile]
        if chosen is not None and name not in chosen:
            return Hint(
                "bad_request",
                f"tool {name!r} is not in the {profile!r} profile this server offers",
                f"call one of: {known}; or connect with profile 'full'",
            )
        scope = SCOPE_OF.get(name)
        if scope is not None and not principal.has(scope):
            return Hint(
                "forbidden",
                f"this token lacks the {scope!r} scope that {name} needs",
                f"call one of: {known}; or ask whoever mints tokens for one with {scope!r}",
            )
        return None

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """As the SDK's, but arguments over a size limit (:func:`.arguments.check_call`) or
        that fail validation are a typed error naming each bad argument, and a tool the
        caller is not shown (unknown, outside the profile or its scopes) is refused with
        the tools it may call."""
        tool = self._tool_manager.get_tool(name)
        hidden = self.hidden(name, context)
        if tool is None or hidden is not None:
            hint = hidden or Hint("bad_request", f"there is no tool {name!r}", "see tools/list")
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
    profile: str = "full",
    role: str | None = None,
) -> AgentroomsMCP:
    """The MCP server over ``store`` (which the caller opens and closes).

    With ``agent`` (stdio) every call acts as that agent, with every scope and ``role``
    (what its inbox reads take as its role; its writable partition), in ``rooms`` (all
    rooms when ``None``). Without it (HTTP) every call acts as its request's bearer
    token says, checked by :mod:`agentrooms.server.auth` with ``auth``; serve it with
    :class:`agentrooms.server.mcp.http.McpHttp`. ``profile``: the tool set offered
    (:data:`PROFILES`).
    """
    principal = None
    if agent is not None:
        keys.check_name(agent, "agent")
        allowed = None if rooms is None else frozenset(keys.check_name(r, "room") for r in rooms)
        if role is not None:
            keys.check_name(role, "role")
        principal = Principal(agent, allowed, SCOPES, role)
    elif auth is None:
        raise ValueError("give the agent (stdio) or the auth config (HTTP)")
    return AgentroomsMCP(store, principal=principal, auth=auth, limits=limits, profile=profile)
