"""Push: a ``notifications/resources/updated`` for ``room://{room}/events`` whenever the
room's log grows, on an MCP ``subscriptions/listen`` stream (protocol 2026-07-28).

The stream is driven by the *store*, not by this process: each subscribed room is
watched with :meth:`Store.watch` (Redis blocking read, PostgreSQL LISTEN/NOTIFY, SQLite's
in-process wake-up plus its slow poll), so an event posted by any agent, through any
server process or the library directly, reaches every listener. The notification only
says "there is something new"; the agent then calls ``read_new_events``, which returns
each event once through its own cursor. Updates to a room are coalesced while one is
waiting to be sent. A listener whose cursor is already behind the log is told at once.

The handler serves any transport that carries a request's response stream: stdio, and
streamable HTTP in SSE mode. Nothing about a stream is kept outside the request that
holds it open, so stateless HTTP serves it from whichever instance took the request; in
JSON-response mode there is no push and the agent polls ``read_new_events``.

Clients of the handshake revisions (2025-11-25 and before) have no
``subscriptions/listen``; over stdio they get the same notifications through
``resources/subscribe`` (:class:`LegacySubscriptions`), whose watchers live in the stdio
server's task group. Over stateless HTTP such a client polls ``read_new_events``.

A subscription is honoured only for rooms the caller may read events of (a room it may
not enter is treated exactly like an absent one: not honoured, no error).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ResourceUpdated,
    event_to_notification,
)
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    EmptyResult,
    SubscribeRequestParams,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
    UnsubscribeRequestParams,
)

from agentrooms.errors import AgentroomsError, StoreUnavailable
from agentrooms.server.auth import Principal
from agentrooms.server.limits import StreamSlots
from agentrooms.server.mcp.tools import RoomTools
from agentrooms.store.base import Store

__all__ = [
    "EVENTS_TEMPLATE",
    "LegacySubscriptions",
    "RoomEventsListener",
    "events_uri",
    "room_of",
    "updates",
]

log = logging.getLogger("agentrooms.server.mcp")

EVENTS_TEMPLATE = "room://{room}/events"
_EVENTS_URI = re.compile(r"room://([A-Za-z0-9][A-Za-z0-9._:-]{0,127})/events")
WATCH_SECONDS = 30.0  # one Store.watch call; the loop simply watches again
RETRY_SECONDS = 1.0  # after a store failure


def events_uri(room: str) -> str:
    return f"room://{room}/events"


def room_of(uri: str) -> str | None:
    """The room of a ``room://{room}/events`` URI, else ``None``."""
    match = _EVENTS_URI.fullmatch(uri)
    return None if match is None else match.group(1)


