"""The real server process: `agentrooms serve --dev` answers HTTP and MCP on one port."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.helpers import MCP_INITIALIZE, free_port


def test_serve_answers_http_and_mcp(tmp_path: Path) -> None:
    port = free_port()
    url = f"sqlite:///{tmp_path / 'serve.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrooms", "serve", "--dev", "--port", str(port), "--url", url],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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
        me = {"X-Agent": "me"}
        created = httpx.post(f"{base}/v1/rooms", json={"name": "r1"}, headers=me)
        assert created.status_code == 201
        answer = httpx.post(
            f"{base}/mcp",
            json=MCP_INITIALIZE,
            headers={**me, "Accept": "application/json, text/event-stream"},
        )
        assert answer.status_code == 200 and '"tools"' in answer.text
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"http://127.0.0.1:{port}" in out
