"""Who calls over HTTP: the bearer token, checked by agentrooms.server.auth, with the
HTTP API's rules (rooms outside the token answer as absent, scopes, partitions)."""

from __future__ import annotations

from typing import Any

import httpx2

from agentrooms.rooms import Rooms
from agentrooms.server import AuthConfig, HttpLimits, create_app, mint
from agentrooms.server.mcp import McpHttp, events_uri, mount_mcp
from tests.conftest import Backend
from tests.mcp.support import bearer, call, err, http_client, http_server, ok, serving

LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
ACCEPT = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}


async def raw_post(url: str, headers: dict[str, str], body: Any = LIST) -> httpx2.Response:
    async with httpx2.AsyncClient() as client:
        return await client.post(url, json=body, headers={**ACCEPT, **headers})


async def test_requests_without_a_valid_token_are_refused(sqlite_backend: Backend) -> None:
    store = await sqlite_backend.open()
    try:
        token = (await mint(store, "alice", rooms="*", scopes=["admin"])).token
        async with http_server(store) as url:
            for headers, query in [
                ({}, ""),
                ({"Authorization": "Bearer ar_0123456789abcdef_" + "0" * 64}, ""),
                ({"Authorization": "Basic abc"}, ""),
                (bearer(token), f"?token={token}"),
            ]:
                response = await raw_post(url + query, headers)
                assert response.status_code == 401, response.text
                assert response.json()["error"]["type"] == "unauthorized"
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
            good = await raw_post(url, bearer(token))
            assert good.status_code == 200, good.text
    finally:
        await store.close()


async def test_the_token_decides_agent_rooms_scopes_and_partition(
    sqlite_backend: Backend, room: str
) -> None:
    store = await sqlite_backend.open()
    try:
        rooms = Rooms(store)
        await rooms.create(room)
        await rooms.create(f"{room}-secret")
        reader = (
            await mint(
                store,
                "rita",
                rooms=[room],
                scopes=["events:read", "docs:read", "docs:write", "presence:write"],
                role="notes",
            )
        ).token
        async with http_server(store) as url, http_client(url, bearer(reader)) as rita:
            joined = ok(await call(rita, "join_room", room=room))
            assert joined["you"] == "rita" and "ready" not in joined and "online" not in joined
            hidden = err(await call(rita, "read_new_events", room=f"{room}-secret"), "not_found")
            absent = err(await call(rita, "read_new_events", room=f"{room}-none"), "not_found")
            assert hidden["message"] == absent["message"].replace("-none", "-secret")
            forbidden = err(await call(rita, "post_event", room=room, type="x"), "forbidden")
            assert "'events:write'" in forbidden["message"]
            ok(await call(rita, "write_document", room=room, name="notes/a", value=1, version=0))
            other = await call(rita, "write_document", room=room, name="plan/a", value=1, version=0)
            assert "'notes'" in err(other, "forbidden")["message"]
            shared = await call(rita, "write_document", room=room, name="a", value=1, version=0)
            err(shared, "forbidden")
            uris = [events_uri(room), events_uri(f"{room}-secret"), events_uri(f"{room}-none")]
            async with rita.listen(resource_subscriptions=uris) as sub:
                assert sub.honored is not None
                assert sub.honored.resource_subscriptions == [events_uri(room)]
    finally:
        await store.close()


async def test_dev_mode_and_rate_limit(sqlite_backend: Backend, room: str) -> None:
    store = await sqlite_backend.open()
    try:
        await Rooms(store).create(room)
        limits = HttpLimits(rate=0.5, burst=2)
        async with (
            http_server(store, auth=AuthConfig(dev=True), limits=limits) as url,
            http_client(url, {"X-Agent": "devon"}) as devon,
        ):
            assert ok(await call(devon, "join_room", room=room))["you"] == "devon"
            ok(await call(devon, "who_is_online", room=room))
            limited = err(await call(devon, "who_is_online", room=room), "rate_limited")
            assert limited["details"]["retry_after"] > 0
    finally:
        await store.close()


async def test_mounted_next_to_the_http_api(sqlite_backend: Backend, room: str) -> None:
    """``mount_mcp`` serves MCP at /mcp of the HTTP API's app: one token, both surfaces."""
    store = await sqlite_backend.open()
    try:
        await Rooms(store).create(room)
        token = bearer((await mint(store, "alice", rooms=[room], scopes=["admin"])).token)
        api = create_app(store, auth=AuthConfig(), limits=HttpLimits(rate=None))
        mount_mcp(api, McpHttp(store, auth=AuthConfig()))
        async with serving(api) as base, http_client(f"{base}/mcp", token) as alice:
            posted = ok(await call(alice, "post_event", room=room, type="note", data="hi"))
            async with httpx2.AsyncClient() as rest:
                response = await rest.get(f"{base}/v1/rooms/{room}/events", headers=token)
            assert response.status_code == 200
            assert response.json()["events"][-1]["seq"] == posted["seq"]
    finally:
        await store.close()
