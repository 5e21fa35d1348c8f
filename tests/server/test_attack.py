"""A bounded attack on a real ``agentrooms serve`` process, asserting the hardened answer
to each: oversized headers, slow headers and bodies, many streams per agent, a flood of
failed authentications, a token in the query string, DNS rebinding in dev mode, an
oversized upload, ``OPTIONS``, trailing slashes, and the OpenAPI document.

Each test prints its figures (``pytest -s`` shows them). Two servers are started for the
module (one with tokens, one ``--dev``) with one-second deadlines so the whole file runs
in seconds; every other limit is the server's default.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from agentrooms.rooms import Rooms
from agentrooms.server import mint
from agentrooms.server.mcp import events_uri
from agentrooms.server.protocol import LINGER_SECONDS
from agentrooms.store import open_store
from tests.helpers import free_port
from tests.mcp.support import http_client

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
STREAMS = 3  # --max-streams-per-agent
AUTH_FAILURES = 5  # --auth-failures
ROOM = "siege"
MB = 1024 * 1024


@dataclass
class Server:
    base: str
    port: int
    pid: int
    log: Path
    token: str = ""  # an admin token of agent "alice" (not in dev mode)
    spare: str = ""  # another token of "alice", sent in a query string (and so revoked)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS line")

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}


async def _prepare(url: str) -> tuple[str, str]:
    store = await open_store(url)
    try:
        await Rooms(store).create(ROOM)
        tokens = [(await mint(store, "alice", rooms="*", scopes=["admin"])).token for _ in "ab"]
        return tokens[0], tokens[1]
    finally:
        await store.close()


@dataclass
class _Process:
    proc: subprocess.Popen[bytes]
    server: Server


def _start(tmp: Path, *, dev: bool) -> _Process:
    port = free_port()
    url = f"sqlite:///{tmp / 'attack.db'}"
    token, spare = ("", "") if dev else asyncio.run(_prepare(url))
    log = tmp / "server.log"
    args = [sys.executable, "-m", "agentrooms", "serve", "--port", str(port), "--url", url]
    args += ["--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT)]
    args += ["--max-streams-per-agent", str(STREAMS), "--auth-failures", str(AUTH_FAILURES)]
    args += ["--dev"] if dev else []
    with log.open("w") as out:
        proc = subprocess.Popen(
            args,
            cwd=tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return _Process(proc, Server(f"http://127.0.0.1:{port}", port, proc.pid, log, token, spare))


def _wait_up(started: _Process) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{started.server.base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        alive = started.proc.poll() is None
        assert time.monotonic() < deadline and alive, started.server.log.read_text()
        time.sleep(0.1)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """One server with tokens and one in dev mode, started side by side."""
    started = [
        _start(tmp_path_factory.mktemp("tokens"), dev=False),
        _start(tmp_path_factory.mktemp("dev"), dev=True),
    ]
    try:
        for each in started:
            _wait_up(each)
        yield started[0].server, started[1].server
    finally:
        for each in started:
            each.proc.terminate()
        for each in started:
            each.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(servers: tuple[Server, Server]) -> Server:
    return servers[0]


@pytest.fixture(scope="module")
def dev_server(servers: tuple[Server, Server]) -> Server:
    return servers[1]


# -- raw connections -------------------------------------------------------------------


async def _status_of(reader: asyncio.StreamReader) -> int:
    line = await reader.readline()
    return int(line.split()[1]) if line else 0


async def _send_all(port: int, payload: bytes) -> int:
    """Send ``payload`` on a fresh connection, then read the status line (0: reset or
    closed without an answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await _status_of(reader)
    except ConnectionError:
        return 0
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _slow(port: int, head: bytes, drip: bytes, started: float) -> tuple[float, int]:
    """Send ``head`` then one ``drip`` every 0.2 s until the server closes the connection;
    the seconds that took (from ``started``) and the status it answered (0: none)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    status = 0
    try:
        writer.write(head)
        while True:
            try:
                answered = await asyncio.wait_for(reader.read(65536), 0.2)
            except TimeoutError:
                writer.write(drip)
                continue
            if not answered:
                break
            if not status and answered.startswith(b"HTTP/1.1 "):
                status = int(answered.split()[1])
    except ConnectionError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return time.monotonic() - started, status


# -- the attacks -----------------------------------------------------------------------


async def test_a_10_mb_header_is_refused_with_431_and_not_held(server: Server) -> None:
    before = server.rss_mb()
    header = b"X-Big: " + b"a" * (10 * MB) + b"\r\n"
    request = b"GET /v1/rooms HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header + b"\r\n"
    statuses = collections.Counter([await _send_all(server.port, request) for _ in range(20)])
    after = server.rss_mb()
    print(
        f"\n20 requests with a 10 MB header: statuses {dict(statuses)}; RSS {before:.0f} -> "
        f"{after:.0f} MB"
    )
    assert statuses == {431: 20}
    assert after - before < 30
    async with httpx.AsyncClient() as http:
        small = await http.get(f"{server.base}/v1/rooms", headers=server.auth())
    assert small.status_code == 200


async def test_slow_headers_and_slow_bodies_are_closed(server: Server) -> None:
    started = time.monotonic()
    host = b"Host: 127.0.0.1\r\n"
    slow_head = b"GET /v1/rooms HTTP/1.1\r\n" + host
    body_head = (
        f"POST /v1/rooms/{ROOM}/events HTTP/1.1\r\n".encode()
        + host
        + b"Content-Type: application/json\r\nContent-Length: 100000\r\n"
    )
    bearer = f"Authorization: Bearer {server.token}\r\n".encode()
    authorized = body_head + bearer + b"\r\n"
    mcp = (
        b"POST /mcp HTTP/1.1\r\n"
        + host
        + bearer
        + b"Accept: application/json, text/event-stream\r\n"
        + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    anonymous = body_head + b"\r\n"  # answered 401 at once, then the body never ends
    attacks = (
        [_slow(server.port, slow_head, b"X-A: b\r\n", started) for _ in range(20)]
        + [_slow(server.port, authorized, b" ", started) for _ in range(7)]
        + [_slow(server.port, mcp, b" ", started) for _ in range(7)]
        + [_slow(server.port, anonymous, b" ", started) for _ in range(6)]
    )
    async with asyncio.timeout(HEADER_TIMEOUT + BODY_TIMEOUT + LINGER_SECONDS + 10):
        results = await asyncio.gather(*attacks)
    slowest = max(t for t, _ in results)
    statuses = collections.Counter(s for _, s in results)
    print(
        f"\n40 slow connections (20 headers, 20 bodies: 7 API, 7 /mcp, 6 refused at once): "
        "all closed, the last after "
        f"{slowest:.1f}s; statuses {dict(statuses)}"
    )
    assert statuses == {408: 34, 401: 6}
    assert slowest < max(HEADER_TIMEOUT, BODY_TIMEOUT) + LINGER_SECONDS + 2


async def test_streams_are_capped_per_agent(server: Server) -> None:
    sse = f"{server.base}/v1/rooms/{ROOM}/events/stream"
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
        statuses = []
        for _ in range(STREAMS + 2):
            response = await stack.enter_async_context(
                http.stream("GET", sse, headers=server.auth())
            )
            statuses.append(response.status_code)
            if response.status_code == 429:
                await response.aread()
                assert response.json()["error"]["type"] == "rate_limited"
        print(f"\n{STREAMS + 2} SSE streams of one agent: statuses {statuses}")
        assert statuses == [200] * STREAMS + [429, 429]

    uri = [events_uri(ROOM)]
    async with AsyncExitStack() as stack:
        opened, refused = 0, []
        for _ in range(STREAMS + 2):
            client = await stack.enter_async_context(
                http_client(f"{server.base}/mcp", server.auth())
            )
            try:
                await stack.enter_async_context(client.listen(resource_subscriptions=uri))
                opened += 1
            except MCPError as exc:
                refused.append(str(exc))
        print(f"MCP listen streams of one agent: {opened} opened, {len(refused)} refused")
        assert opened == STREAMS and len(refused) == 2
        assert all("listen streams" in message for message in refused)

    async with (  # every slot was given back
        httpx.AsyncClient(timeout=10) as http,
        http.stream("GET", sse, headers=server.auth()) as again,
    ):
        assert again.status_code == 200


def test_failed_authentication_is_rate_limited_per_address(server: Server) -> None:
    forged = {"Authorization": "Bearer ar_0123456789abcdef_" + "0" * 64}
    # another loopback address, so the other tests' address keeps its allowance
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(transport=transport, timeout=10) as attacker:
        known = attacker.get(f"{server.base}/v1/rooms", headers=server.auth())
        assert known.status_code == 200  # this header has authenticated from the address
        started = time.monotonic()
        answers = [
            attacker.get(f"{server.base}/v1/rooms", headers=forged)
            if i % 2
            else attacker.post(f"{server.base}/mcp", json={}, headers=forged)
            for i in range(50)
        ]
        statuses = collections.Counter(a.status_code for a in answers)
        seconds = time.monotonic() - started
        limited = attacker.get(f"{server.base}/v1/rooms", headers=forged)
        retry_after = int(limited.headers["Retry-After"])
        still = attacker.get(f"{server.base}/v1/rooms", headers=server.auth())
        assert still.status_code == 200  # a header that authenticated keeps working
    print(
        f"\n50 forged tokens from one address (half /v1, half /mcp) in {seconds:.2f}s: "
        f"{dict(statuses)}; "
        f"Retry-After {retry_after}"
    )
    assert statuses == {401: AUTH_FAILURES, 429: 50 - AUTH_FAILURES}
    assert limited.json()["error"]["type"] == "rate_limited" and retry_after >= 1
    mine = httpx.get(f"{server.base}/v1/rooms", headers=server.auth())
    assert mine.status_code == 200  # another address is not limited


def test_a_token_in_the_query_string_is_refused_revoked_and_not_logged(server: Server) -> None:
    secret = server.spare.rsplit("_", 1)[1]
    assert httpx.get(f"{server.base}/v1/rooms", headers=server.auth(server.spare)).is_success
    first = httpx.get(f"{server.base}/v1/rooms?x=1&note={server.spare}")
    assert first.status_code == 401 and "now revoked" in first.json()["error"]["message"]
    for url in (f"/v1/rooms?token={server.spare}", f"/mcp?access_token={server.spare}"):
        refused = httpx.get(f"{server.base}{url}")
        assert refused.status_code == 401, refused.text
    after = httpx.get(f"{server.base}/v1/rooms", headers=server.auth(server.spare))
    assert after.status_code == 401 and "revoked" in after.json()["error"]["message"]
    time.sleep(0.2)
    log = server.log.read_text()
    print(
        f"\nquery-string token: refused, revoked; access log lines with 'redacted': "
        f"{log.count('?redacted')}; secret in the log: {secret in log}"
    )
    assert secret not in log and "?redacted" in log


def test_dev_mode_answers_only_loopback_host_and_origin(dev_server: Server) -> None:
    base = dev_server.base
    me = {"X-Agent": "devon"}
    answers = {
        "Host: evil.example": httpx.get(f"{base}/v1/rooms", headers={**me, "Host": "evil.example"}),
        "Host: evil on /healthz": httpx.get(f"{base}/healthz", headers={"Host": "evil.example"}),
        "Origin: evil": httpx.get(
            f"{base}/v1/rooms", headers={**me, "Origin": "http://evil.example"}
        ),
        "Origin: null": httpx.get(f"{base}/v1/rooms", headers={**me, "Origin": "null"}),
        "Host: evil on /mcp": httpx.post(
            f"{base}/mcp", json={}, headers={**me, "Host": "evil.example:80"}
        ),
        "Host: localhost": httpx.get(
            f"{base}/v1/rooms", headers={**me, "Host": f"localhost:{dev_server.port}"}
        ),
        "Origin: loopback": httpx.get(
            f"{base}/v1/rooms", headers={**me, "Origin": f"http://127.0.0.1:{dev_server.port}"}
        ),
    }
    statuses = {what: r.status_code for what, r in answers.items()}
    print(f"\n--dev Host/Origin: {statuses}")
    assert statuses == {
        "Host: evil.example": 403,
        "Host: evil on /healthz": 403,
        "Origin: evil": 403,
        "Origin: null": 403,
        "Host: evil on /mcp": 403,
        "Host: localhost": 200,
        "Origin: loopback": 200,
    }
    assert answers["Host: evil.example"].json()["error"]["type"] == "forbidden"


def test_an_oversized_upload_gets_its_413(server: Server) -> None:
    url = f"{server.base}/v1/rooms/{ROOM}/events"
    body = b'{"type": "note", "data": "' + b"x" * (4 * MB) + b'"}'
    statuses: collections.Counter[int | str] = collections.Counter()

    def chunked() -> Iterator[bytes]:
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    for content in [body] * 10 + [chunked] * 10:  # declared length, then chunked
        try:
            with httpx.Client(timeout=10) as http:
                payload = content if isinstance(content, bytes) else content()
                response = http.post(
                    url,
                    content=payload,
                    headers={**server.auth(), "Content-Type": "application/json"},
                )
            statuses[response.status_code] += 1
            if response.status_code == 413:
                assert response.json()["error"]["type"] == "payload_too_large"
        except httpx.TransportError as exc:
            statuses[type(exc).__name__] += 1
    print(f"\n20 uploads of 4 MiB (10 with Content-Length, 10 chunked): {dict(statuses)}")
    assert statuses == {413: 20}


def test_options_and_trailing_slashes(server: Server) -> None:
    options = httpx.options(f"{server.base}/v1/rooms/{ROOM}/docs/a", headers=server.auth())
    assert options.status_code == 204
    assert options.headers["Allow"] == "GET, PUT, DELETE, OPTIONS"
    wrong = httpx.patch(f"{server.base}/v1/rooms/{ROOM}", headers=server.auth())
    assert wrong.status_code == 405 and wrong.headers["Allow"] == "GET, DELETE, OPTIONS"
    slash = httpx.get(f"{server.base}/v1/rooms/", headers={**server.auth(), "Host": "evil.example"})
    print(
        f"\nOPTIONS: {options.status_code} Allow {options.headers['Allow']!r}; "
        f"/v1/rooms/: {slash.status_code} Location {slash.headers.get('Location')!r}"
    )
    assert slash.status_code == 404 and "Location" not in slash.headers
    assert slash.json()["error"]["type"] == "not_found"


def test_the_openapi_document_matches_behaviour(server: Server) -> None:
    doc = httpx.get(f"{server.base}/openapi.json").json()
    paths = doc["paths"]
    delete = paths["/v1/rooms/{room}/docs/{name}"]["delete"]
    if_match = [p for p in delete["parameters"] if p["name"] == "If-Match"]
    assert "428" in delete["responses"] and if_match[0]["required"] is True
    put = paths["/v1/rooms/{room}/docs/{name}"]["put"]
    assert all("428" in p["description"] for p in put["parameters"] if p["name"].startswith("If-"))
    missing = httpx.delete(f"{server.base}/v1/rooms/{ROOM}/docs/a", headers=server.auth())
    assert missing.status_code == 428
    for path, method in [
        ("/v1/rooms/{room}/events", "get"),
        ("/v1/rooms/{room}/events/read-new", "post"),
        ("/v1/rooms/{room}/events/stream", "get"),
    ]:
        assert "410" in paths[path][method]["responses"], (path, method)
    floats: list[str] = []

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "integer":
                floats.extend(
                    f"{where}.{b}"
                    for b in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
                    if isinstance(node.get(b), float)
                )
            for key, child in node.items():
                walk(child, f"{where}.{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{where}[{i}]")

    walk(doc, "")
    print(f"\nOpenAPI: If-Match required on DELETE; integer schemas with float bounds: {floats}")
    assert floats == []
