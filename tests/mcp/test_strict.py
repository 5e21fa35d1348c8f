"""Strict tool arguments and one set of limits on every transport: stdio, the standalone
streamable HTTP app, and MCP mounted next to the HTTP API (``serve``). The same call
gets the same typed answer on each; what the HTTP transport refuses before MCP runs (a
body over its cap, a body that is not JSON) still reaches the client as JSON-RPC."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.server import AuthConfig, HttpLimits, create_app, mint
from agentrooms.server.mcp import McpHttp, build_mcp, mount_mcp
from agentrooms.store import Store
from tests.conftest import Backend
from tests.mcp.support import (
    bearer,
    call,
    err,
    http_client,
    http_server,
    ok,
    serving,
    stdio_session,
)

LIMITS = HttpLimits(rate=None)
CALL_LIMIT = LIMITS.max_body_bytes - LIMITS.max_body_bytes // 16


@asynccontextmanager
async def transports(backend: Backend, store: Store) -> AsyncIterator[dict[str, Client]]:
    """Agent ``alice`` over stdio, the standalone HTTP app and the HTTP API's /mcp."""
    token = bearer((await mint(store, "alice", rooms="*", scopes=["admin"])).token)
    api = create_app(store, auth=AuthConfig(), limits=LIMITS)
    mount_mcp(api, McpHttp(store, auth=AuthConfig(), limits=LIMITS))
    async with (
        stdio_session(backend.url, "alice") as stdio,
        http_server(store, limits=LIMITS) as url,
        http_client(url, token) as standalone,
        serving(api) as base,
        http_client(f"{base}/mcp", token) as mounted,
    ):
        yield {"stdio": stdio, "http": standalone, "mounted": mounted}


async def test_unknown_arguments_and_lax_values_are_refused(
    sqlite_backend: Backend, room: str
) -> None:
    store = await sqlite_backend.open()
    try:
        await Rooms(store).create(room)
        await Rooms(store).room(room).plan.add([TaskSpec("k1"), TaskSpec("k2")])
        async with transports(sqlite_backend, store) as clients:
            for where, client in clients.items():
                typo = err(await call(client, "claim_task", room=room, taskId="k2"), "bad_request")
                assert typo["details"]["errors"][0]["argument"] == "taskId", where
                assert "did you mean task_id?" in typo["message"], where
                nested = [{"id": "z", "dependencies": ["k1"]}]
                extra = err(await call(client, "add_tasks", room=room, tasks=nested), "bad_request")
                assert extra["details"]["errors"][0]["argument"] == "tasks.0.dependencies"
                lax: list[tuple[str, dict[str, Any]]] = [
                    ("read_new_events", {"limit": "1"}),
                    ("read_plan", {"details": "yes"}),
                    ("read_plan", {"details": "true"}),
                    ("read_plan", {"details": 1}),
                    ("read_plan", {"status": "null"}),
                    ("claim_task", {"ttl": "60"}),
                    ("add_tasks", {"tasks": '[{"id": "s"}]'}),
                    ("add_tasks", {"tasks": [{"id": "s", "max_attempts": "2"}]}),
                ]
                for tool, arguments in lax:
                    refused = await call(client, tool, room=room, **arguments)
                    err(refused, "bad_request")
                assert (
                    "not a string"
                    in err(
                        await call(client, "read_new_events", room=room, limit="1"), "bad_request"
                    )["message"]
                )
                # "null" names a task called null (there is none), it does not mean "any"
                none = await call(client, "claim_task", room=room, task_id="null")
                err(none, "not_found")
                # a string that holds JSON is a string, not the object it spells
                doc = f"text-{where}"
                text = '{"a": 1}'
                ok(await call(client, "write_document", room=room, name=doc, value=text, version=0))
                read = ok(await call(client, "read_document", room=room, name=doc))
                assert read["value"] == text, where
            plan = await Rooms(store).room(room).plan.tasks()
            assert [(t.id, t.status) for t in plan] == [("k1", "ready"), ("k2", "ready")]
    finally:
        await store.close()


