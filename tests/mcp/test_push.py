"""Push over stdio for clients of the handshake revisions: ``resources/subscribe`` to
``room://{room}/events`` brings ``notifications/resources/updated`` whenever the log
grows, whoever appended (here: another process, the test's own store handle). The
2026-07-28 ``subscriptions/listen`` stream is covered by the agent loop tests."""

from __future__ import annotations

import asyncio
import warnings

import pytest
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types import ResourceUpdatedNotification

from agentrooms.rooms import Rooms
from agentrooms.server.mcp import events_uri
from tests.conftest import Backend
from tests.mcp.scenario import use
from tests.mcp.support import stdio_session

QUIET = 0.5  # how long "no notification" is watched for


async def test_handshake_era_client_over_stdio_is_notified(
    sqlite_backend: Backend, room: str
) -> None:
    store = await sqlite_backend.open()
    updated: asyncio.Queue[str] = asyncio.Queue()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            updated.put_nowait(message.params.uri)

    try:
        events = (await Rooms(store).create(room)).events
        async with stdio_session(
            sqlite_backend.url, "alice", mode="legacy", message_handler=on_message
        ) as alice:
            assert alice.protocol_version == "2025-11-25"
            capabilities = alice.server_capabilities.resources
            assert capabilities is not None and capabilities.subscribe is True
            with warnings.catch_warnings():
                # resources/subscribe is deprecated by the SDK (removed in 2026-07-28);
                # this test covers the older revisions on purpose
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await alice.session.subscribe_resource(events_uri(room))
                with pytest.raises(MCPError, match="no such resource"):
                    await alice.session.subscribe_resource(events_uri(f"{room}-absent"))
                # unread events (the room's creation) are announced at once
                async with asyncio.timeout(10):
                    assert await updated.get() == events_uri(room)
                first = await use(alice, "read_new_events", room=room)
                seq = await events.post("deploy", {"by": "ci"})
                async with asyncio.timeout(10):
                    assert await updated.get() == events_uri(room)
                news = await use(alice, "read_new_events", room=room)
                assert news["events"] == [{"seq": seq, "type": "deploy", "data": {"by": "ci"}}]
                assert news["cursor"] > first["cursor"]
                await alice.session.unsubscribe_resource(events_uri(room))
                await events.post("deploy", {"by": "ci"})
                await asyncio.sleep(QUIET)
                assert updated.empty()
    finally:
        await store.close()
