"""Helpers for the MCP tests: servers (a stdio subprocess, an in-process uvicorn on a
free loopback port) and MCP clients of the official SDK, plus small result readers."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import httpx2
import uvicorn
from mcp import Client
from mcp.client.session import MessageHandlerFnT
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent
from starlette.types import ASGIApp

from agentrooms.rooms import Rooms
from agentrooms.server import AuthConfig, HttpLimits, mint
from agentrooms.server.auth import ADMIN, SCOPES
from agentrooms.server.mcp import build_mcp, create_mcp_app
from agentrooms.store import Store
from tests.conftest import Backend

START_TIMEOUT = 20.0


@asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a port the OS picks, bound before the
    server starts); yields the base URL and stops the server after."""
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(START_TIMEOUT):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@asynccontextmanager
async def http_server(
    store: Store,
    *,
    auth: AuthConfig | None = None,
    limits: HttpLimits | None = None,
    json_response: bool = False,
) -> AsyncIterator[str]:
    """The standalone MCP app over ``store``, served; yields its endpoint URL."""
    app = create_mcp_app(
        store,
        auth=auth or AuthConfig(),
        limits=limits or HttpLimits(rate=None),
        json_response=json_response,
    )
    async with serving(app) as base:
        yield f"{base}/mcp"


@asynccontextmanager
async def http_client(
    url: str, headers: Mapping[str, str] | None = None, *, mode: str = "auto"
) -> AsyncIterator[Client]:
    """An SDK client over streamable HTTP, sending ``headers`` (e.g. the bearer token)."""
    timeout = httpx2.Timeout(30.0, read=60.0)
    async with (
        httpx2.AsyncClient(headers=dict(headers or {}), timeout=timeout) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


@asynccontextmanager
async def stdio_session(
    store_url: str,
    agent: str,
    *rest: str,
    mode: str = "auto",
    message_handler: MessageHandlerFnT | None = None,
) -> AsyncIterator[Client]:
    """An SDK client over stdio to ``python -m agentrooms.server.mcp stdio`` (a
    subprocess the client starts and stops)."""
    args = ["-m", "agentrooms.server.mcp", "stdio", "--store", store_url, "--agent", agent]
    params = StdioServerParameters(command=sys.executable, args=[*args, *rest])
    async with Client(stdio_client(params), mode=mode, message_handler=message_handler) as client:
        yield client


# Connects one agent (name, role) to the server under test as an SDK client
Connect = Callable[[str, str | None], AbstractAsyncContextManager[Client]]


@asynccontextmanager
async def over_http(store: Store, room: str, scopes: Sequence[str]) -> AsyncIterator[Connect]:
    """Agents over streamable HTTP to one served MCP app, each with its own bearer token
    for ``room`` with ``scopes`` (and its role)."""
    async with http_server(store) as url:

        @asynccontextmanager
        async def connect(agent: str, role: str | None) -> AsyncIterator[Client]:
            minted = await mint(store, agent, rooms=[room], scopes=list(scopes), role=role)
            async with http_client(url, bearer(minted.token)) as client:
                yield client

        yield connect


@asynccontextmanager
async def over_stdio(backend: Backend, room: str) -> AsyncIterator[tuple[Connect, Store]]:
    """Agents over stdio, one server subprocess each (every scope, in ``room`` only), on
    ``backend``; also a store handle of the test's own. ``room`` is created first."""
    store = await backend.open()

    @asynccontextmanager
    async def connect(agent: str, role: str | None) -> AsyncIterator[Client]:
        extra = ["--rooms", room, *([] if role is None else ["--role", role])]
        async with stdio_session(backend.url, agent, *extra) as client:
            yield client

    try:
        await Rooms(store).create(room)
        yield connect, store
    finally:
        await store.close()


@asynccontextmanager
async def in_process(store: Store, room: str) -> AsyncIterator[Connect]:
    """Agents through the SDK's in-process client (every scope, in ``room`` only)."""

    @asynccontextmanager
    async def connect(agent: str, role: str | None) -> AsyncIterator[Client]:
        async with Client(build_mcp(store, agent=agent, rooms=[room], role=role)) as client:
            yield client

    yield connect


@asynccontextmanager
async def agents(connect: Connect, **roles: str | None) -> AsyncIterator[dict[str, Client]]:
    """One connected client per agent named (``name=role``), closed together."""
    async with AsyncExitStack() as stack:
        yield {
            name: await stack.enter_async_context(connect(name, role))
            for name, role in roles.items()
        }


# What the MCP tests' agents over HTTP may do: every room scope but admin and the
# room-wide ones (create, archive, operate)
TEAM_SCOPES = sorted(SCOPES - {ADMIN, "rooms:write", "ops:read"})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def text_of(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def ok(result: CallToolResult) -> dict[str, Any]:
    """The body of a successful call (text and structured content agree)."""
    assert not result.is_error, text_of(result)
    body = json.loads(text_of(result))
    assert body == result.structured_content
    assert isinstance(body, dict)
    return body


def err(result: CallToolResult, kind: str) -> dict[str, Any]:
    """The error of a failed call, checking its text starts with ``kind`` and the
    structured envelope names the same type."""
    assert result.is_error, text_of(result)
    assert text_of(result).startswith(f"{kind}: "), text_of(result)
    assert result.structured_content is not None
    error: dict[str, Any] = result.structured_content["error"]
    assert error["type"] == kind
    assert text_of(result) == f"{kind}: {error['message']}"
    return error


async def call(client: Client, tool: str, **arguments: Any) -> CallToolResult:
    return await client.call_tool(tool, arguments)
