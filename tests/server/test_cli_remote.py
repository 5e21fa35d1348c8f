"""The command line's remote mode: ``--server URL`` with the token in
``$AGENTROOMS_TOKEN``, against a real ``agentrooms serve`` process with tokens; the same
commands on the store itself (``--url``) answer the same; a refusal is one clear line
and its exit code."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from agentrooms.cli import EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_USAGE, app
from agentrooms.server import mint
from agentrooms.store import open_store
from tests.helpers import free_port

runner = CliRunner()


class Served:
    def __init__(self, url: str, base: str, tokens: dict[str, str]) -> None:
        self.url, self.base, self.tokens = url, base, tokens


async def _mint(url: str) -> dict[str, str]:
    store = await open_store(url)
    try:
        admin = await mint(store, "alice", rooms="*", scopes=["admin"])
        reader = await mint(store, "rita", rooms="*", scopes=["rooms:read", "docs:read"])
        return {"alice": admin.token, "rita": reader.token}
    finally:
        await store.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``agentrooms serve`` (tokens required) on a SQLite file, on a free port."""
    folder = tmp_path_factory.mktemp("remote")
    url = f"sqlite:///{folder / 'served.db'}"
    tokens = asyncio.run(_mint(url))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrooms", "serve", "--port", str(port), "--url", url],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
            time.sleep(0.2)
        yield Served(url, base, tokens)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def run(*args: str, token: str | None = None) -> tuple[int, str, str]:
    env = {"COLUMNS": "200", "AGENTROOMS_TOKEN": token or ""}
    result = runner.invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def ok(*args: str, token: str | None = None) -> Any:
    code, out, err = run(*args, "--json", token=token)
    assert code == 0, (args, out, err)
    return json.loads(out)


@pytest.mark.parametrize("where", ["server", "store"])
def test_a_room_worked_from_the_command_line(served: Served, where: str) -> None:
    """One flow, through the server (``--server``, the token's agent) and on the store
    itself (``--url``, ``--agent``): the same commands, the same answers."""
    token = served.tokens["alice"]
    at = ["--server", served.base] if where == "server" else ["--url", served.url]
    me = [] if where == "server" else ["--agent", "alice"]
    room = f"cli-{where}"
    code, _, err = run("rooms", "create", room, *at, token=token)
    assert code == 0, err
    assert room in [r["name"] for r in ok("rooms", "list", *at, token=token)["rooms"]]
    assert ok("task", "add", room, "a", "--title", "first", *at, token=token) == {"ready": ["a"]}
    ok("task", "add", room, "b", "--dep", "a", *at, token=token)
    lease = ok("task", "claim", room, *me, *at, token=token)["lease"]
    assert (lease["task_id"], lease["agent"], lease["fence"]) == ("a", "alice", 1)
    shown = ok("plan", "show", room, *at, token=token)
    assert {t["id"]: t["state"] for t in shown["tasks"]} == {"a": "claimed", "b": "pending"}
    code, _, err = run("task", "complete", room, "a", "--fence", "0", *me, *at, token=token)
    assert code == EXIT_REFUSED and err.startswith("stale_fence: ")
    done = ok("task", "complete", room, "a", "--fence", "1", "--result", '{"n": 1}', *me, *at,
              token=token)["task"]  # fmt: skip
    assert (done["status"], done["result"]) == ("done", {"n": 1})
    assert [t["id"] for t in ok("task", "list", room, "--status", "ready", *at, token=token)[
        "tasks"]] == ["b"]  # fmt: skip
    first = ok("doc", "put", room, "spec", '{"v": 1}', "--create", *at, token=token)
    second = ok("doc", "put", room, "spec", '{"v": 2}', "--if-match", str(first["version"]), *at,
                token=token)  # fmt: skip
    code, _, err = run("doc", "put", room, "spec", "3", "--if-match", str(first["version"]), *at,
                       token=token)  # fmt: skip
    assert code == EXIT_REFUSED and err.startswith("version_conflict: ")
    assert ok("doc", "get", room, "spec", *at, token=token) == second
    assert [d["name"] for d in ok("doc", "list", room, *at, token=token)["documents"]] == ["spec"]
    seq = ok("events", "post", room, "note", "--data", '{"hi": true}', *me, *at, token=token)["seq"]
    events = ok("events", "log", room, "--after", str(seq - 1), *at, token=token)["events"]
    assert [(e["seq"], e["type"], e["data"]) for e in events] == [(seq, "note", {"hi": True})]
    # an addressed event reaches the token agent's inbox, once
    ok("events", "post", room, "task", "--to", "alice", *me, *at, token=token)
    inbox = ok("events", "read", room, "--inbox", *me, *at, token=token)
    assert [(e["type"], e["to"], e["author"]) for e in inbox["events"]] == [
        ("task", ["alice"], "alice")
    ]
    assert ok("events", "read", room, "--inbox", *me, *at, token=token)["events"] == []
    seq += 1
    code, out, err = run("tail", room, "--after", str(seq - 1), "--count", "1", "--json", *at,
                         token=token)  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["seq"] == seq
    assert ok("presence", "list", room, *at, token=token) == {"members": []}
    assert ok("locks", "show", room, "merge", *at, token=token) == {
        "name": "merge",
        "holder": None,
        "waiters": [],
    }
    page = ok("status", room, *at, token=token)  # the operator API's page, either way
    assert (page["room"], page["plan"]["counts"]) == (room, {"done": 1, "ready": 1})
    assert [d["name"] for d in page["documents"]] == ["spec"]
    code, out, err = run("status", room, *at, token=token)
    assert code == 0, err
    assert room in out and "spec" not in err
    code, _, err = run("doc", "get", "no-such-room", "x", *at, token=token)
    assert code == EXIT_NOT_FOUND and err.startswith("not_found: ")


