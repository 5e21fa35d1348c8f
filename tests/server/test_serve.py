"""The real server process: `agentrooms serve --dev` answers HTTP and MCP on one port,
with its limits taken from flags and the environment alike."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.helpers import MCP_INITIALIZE, free_port

ME = {"X-Agent": "me"}


@contextmanager
def serving(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``agentrooms serve --dev`` on a free port until it is ready; yield its base URL,
    then stop it (by its own pid) and check it printed where it listened."""
    port = free_port()
    url = f"sqlite:///{tmp_path / 'serve.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrooms", "serve", "--dev", "--port", str(port), "--url", url,
         *flags],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"http://127.0.0.1:{port}" in out


def test_serve_answers_http_and_mcp(tmp_path: Path) -> None:
    with serving(tmp_path) as base:
        created = httpx.post(f"{base}/v1/rooms", json={"name": "r1"}, headers=ME)
        assert created.status_code == 201
        answer = httpx.post(
            f"{base}/mcp",
            json=MCP_INITIALIZE,
            headers={**ME, "Accept": "application/json, text/event-stream"},
        )
        assert answer.status_code == 200 and '"tools"' in answer.text


def served_before_429(base: str, most: int = 200) -> int:
    """How many requests in a row one agent gets served before its first 429 (``most``
    if none of ``most`` is refused)."""
    with httpx.Client(base_url=base, headers=ME) as client:
        for served in range(most):
            if client.get("/v1/rooms").status_code == 429:
                return served
    return most


def test_limits_come_from_the_environment_and_flags(tmp_path: Path) -> None:
    slow = {"AGENTROOMS_RATE": "0.01", "AGENTROOMS_BURST": "3"}
    with serving(tmp_path, env=slow) as base:
        assert served_before_429(base) == 3
    with serving(tmp_path, "--burst", "6", env=slow) as base:  # the flag beats the variable
        assert served_before_429(base) == 6
    with serving(tmp_path, "--max-body-bytes", "100", env={"AGENTROOMS_RATE": "0"}) as base:
        big = httpx.post(f"{base}/v1/rooms", json={"name": "r" * 200}, headers=ME)
        assert big.status_code == 413
        assert served_before_429(base) == 200  # past the default burst: rate 0 is off
