"""``agentrooms status`` through the command line on the embedded store: the 2am room's
every stuck item on an 80-column screen, ``--json`` (the API's JSON), a missing room,
and ``--watch`` woken by an event another process appends."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from agentrooms.cli import EXIT_NOT_FOUND, app
from agentrooms.rooms import Rooms
from agentrooms.store import open_store
from tests import ops_scenario as s

runner = CliRunner()
ROOM = "night"


def _seeded(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"

    async def seed() -> None:
        store = await open_store(url)
        try:
            await s.seed_2am(store, ROOM)
        finally:
            await store.close()

    asyncio.run(seed())
    return url


def test_status_shows_the_2am_room_at_80_columns(tmp_path: Path) -> None:
    url = _seeded(tmp_path)
    result = runner.invoke(app, ["status", ROOM, "--url", url], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert max(len(line) for line in out.splitlines()) <= 80
    stuck_at = out.index("STUCK (5)")
    for kind, subject in [
        ("expired_lease", s.EXPIRED_TASK),
        ("waiter_waiting", s.LOCK),
        ("effect_unknown", s.UNKNOWN_EFFECT),
        ("failed_at_limit", s.FAILED_TASK),
        ("cursor_lagging", s.LAGGING_AGENT),
    ]:
        line = next(x for x in out.splitlines() if x.startswith(kind))
        assert subject in line
        assert out.index(kind) > stuck_at
    assert out.index("STUCK") < out.index("PLAN") < out.index("LOCKS") < out.index("PRESENCE")
    assert out.index("PRESENCE") < out.index("LAG")
    assert "200 tasks" in out and "1 expired, reclaimable" in out
    assert "5, longest 7" in out  # the lock's line: 5 waiters, the longest 75 s and more
    assert "1 failed" in out and "1 unknown" in out  # the dead letter, the unknown effect
    assert f"doc/{s.HOT_DOC} {s.HOT_CONFLICTS}" in out


def test_status_json_is_the_operator_apis_json(tmp_path: Path) -> None:
    url = _seeded(tmp_path)
    result = runner.invoke(app, ["status", ROOM, "--url", url, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["room"] == ROOM and doc["plan"]["total"] == s.TASKS
    assert len(doc["stuck"]) == 5 and doc["stuck"][0]["kind"] == "expired_lease"
    lenient = runner.invoke(app, ["status", ROOM, "--url", url, "--json", "--cursor-lag", "100000"])
    assert "cursor_lagging" not in {i["kind"] for i in json.loads(lenient.output)["stuck"]}


def test_status_of_a_missing_room_is_not_found(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    result = runner.invoke(app, ["status", "nowhere", "--url", url])
    assert result.exit_code == EXIT_NOT_FOUND
    assert "not_found" in result.output


def test_status_watch_is_woken_by_another_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"

    async def create() -> None:
        store = await open_store(url)
        await Rooms(store).create(ROOM)
        await store.close()

    asyncio.run(create())
    env = {**os.environ, "COLUMNS": "80", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "agentrooms", "status", ROOM, "--url", url]
    proc = subprocess.Popen(
        [*command, "--watch", "--json", "--every", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["last_seq"] == 1

        async def post() -> float:
            store = await open_store(url)
            await Rooms(store).room(ROOM).events.post("note", {"from": "another process"})
            await store.close()
            return time.monotonic()

        posted = asyncio.run(post())
        second = json.loads(proc.stdout.readline())
        woke = time.monotonic()
        assert second["last_seq"] == 2
        assert second["events"][0]["type"] == "note"
        assert woke - posted < 2.0  # woken by the store, not by the 60 s refresh
    finally:
        proc.terminate()
        proc.communicate(timeout=10)  # and close its pipes


def test_doc_json_and_status_json_name_the_documents_writer(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"

    async def seed() -> None:
        store = await open_store(url)
        try:
            room = await Rooms(store).create(ROOM)
            await room.docs.put("spec", {"v": 1}, author="ann")
            for i in range(100):
                await room.events.post("note", {"i": i}, author="chatter")
        finally:
            await store.close()

    asyncio.run(seed())
    got = runner.invoke(app, ["doc", "get", ROOM, "spec", "--url", url, "--json"])
    assert got.exit_code == 0, got.output
    assert json.loads(got.output)["writer"] == "ann"
    status = runner.invoke(app, ["status", ROOM, "--url", url, "--json"])
    assert status.exit_code == 0, status.output
    (row,) = json.loads(status.output)["documents"]
    assert (row["name"], row["last_writer"]) == ("spec", "ann")
