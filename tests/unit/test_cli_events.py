"""``agentrooms events post/read/ack``: addressed posts, the inbox read exactly once,
explicit reads redelivered until acked, --json on each, errors as exit codes; ``events
read`` and ``task claim`` with ``--wait``, woken by another store handle; in-process
with typer's runner against a real SQLite store."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrooms.cli import EXIT_NOT_FOUND, EXIT_USAGE, app
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.store import open_store

runner = CliRunner()


@pytest.fixture
def url(tmp_path: Path) -> str:
    async def work() -> None:
        store = await open_store(f"sqlite:///{tmp_path / 'cli.db'}")
        try:
            await Rooms(store).create("team")
        finally:
            await store.close()

    asyncio.run(work())
    return f"sqlite:///{tmp_path / 'cli.db'}"


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_addressed_posts_reach_the_inbox_once(url: str) -> None:
    code, out, _ = invoke("events", "post", "team", "note", "--as", "lead", "--url", url)
    assert (code, out.strip()) == (0, "posted #2")
    args = ["events", "post", "team", "review", "--as", "lead", "--url", url, "--json"]
    code, out, _ = invoke(*args, "--to", "bo", "--to-role", "reviewer", "--data", '{"pr": 7}')
    assert code == 0 and json.loads(out) == {"seq": 3}
    code, out, _ = invoke("events", "read", "team", "--as", "bo", "--inbox", "--url", url)
    assert code == 0
    assert out.splitlines() == ['#3 review by lead to bo,role:reviewer {"pr": 7}']
    code, out, _ = invoke("events", "read", "team", "--as", "bo", "--inbox", "--url", url)
    assert out.strip() == "inbox empty"
    read_ana = ["events", "read", "team", "--as", "ana", "--inbox", "--role", "reviewer"]
    code, out, _ = invoke(*read_ana, "--url", url, "--json")
    body = json.loads(out)
    assert [(e["seq"], e["author"], e["to"], e["to_roles"]) for e in body["events"]] == [
        (3, "lead", ["bo"], ["reviewer"])
    ]
    assert (body["scanned"], body["more"]) == (3, False)
    code, out, _ = invoke("events", "read", "team", "--as", "cy", "--inbox", "--url", url)
    assert out.strip() == "inbox empty"
    code, out, _ = invoke("events", "read", "team", "--as", "bo", "--url", url, "--json")
    assert [e["type"] for e in json.loads(out)["events"]] == ["room.created", "note", "review"]


def test_explicit_inbox_reads_repeat_until_acked(url: str) -> None:
    invoke("events", "post", "team", "m", "--as", "lead", "--to", "bo", "--url", url)
    read = ["events", "read", "team", "--as", "bo", "--inbox", "--explicit", "--url", url]
    for _ in range(2):
        code, out, _ = invoke(*read, "--json")
        assert [e["seq"] for e in json.loads(out)["events"]] == [2]
    code, out, _ = invoke("events", "ack", "team", "2", "--as", "bo", "--inbox", "--url", url)
    assert (code, out.strip()) == (0, "cursor at #2")
    code, out, _ = invoke(*read, "--json")
    assert json.loads(out)["events"] == []


def test_errors_exit_with_their_codes(url: str) -> None:
    code, _, err = invoke("events", "post", "team", "m", "--as", "a", "--data", "{", "--url", url)
    assert code == EXIT_USAGE and err.startswith("bad_request: --data is not JSON")
    code, _, err = invoke("events", "post", "team", "m", "--as", "a", "--to", "x y", "--url", url)
    assert code == EXIT_USAGE and err.startswith("bad_request:")
    code, _, err = invoke("events", "read", "nowhere", "--as", "a", "--inbox", "--url", url)
    assert code == EXIT_NOT_FOUND and err.startswith("not_found:")


def _later(url: str, seconds: float, post: bool) -> threading.Thread:
    """In another thread (another store handle), after ``seconds``: post an event
    addressed to ``bo``, or add a task."""

    async def work() -> None:
        await asyncio.sleep(seconds)
        store = await open_store(url)
        try:
            room = Rooms(store).room("team")
            if post:
                await room.events.post("m", 1, author="lead", to=["bo"])
            else:
                await room.plan.add([TaskSpec("t1")])
        finally:
            await store.close()

    thread = threading.Thread(target=asyncio.run, args=(work(),))
    thread.start()
    return thread


def test_wait_returns_when_one_arrives_or_after_it(url: str) -> None:
    read = ("events", "read", "team", "--as", "bo", "--inbox", "--url", url, "--json")
    start = time.monotonic()
    code, out, _ = invoke(*read, "--wait", "0.3")
    assert (code, json.loads(out)["events"]) == (0, []) and time.monotonic() - start >= 0.3
    posting = _later(url, 0.3, post=True)
    start = time.monotonic()
    code, out, _ = invoke(*read, "--wait", "10")
    posting.join()
    assert [e["data"] for e in json.loads(out)["events"]] == [1]
    assert time.monotonic() - start < 5
    adding = _later(url, 0.3, post=False)
    code, out, _ = invoke("task", "claim", "team", "--agent", "bo", "--wait", "10", "--url", url)
    adding.join()
    assert code == 0 and out.startswith("claimed t1"), out
