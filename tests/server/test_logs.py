"""``agentrooms serve --log-format json`` (or ``AGENTROOMS_LOG_FORMAT=json``) as a real
process: every stderr line is one JSON object, and each request's line carries its
request id (the client's, or one the server made and echoed), agent, room and error type."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from agentrooms.cli import app
from agentrooms.server.observe import JsonFormatter
from agentrooms.store import Store
from tests.helpers import MCP_INITIALIZE, free_port
from tests.server.support import BASE, make_app


def start(tmp_path: Path, *, flag: bool) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    args = ["serve", "--dev", "--port", str(port), "--url", f"sqlite:///{tmp_path / 's.db'}"]
    env = {k: v for k, v in os.environ.items() if k != "AGENTROOMS_LOG_FORMAT"}
    if flag:
        args += ["--log-format", "json"]
    else:
        env["AGENTROOMS_LOG_FORMAT"] = "json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrooms", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"the server did not start: {proc.communicate()[1]}")
        time.sleep(0.2)


def stop(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """Stop the server; its stderr, each line parsed as JSON (a line that is not fails)."""
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    return [json.loads(line) for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize("flag", [True, False], ids=["flag", "env"])
def test_json_logs_carry_request_id_agent_room_and_error_type(tmp_path: Path, flag: bool) -> None:
    proc, base = start(tmp_path, flag=flag)
    try:
        alice = {"X-Agent": "alice", "X-Request-Id": "req-create-1"}
        created = httpx.post(f"{base}/v1/rooms", json={"name": "r1"}, headers=alice)
        assert created.status_code == 201 and created.headers["X-Request-Id"] == "req-create-1"
        post = httpx.post(
            f"{base}/v1/rooms/r1/events",
            json={"type": "note"},
            headers={"X-Agent": "bob", "X-Request-Id": "req-post-2"},
        )
        assert post.status_code == 201
        missing = httpx.get(f"{base}/v1/rooms/nope", headers={"X-Agent": "carol"})
        assert missing.status_code == 404
        made = missing.headers["X-Request-Id"]  # none given: the server made one
        mcp_headers = {
            "X-Agent": "erin",
            "X-Request-Id": "req-mcp-3",
            "Accept": "application/json, text/event-stream",
        }
        assert (
            httpx.post(f"{base}/mcp", json=MCP_INITIALIZE, headers=mcp_headers).status_code == 200
        )
        bad_id = httpx.get(f"{base}/healthz", headers={"X-Request-Id": "has space\x7f"})
        assert bad_id.headers["X-Request-Id"] not in ("has space\x7f", "")
    finally:
        lines = stop(proc)

    for line in lines:
        assert {"time", "level", "message", "request_id", "agent", "room", "error_type"} <= set(
            line
        ), line
    by_id = {line["request_id"]: line for line in lines if line.get("http")}
    create = by_id["req-create-1"]
    assert (create["agent"], create["room"], create["error_type"]) == ("alice", None, None)
    assert create["level"] == "info" and create["http"]["status"] == 201
    assert create["http"]["route"] == "/v1/rooms" and create["message"] == "POST /v1/rooms 201"
    event = by_id["req-post-2"]
    assert (event["agent"], event["room"]) == ("bob", "r1")
    assert event["http"]["route"] == "/v1/rooms/{room}/events"
    absent = by_id[made]
    assert (absent["agent"], absent["room"], absent["error_type"]) == ("carol", "nope", "not_found")
    assert absent["http"]["status"] == 404 and len(made) >= 16
    assert by_id[bad_id.headers["X-Request-Id"]]["http"]["route"] == "/healthz"
    mcp = by_id["req-mcp-3"]
    assert (mcp["agent"], mcp["http"]["route"], mcp["http"]["status"]) == ("erin", "/mcp", 200)
    assert any(line["logger"].startswith("uvicorn") for line in lines)  # its lines are JSON too


def test_an_unknown_log_format_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["serve", "--dev", "--log-format", "xml"])
    assert result.exit_code == 2 and "text or json" in result.stderr


class Lines(logging.Handler):
    """Records formatted by :class:`JsonFormatter`, parsed back."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


async def test_an_unexpected_error_line_and_its_500_carry_the_request(store: Store) -> None:
    """A route that raises: the traceback line and the request line both name the
    request id, agent and room, and the 500 envelope echoes the id."""
    app = make_app(store, dev=True)

    @app.get("/v1/rooms/{room}/boom")
    async def boom(room: str) -> None:
        raise RuntimeError("the disk caught fire")

    handler = Lines()
    loggers = [logging.getLogger(name) for name in ("agentrooms.server", "agentrooms.access")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as c:
            headers = {"X-Agent": "dave", "X-Request-Id": "req-boom"}
            answer = await c.get("/v1/rooms/r9/boom", headers=headers)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert answer.status_code == 500 and answer.headers["X-Request-Id"] == "req-boom"
    assert answer.json()["error"]["type"] == "internal_error"
    error, request = handler.lines
    assert error["level"] == "error" and error["logger"] == "agentrooms.server"
    assert (error["request_id"], error["agent"], error["room"]) == ("req-boom", "dave", "r9")
    assert error["error_type"] == "RuntimeError" and "the disk caught fire" in error["exception"]
    assert request["level"] == "error" and request["http"]["status"] == 500
    assert (request["request_id"], request["error_type"]) == ("req-boom", "internal_error")
    assert request["http"]["route"] == "/v1/rooms/{room}/boom"
