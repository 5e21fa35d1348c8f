"""The full agent loop through the SDK's own MCP clients, over stdio (one server
subprocess per agent) and over streamable HTTP (one uvicorn server, a bearer token per
agent)."""

from __future__ import annotations

from agentrooms.server import AuthConfig, mint
from tests.conftest import Backend
from tests.mcp.scenario import agent_loop
from tests.mcp.support import TEAM_SCOPES, bearer, http_client, http_server, stdio_session


async def test_agent_loop_over_stdio(sqlite_backend: Backend, room: str) -> None:
    store = await sqlite_backend.open()
    try:
        async with (
            stdio_session(sqlite_backend.url, "alice") as alice,
            stdio_session(sqlite_backend.url, "bob") as bob,
        ):
            await agent_loop(alice, bob, store, room)
    finally:
        await store.close()


async def test_agent_loop_over_http(shared_backend: Backend, room: str) -> None:
    store = await shared_backend.open()
    try:
        tokens = {
            name: (await mint(store, name, rooms=[room], scopes=TEAM_SCOPES, role="team")).token
            for name in ("alice", "bob")
        }
        async with (
            http_server(store, auth=AuthConfig()) as url,
            http_client(url, bearer(tokens["alice"])) as alice,
            http_client(url, bearer(tokens["bob"])) as bob,
        ):
            await agent_loop(alice, bob, store, room)
    finally:
        await store.close()