@pytest.mark.parametrize("where", ["server", "store"])
def test_wait_through_the_server_and_on_the_store(served: Served, where: str) -> None:
    """``--wait``: with nothing new a read answers empty after about the wait, and a
    claim with the one task held answers no lease after it, either way."""
    token = served.tokens["alice"]
    at = ["--server", served.base] if where == "server" else ["--url", served.url]
    me = [] if where == "server" else ["--agent", "alice"]
    room = f"cli-wait-{where}"
    assert run("rooms", "create", room, *at, token=token)[0] == 0
    ok("events", "read", room, *me, *at, token=token)  # room.created
    start = time.monotonic()
    assert ok("events", "read", room, "--wait", "0.5", *me, *at, token=token)["events"] == []
    assert time.monotonic() - start >= 0.45
    ok("task", "add", room, "a", *at, token=token)
    assert ok("task", "claim", room, *me, *at, token=token)["lease"]["task_id"] == "a"
    start = time.monotonic()
    assert ok("task", "claim", room, "--wait", "0.5", *me, *at, token=token) == {"lease": None}
    assert time.monotonic() - start >= 0.45


def test_a_refusal_is_one_line_and_its_exit_code(served: Served) -> None:
    at = ["--server", served.base]
    assert run("rooms", "create", "refusals", *at, token=served.tokens["alice"])[0] == 0
    code, out, err = run("doc", "put", "refusals", "d", "1", "--create", *at,
                         token=served.tokens["rita"])  # fmt: skip
    assert code == EXIT_USAGE and out == ""
    assert err.strip() == (
        f"forbidden: this token lacks the 'docs:write' scope (server {served.base})"
    )
    code, _, err = run("rooms", "list", *at, token=None)
    assert code == EXIT_USAGE
    assert err.startswith("unauthorized: ") and "set AGENTROOMS_TOKEN" in err
    code, _, err = run("rooms", "list", *at, token="ar_nope_nope")
    assert code == EXIT_USAGE and err.startswith("unauthorized: ")
    code, _, err = run("rooms", "list", "--server", f"http://127.0.0.1:{free_port()}",
                       token=served.tokens["alice"])  # fmt: skip
    assert code == 6 and err.startswith("store_unavailable: ")


def test_the_server_option_reads_the_environment(served: Served) -> None:
    env = {
        **os.environ,
        "AGENTROOMS_SERVER": served.base,
        "AGENTROOMS_TOKEN": served.tokens["alice"],
    }
    out = subprocess.run(
        [sys.executable, "-m", "agentrooms", "rooms", "list", "--json"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert "rooms" in json.loads(out.stdout)