async def test_limits_are_the_same_on_every_transport(sqlite_backend: Backend, room: str) -> None:
    store = await sqlite_backend.open()
    try:
        await Rooms(store).create(room)
        async with transports(sqlite_backend, store) as clients:
            answers: dict[str, list[dict[str, Any]]] = {}
            for where, client in clients.items():
                status = await call(client, "heartbeat", room=room, status="x" * 201)
                string = "y" * (LIMITS.max_string_bytes + 1)
                long = await call(client, "post_event", room=room, type="note", data=[string])
                # every string under the string limit, the call over the call limit
                parts = ["z" * 200_000] * (CALL_LIMIT // 200_000 + 1)
                big = await call(client, "write_document", room=room, name="d", value=parts)
                answers[where] = [
                    err(status, "bad_request"),
                    err(long, "bad_request"),
                    err(big, "payload_too_large"),
                ]
            assert answers["stdio"] == answers["http"] == answers["mounted"]
            status_error, string_error, call_error = answers["stdio"]
            assert "at most 200 characters" in status_error["message"]
            assert string_error["details"] == {"argument": "data"}
            assert f"over {LIMITS.max_string_bytes}" in string_error["message"]
            assert f"over the {CALL_LIMIT}-byte limit" in call_error["message"]
            assert call_error["details"]["limit"] == CALL_LIMIT
            # over the HTTP body cap: stdio answers the same tool error, HTTP (which stops
            # reading at its cap) a JSON-RPC error of the same type naming the same limit
            huge = ["w" * 200_000] * 10
            over = await call(clients["stdio"], "write_document", room=room, name="h", value=huge)
            assert err(over, "payload_too_large")["details"]["limit"] == CALL_LIMIT
            for where in ("http", "mounted"):
                with pytest.raises(MCPError) as refused:
                    await call(clients[where], "write_document", room=room, name="h", value=huge)
                message = refused.value.error.message
                assert message.startswith("payload_too_large: "), (where, message)
                assert f"{CALL_LIMIT} bytes" in message
                assert f"{LIMITS.max_body_bytes}-byte" in message
                assert refused.value.error.data["type"] == "payload_too_large"
            # nothing over a limit was written, and the transports still serve
            assert await Rooms(store).room(room).docs.list() == []
            for client in clients.values():
                ok(await call(client, "heartbeat", room=room))
    finally:
        await store.close()


def schemas(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (path, schema) of a property or array item under a JSON schema."""
    if not isinstance(node, dict):
        return
    for name, sub in node.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from schemas(sub, f"{path}.{name}")
    for key in ("items", "anyOf", "$defs"):
        value = node.get(key)
        subs = value.items() if isinstance(value, dict) and key == "$defs" else []
        if key == "items" and isinstance(value, dict):
            subs = [("[]", value)]
        if key == "anyOf" and isinstance(value, list):
            subs = [(str(i), v) for i, v in enumerate(value)]
        for name, sub in subs:
            if key != "$defs":
                yield f"{path}.{name}", sub
            yield from schemas(sub, f"{path}.{name}")


async def test_schemas_publish_every_limit(store: Store) -> None:
    async with Client(build_mcp(store, agent="alice", limits=LIMITS)) as client:
        tools = (await client.list_tools()).tools
    assert len(tools) == 26
    json_values = 0
    for tool in tools:
        schema = tool.input_schema
        assert schema["additionalProperties"] is False, tool.name
        for name, definition in schema.get("$defs", {}).items():
            if definition.get("type") == "object":
                assert definition["additionalProperties"] is False, (tool.name, name)
        for path, sub in schemas(schema):
            where = f"{tool.name}{path}"
            kind = sub.get("type")
            if kind == "string":
                assert "maxLength" in sub, where
            elif kind in ("integer", "number"):
                assert "minimum" in sub or "exclusiveMinimum" in sub, where
                # a counter's maximum, the largest JSON safe integer, goes unsaid
                assert "maximum" in sub or kind == "integer", where
            elif kind == "array":
                assert "maxItems" in sub, where
            elif "type" not in sub and "$ref" not in sub:  # a free JSON value
                json_values += 1
                assert f"call <= {CALL_LIMIT} B" in sub["description"], where
                assert f"strings <= {LIMITS.max_string_bytes} B" in sub["description"], where
    assert json_values == 6  # document value, event data, task payload, result, error, reason


async def test_a_malformed_body_gets_a_json_rpc_parse_error(sqlite_backend: Backend) -> None:
    store = await sqlite_backend.open()
    try:
        token = bearer((await mint(store, "alice", rooms="*", scopes=["admin"])).token)
        api = create_app(store, auth=AuthConfig(), limits=LIMITS)
        mount_mcp(api, McpHttp(store, auth=AuthConfig(), limits=LIMITS))
        broken = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"'
        async with (
            http_server(store, limits=LIMITS) as standalone,
            serving(api) as base,
            httpx2.AsyncClient() as http,
        ):
            for url in (standalone, f"{base}/mcp"):
                for version in ("2025-11-25", "2026-07-28"):
                    headers = {
                        **token,
                        "Accept": "application/json, text/event-stream",
                        "Content-Type": "application/json",
                        "MCP-Protocol-Version": version,
                    }
                    response = await http.post(url, content=broken, headers=headers)
                    assert response.headers["content-type"].startswith("application/json")
                    body = response.json()
                    assert body["jsonrpc"] == "2.0" and body["id"] is None, (url, body)
                    assert body["error"]["code"] == -32700, (url, version, body)
    finally:
        await store.close()


async def test_a_chunked_body_over_the_cap_gets_a_json_rpc_error(sqlite_backend: Backend) -> None:
    """Without a Content-Length the body is counted; what is over the cap is read to its
    end and dropped, then answered in JSON-RPC (not the API's envelope, not a reset)."""
    store = await sqlite_backend.open()
    try:
        token = bearer((await mint(store, "alice", rooms="*", scopes=["admin"])).token)
        api = create_app(store, auth=AuthConfig(), limits=LIMITS)
        mount_mcp(api, McpHttp(store, auth=AuthConfig(), limits=LIMITS))

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "x", '
            yield b'"arguments": {"value": "'
            for _ in range(3 * LIMITS.max_body_bytes // 65_536):
                yield b"v" * 65_536
            yield b'"}}}'

        headers = {
            **token,
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": "2025-11-25",
        }
        async with (
            http_server(store, limits=LIMITS) as standalone,
            serving(api) as base,
            httpx2.AsyncClient() as http,
        ):
            for url in (standalone, f"{base}/mcp"):
                response = await http.post(url, content=chunks(), headers=headers)
                assert response.status_code == 413, (url, response.text)
                body = response.json()
                assert body["jsonrpc"] == "2.0" and body["id"] is None, (url, body)
                assert body["error"]["code"] == -32600
                assert body["error"]["message"].startswith("payload_too_large: ")
                assert body["error"]["data"]["details"]["limit"] == CALL_LIMIT
    finally:
        await store.close()
