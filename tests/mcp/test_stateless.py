"""Stateless streamable HTTP: two server instances, each with its own store handle on
one store, serve one logical agent loop whose calls alternate between them; push comes
from the other instance than most writes."""

from __future__ import annotations

import httpx2
import pytest

from agentrooms.rooms import Rooms
from agentrooms.server import mint
from tests.conftest import Backend
from tests.mcp.scenario import Alternating, agent_loop, use
from tests.mcp.support import TEAM_SCOPES, bearer, http_client, http_server


async def test_calls_alternate_between_two_instances(shared_backend: Backend, room: str) -> None:
    store_a, store_b = await shared_backend.open(), await shared_backend.open()
    try:
        tokens = {
            name: bearer(
                (await mint(store_a, name, rooms=[room], scopes=TEAM_SCOPES, role="team")).token
            )
            for name in ("alice", "bob")
        }
        async with (
            http_server(store_a) as url_a,
            http_server(store_b) as url_b,
            http_client(url_a, tokens["alice"]) as alice_a,
            http_client(url_b, tokens["alice"]) as alice_b,
            http_client(url_a, tokens["bob"]) as bob_a,
            http_client(url_b, tokens["bob"]) as bob_b,
        ):
            alice, bob = Alternating(alice_a, alice_b), Alternating(bob_b, bob_a)
            await agent_loop(alice, bob, store_a, room)
            assert set(alice.served) == set(bob.served) == {0, 1}
    finally:
        await store_a.close()
        await store_b.close()


@pytest.mark.parametrize("json_response", [False, True])
async def test_handshake_era_clients_need_no_session(
    sqlite_backend: Backend, room: str, json_response: bool
) -> None:
    """A 2025-11-25 client (initialize handshake) alternating between an SSE instance
    and one answering plain JSON: no session id is issued, and the cursor lives in the
    store, so the second instance returns only what the first did not."""
    store_a, store_b = await sqlite_backend.open(), await sqlite_backend.open()
    try:
        await Rooms(store_a).create(room)
        token = bearer((await mint(store_a, "carol", rooms=[room], scopes=["admin"])).token)
        async with (
            http_server(store_a) as url_a,
            http_server(store_b, json_response=json_response) as url_b,
            http_client(url_a, token, mode="legacy") as via_a,
            http_client(url_b, token, mode="legacy") as via_b,
        ):
            assert via_a.protocol_version == via_b.protocol_version == "2025-11-25"
            carol = Alternating(via_a, via_b)
            await use(carol, "join_room", room=room)  # a
            await use(carol, "add_tasks", room=room, tasks=[{"id": "t1"}, {"id": "t2"}])  # b
            seen = await use(carol, "read_new_events", room=room)  # a
            posted = await use(carol, "post_event", room=room, type="note", data="x")  # b
            news = await use(carol, "read_new_events", room=room)  # a
            note = {"seq": posted["seq"], "type": "note", "data": "x", "author": "carol"}
            assert news["events"] == [note]
            assert news["cursor"] == posted["seq"] > seen["cursor"]
            lease = await use(carol, "claim_task", room=room)  # b
            done = await use(  # a
                carol, "complete_task", room=room, task_id=lease["task"]["id"], fence=lease["fence"]
            )
            assert done["status"] == "done"
            async with httpx2.AsyncClient() as raw:
                response = await raw.post(
                    url_b,
                    json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                    headers={
                        **token,
                        "Accept": "application/json, text/event-stream",
                        "MCP-Protocol-Version": "2025-11-25",
                    },
                )
            assert response.status_code == 200
            assert "mcp-session-id" not in response.headers
    finally:
        await store_a.close()
        await store_b.close()
