"""The tool list is read into every model's context: its size, as tokens counted as
characters / 4 of the ``tools/list`` result's JSON, stays within a budget; its
annotations are right; and a caller is shown only the tools its token's scopes and the
chosen profile let it call (in-process, over HTTP with minted tokens, over stdio)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import Tool

from agentrooms.rooms import Rooms
from agentrooms.server import AuthConfig, mint
from agentrooms.server.auth import Principal
from agentrooms.server.mcp import build_mcp
from agentrooms.server.mcp.server import PROFILES, SCOPE_OF, AgentroomsMCP
from agentrooms.store import Store
from tests.conftest import Backend
from tests.mcp.support import bearer, call, err, http_client, http_server, ok, stdio_session

TOKEN_BUDGET = 4_000  # #26 item 6: the whole list, new tools included

READ_SCOPES = frozenset({"rooms:read", "plan:read", "docs:read"})
READ_TOOLS = {
    "list_rooms",
    "who_is_online",
    "read_plan",
    "list_documents",
    "read_document",
    "list_locks",
    "check_paths",
}
DESTRUCTIVE = {"cancel_task", "delete_document"}
IDEMPOTENT = {"join_room", "heartbeat", "renew_lease", "ack_events", "extend_lock"}
IDEMPOTENT |= {"release_lock", "release_paths"}


def tokens(tools: list[Tool]) -> int:
    listed = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    return len(json.dumps(listed, separators=(",", ":"))) // 4


def as_principal(store: Store, scopes: frozenset[str], profile: str = "full") -> Client:
    principal = Principal("w", None, scopes, None)
    return Client(AgentroomsMCP(store, principal=principal, profile=profile))


async def test_the_tool_list_fits_its_token_budget(store: Store) -> None:
    async with Client(build_mcp(store, agent="a")) as client:
        tools = (await client.list_tools()).tools
    assert tokens(tools) <= TOKEN_BUDGET, tokens(tools)
    listed = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    for tool in listed:  # nothing a model need not read: no titles, no docstring indents
        assert "title" not in tool["inputSchema"] and "  " not in tool["description"]
        assert "title" not in tool["inputSchema"]["properties"].get("room", {}), tool["name"]
        assert "anyOf" not in json.dumps(tool["inputSchema"]), tool["name"]
        assert len(tool["description"]) <= 260, tool["name"]


async def test_annotations_say_what_each_tool_does(store: Store) -> None:
    async with Client(build_mcp(store, agent="a")) as client:
        tools = (await client.list_tools()).tools
    assert {t.name for t in tools} == set(SCOPE_OF)
    for tool in tools:
        hints = tool.annotations
        assert hints is not None and hints.open_world_hint is False, tool.name
        read_only = tool.name in READ_TOOLS | {"read_event"}
        assert bool(hints.read_only_hint) is read_only, tool.name
        assert bool(hints.destructive_hint) is (tool.name in DESTRUCTIVE), tool.name
        if not read_only:
            assert bool(hints.idempotent_hint) is (tool.name in IDEMPOTENT), tool.name


async def test_a_read_only_token_sees_only_read_tools(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with as_principal(store, READ_SCOPES) as client:
        tools = (await client.list_tools()).tools
        assert {t.name for t in tools} == READ_TOOLS
        assert all(t.annotations and t.annotations.read_only_hint for t in tools)
        refused = err(await call(client, "add_tasks", room=room, tasks=[{"id": "a"}]), "forbidden")
        assert "'plan:write'" in refused["message"] and "read_plan" in refused["message"]
        ok(await call(client, "read_plan", room=room))
    async with as_principal(store, frozenset({"admin"})) as client:
        assert {t.name for t in (await client.list_tools()).tools} == set(SCOPE_OF)


async def test_the_worker_profile_lists_the_work_loop_only(store: Store, room: str) -> None:
    worker = PROFILES["worker"]
    assert worker is not None
    async with Client(build_mcp(store, agent="w", profile="worker")) as client:
        tools = (await client.list_tools()).tools
        assert {t.name for t in tools} == worker
        assert tokens(tools) <= 1_400, tokens(tools)
        refused = err(await call(client, "read_plan", room=room), "bad_request")
        assert "'worker' profile" in refused["message"] and "claim_task" in refused["message"]
        unknown = err(await call(client, "no_such_tool", room=room), "bad_request")
        assert "join_room" in unknown["message"] and "read_plan" not in unknown["message"]
    with pytest.raises(Exception, match="unknown MCP profile"):
        build_mcp(store, agent="w", profile="nope")


async def names_over_http(url: str, token: dict[str, str]) -> set[str]:
    async with http_client(url, token) as client:
        return {t.name for t in (await client.list_tools()).tools}


async def test_http_lists_by_token_and_by_profile_in_the_url(sqlite_backend: Backend) -> None:
    store = await sqlite_backend.open()
    reader = bearer((await mint(store, "r", rooms="*", scopes=sorted(READ_SCOPES))).token)
    admin = bearer((await mint(store, "a", rooms="*", scopes=["admin"])).token)
    room, worker = "team", PROFILES["worker"]
    assert worker is not None
    await Rooms(store).create(room)
    async with http_server(store, auth=AuthConfig()) as url:
        assert await names_over_http(url, reader) == READ_TOOLS
        assert await names_over_http(url, admin) == set(SCOPE_OF)
        assert await names_over_http(f"{url}?profile=worker", admin) == set(worker)
        # a read-only token under the worker profile: only what both allow
        assert await names_over_http(f"{url}?profile=worker", reader) == set()
        async with http_client(f"{url}?profile=worker", admin) as client:
            refused = err(await call(client, "read_plan", room=room), "bad_request")
            assert "'worker' profile" in refused["message"]
            ok(await call(client, "join_room", room=room))
        async with http_client(url, reader) as client:
            refused = err(await call(client, "post_event", room=room, type="x"), "forbidden")
            assert "'events:write'" in refused["message"]
        async with http_client(f"{url}?profile=nope", admin) as client:
            with pytest.raises(MCPError, match="unknown MCP profile"):
                await client.list_tools()


async def test_stdio_takes_a_profile(sqlite_backend: Backend) -> None:
    async with stdio_session(sqlite_backend.url, "w", "--profile", "worker") as client:
        names: Any = {t.name for t in (await client.list_tools()).tools}
    assert names == PROFILES["worker"]


async def test_the_cli_takes_a_profile(sqlite_backend: Backend) -> None:
    """`agentrooms mcp --profile worker` serves the worker's tools; an unknown profile
    is refused before anything is served."""
    cli = [sys.executable, "-m", "agentrooms", "mcp", "--agent", "w", "--url", sqlite_backend.url]
    params = StdioServerParameters(command=cli[0], args=[*cli[1:], "--profile", "worker"])
    async with Client(stdio_client(params)) as client:
        names = frozenset(t.name for t in (await client.list_tools()).tools)
    assert names == PROFILES["worker"]
    proc = await asyncio.create_subprocess_exec(
        *cli,
        "--profile",
        "nope",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode != 0 and b"unknown MCP profile" in stderr, stderr