class RoomEventsListener:
    """The ``subscriptions/listen`` handler (one call = one stream). A process holds at
    most ``max_streams`` streams, and one agent at most the tools' limit
    ``max_streams_per_agent``; a listen past either is refused with a JSON-RPC error."""

    def __init__(self, tools: RoomTools, *, max_streams: int = 1024, max_rooms: int = 64) -> None:
        self.tools = tools
        self.max_streams = max_streams
        self.max_rooms = max_rooms
        self.streams = 0
        self.slots = StreamSlots(tools.limits.max_streams_per_agent)

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        if self.streams >= self.max_streams:
            raise MCPError(INTERNAL_ERROR, "subscription limit reached")
        principal = self.tools.principal_of_request(ctx.request)
        if not self.slots.take(principal.agent):
            raise MCPError(
                INVALID_REQUEST,
                f"agent {principal.agent!r} holds {self.slots.cap} listen streams, the most "
                "it may; close one first",
            )
        try:
            return await self._listen(ctx, params, subscription_id, principal)
        finally:
            self.slots.give(principal.agent)

    async def _listen(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: SubscriptionsListenRequestParams,
        subscription_id: Any,
        principal: Principal,
    ) -> SubscriptionsListenResult:
        requested = params.notifications
        rooms: dict[str, tuple[str, int]] = {}  # uri -> (room, the caller's cursor)
        for uri in (requested.resource_subscriptions or [])[: self.max_rooms]:
            room = room_of(uri)
            if room is not None and uri not in rooms:
                cursor = await self.cursor(principal, room)
                if cursor is not None:
                    rooms[uri] = (room, cursor)
        honored = SubscriptionFilter(
            tools_list_changed=True if requested.tools_list_changed else None,
            prompts_list_changed=True if requested.prompts_list_changed else None,
            resources_list_changed=True if requested.resources_list_changed else None,
            resource_subscriptions=list(rooms) or None,
        )
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        # one slot per room: an update waiting to be sent absorbs the ones after it
        send, receive = anyio.create_memory_object_stream[str](max(1, len(rooms)))
        pending: set[str] = set()

        def deliver(uri: str) -> None:
            if uri not in pending:
                pending.add(uri)
                send.send_nowait(uri)

        self.streams += 1
        try:
            await ctx.session.send_notification(
                SubscriptionsAcknowledgedNotification(
                    params=SubscriptionsAcknowledgedNotificationParams(
                        notifications=honored, _meta=meta
                    )
                ),
                related_request_id=subscription_id,
            )
            async with anyio.create_task_group() as tg, send, receive:
                for uri, (room, cursor) in rooms.items():
                    tg.start_soon(self._watch, room, uri, cursor, deliver)
                async for uri in receive:
                    pending.discard(uri)
                    notification = event_to_notification(ResourceUpdated(uri=uri), meta)
                    await ctx.session.send_notification(
                        notification, related_request_id=subscription_id
                    )
        finally:
            self.streams -= 1
        return SubscriptionsListenResult(_meta=meta)

    async def cursor(self, principal: Principal, room: str) -> int | None:
        """The caller's cursor in ``room`` if it may read its events, else ``None``."""
        try:
            handle = self.tools.enter(principal, room, "events:read")
            return await handle.events.cursor(principal.agent)
        except AgentroomsError:
            return None

    async def _watch(
        self, room: str, uri: str, cursor: int, deliver: Callable[[str], None]
    ) -> None:
        async for _ in updates(self.tools.store, room, cursor):
            deliver(uri)


async def updates(store: Store, room: str, cursor: int) -> AsyncIterator[int]:
    """Yield the newest sequence number each time the room's log grows past what was
    last seen, starting from ``cursor`` (so events already waiting are announced at once).
    Woken by :meth:`Store.watch`; a store failure is retried after a pause."""
    seen, first = cursor, True
    while True:
        try:
            if first:
                head = await store.last_seq(room)
            else:
                head = await store.watch(room, seen, WATCH_SECONDS)
        except StoreUnavailable:
            log.warning("watching room %r failed; retrying", room, exc_info=True)
            await anyio.sleep(RETRY_SECONDS)
            continue
        first = False
        if head > seen:
            seen = head
            yield head


class LegacySubscriptions:
    """``resources/subscribe`` / ``resources/unsubscribe`` for clients of the handshake
    revisions (2025-11-25 and before), on a connection that outlives its requests
    (stdio): each subscription is a watcher in the server's task group that sends
    ``notifications/resources/updated`` on the connection's own channel."""

    def __init__(self, listener: RoomEventsListener, group: TaskGroup) -> None:
        self.listener = listener
        self.group = group
        self.watchers: dict[str, anyio.CancelScope] = {}

    async def subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        uri = params.uri
        room = room_of(uri)
        principal = self.listener.tools.principal_of_request(ctx.request)
        cursor = None if room is None else await self.listener.cursor(principal, room)
        if room is None or cursor is None:
            raise MCPError(INVALID_PARAMS, f"no such resource: {uri}", {"uri": uri})
        if uri not in self.watchers:
            scope = self.watchers[uri] = anyio.CancelScope()
            self.group.start_soon(self._run, scope, ctx.session, room, uri, cursor)
        return EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        scope = self.watchers.pop(params.uri, None)
        if scope is not None:
            scope.cancel()
        return EmptyResult()

    async def _run(
        self, scope: anyio.CancelScope, session: ServerSession, room: str, uri: str, cursor: int
    ) -> None:
        with scope:
            try:
                async for _ in updates(self.listener.tools.store, room, cursor):
                    await session.send_resource_updated(uri)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the connection is gone
            finally:
                if self.watchers.get(uri) is scope:
                    del self.watchers[uri]
