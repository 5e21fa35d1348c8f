"""The library without its optional distributions: each missing one is a clear error.

Each test runs a fresh interpreter whose import system refuses the named top-level
packages (a meta-path finder that raises ``ModuleNotFoundError`` for them), as if they
were not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
        return None
sys.meta_path.insert(0, Blocker())
"""


def without(blocked: set[str], script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter where ``blocked`` cannot be imported."""
    code = BLOCKER.format(blocked=sorted(blocked)) + textwrap.dedent(script)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_the_blocker_blocks() -> None:
    ran = without({"json"}, "import json")
    assert ran.returncode == 1 and "No module named 'json'" in ran.stderr


def test_bench_without_the_bench_distribution_names_it() -> None:
    ran = without(
        {"agentrooms_bench"},
        """
        import sys
        from agentrooms.cli import main
        sys.argv = ["agentrooms", "bench", "--quick"]
        main()
        """,
    )
    assert ran.returncode == 2, ran.stderr
    assert "agentrooms bench needs the agentrooms-bench distribution" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_bench_help_is_the_suites_own() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "agentrooms", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
    )
    assert ran.returncode == 0, ran.stderr
    assert "agentrooms bench" in ran.stdout and "--lock-agents" in ran.stdout


SERVER_STACK = {"fastapi", "uvicorn", "mcp", "starlette", "pydantic", "httpx"}


def test_the_library_works_without_the_server_stack(tmp_path: Path) -> None:
    ran = without(
        SERVER_STACK,
        f"""
        import asyncio, sys
        import agentrooms
        from agentrooms import Rooms, TaskSpec, open_store
        from agentrooms.server import AuthConfig, mint

        async def main():
            store = await open_store("sqlite:///{tmp_path / "lean.db"}")
            try:
                room = await Rooms(store).create("lean")
                await room.plan.add([TaskSpec("t1", "the only task")])
                lease = await room.plan.claim("t1", "agent-a")
                await room.plan.complete(lease, {{"ok": True}})
                task = (await room.plan.tasks())[0]
                await mint(store, "agent-a", rooms=["lean"], scopes=["rooms:read"])
                print(task.status, AuthConfig().dev)
            finally:
                await store.close()

        asyncio.run(main())
        loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({sorted(SERVER_STACK)!r}))
        print("loaded", loaded)
        """,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["done False", "loaded []"]


@pytest.mark.parametrize(("command", "extra"), [("serve", "server"), ("mcp", "mcp")])
def test_serve_and_mcp_without_their_extra_name_it(
    command: str, extra: str, tmp_path: Path
) -> None:
    ran = without(
        {"fastapi", "uvicorn", "mcp"},
        f"""
        import sys
        from agentrooms.cli import main
        sys.argv = ["agentrooms", "{command}", "--url", "sqlite:///{tmp_path / "s.db"}",
                    *(["--dev"] if "{command}" == "serve" else ["--agent", "a"])]
        main()
        """,
    )
    assert ran.returncode == 2, ran.stderr
    assert f"agentrooms {command} needs the {extra} extra" in ran.stderr
    assert f"pip install 'agentrooms[{extra}]'" in ran.stderr and "Traceback" not in ran.stderr


def test_create_app_without_the_server_extra_names_it() -> None:
    ran = without(
        {"fastapi"},
        """
        from agentrooms.extras import MissingExtra
        try:
            from agentrooms.server import create_app
        except MissingExtra as exc:
            print(exc.name, exc)
        """,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("fastapi agentrooms.server.create_app needs the server extra")


def test_mcp_on_stdio_needs_no_web_framework(tmp_path: Path) -> None:
    """``agentrooms mcp`` (the process an MCP host spawns per session) answers
    ``initialize`` and lists its tools with FastAPI and uvicorn absent: the ``mcp`` extra
    does not pull the HTTP stack, and the cold start does not pay for it."""
    code = BLOCKER.format(blocked=["fastapi", "uvicorn"]) + textwrap.dedent(
        f"""
        import sys
        from agentrooms.cli import main
        sys.argv = ["agentrooms", "mcp", "--agent", "a", "--url",
                    "sqlite:///{tmp_path / "m.db"}"]
        main()
        """
    )
    requests = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    # stdin stays open until both answers are read: at end of input the server may stop
    # before it answers what it has read
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
        child.stdin.flush()
        answers: dict[int, Any] = {}
        while 2 not in answers:
            line = child.stdout.readline()
            assert line, "the server ended without answering"
            answer = json.loads(line)
            if "id" in answer:
                answers[answer["id"]] = answer
    finally:
        child.communicate(timeout=60)  # closes stdin, reads the rest, closes the pipes
    assert child.returncode == 0
    assert answers[1]["result"]["serverInfo"]["name"], answers
    names = {tool["name"] for tool in answers[2]["result"]["tools"]}
    assert {"claim_task", "read_new_events", "write_document"} <= names


def test_the_cli_without_the_client_extra_works_on_a_store_and_names_it_for_server(
    tmp_path: Path,
) -> None:
    """Without httpx (nor the server stack), the room commands work on a store, and
    ``--server`` (or importing agentrooms.client) names the client extra."""
    store = f"sqlite:///{tmp_path / 's.db'}"
    ran = without(
        {"httpx", "fastapi", "uvicorn", "mcp"},
        f"""
        import sys
        from typer.testing import CliRunner
        from agentrooms.cli import app
        from agentrooms.extras import MissingExtra
        runner = CliRunner()
        for args in (["rooms", "create", "r", "--url", "{store}"],
                     ["events", "post", "r", "note", "--as", "a", "--url", "{store}"],
                     ["doc", "list", "r", "--url", "{store}", "--json"],
                     ["rooms", "list", "--server", "http://127.0.0.1:9"]):
            done = runner.invoke(app, args)
            print(done.exit_code, done.stdout.strip() or done.stderr.strip())
        try:
            import agentrooms.client
        except MissingExtra as exc:
            print(exc.name, exc)
        """,
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[1:3] == ["0 posted #2", '0 {"documents": []}'], lines
    assert lines[3].startswith("2 not_installed: --server needs the client extra")
    assert lines[4].startswith("httpx agentrooms.client needs the client extra")
