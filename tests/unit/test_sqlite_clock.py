"""One clock for every process of a SQLite file (store/sqlite/clock.py).

The shifted processes are real children run under Debian's ``faketime`` (libfaketime
shifts the wall clock that ``time.time()`` reads; ``FAKETIME_DONT_FAKE_MONOTONIC`` keeps
the monotonic clock true, as a wall clock set wrong would). Each child uses the library
as an agent would, on a file where this process holds a live lease, a live lock and a
live presence.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrooms import ClockSkew, Rooms, TaskSpec, open_store
from agentrooms.errors import BadRequest
from agentrooms.store.sqlite.backend import SqliteStore
from agentrooms.store.sqlite.clock import ClockCheck, file_clock_offset
from tests.conftest import unavailable

FAKETIME = shutil.which("faketime")

CHILD = """
import asyncio, json, sys
from agentrooms import AgentroomsError, Rooms, open_store

async def main(url, action):
    store = await open_store(url)
    try:
        room = Rooms(store).room("r")
        if action == "claim":
            lease = await room.plan.claim("held", "intruder", ttl=600)
            return {"fence": lease.fence}
        if action == "claim-ready":
            lease = await room.plan.claim("ready", "intruder", ttl=600)
            return {"fence": lease.fence}
        if action == "lock":
            lock = await room.locks.try_acquire("report", "intruder", ttl=600)
            return {"fence": lock.fence}
        if action == "presence":
            await room.presence.heartbeat("intruder", ttl=600)
            return {"online": [m.agent for m in await room.presence.who_is_online()]}
        raise SystemExit(f"unknown action {action}")
    finally:
        await store.close()

try:
    print(json.dumps({"ok": asyncio.run(main(sys.argv[1], sys.argv[2]))}))
except AgentroomsError as exc:
    print(json.dumps({"error": exc.code, "message": str(exc)}))
"""


def shifted(shift: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python args`` with its wall clock shifted by ``shift`` (faketime syntax)."""
    if FAKETIME is None:
        unavailable("faketime (apt-get install faketime)")
    assert FAKETIME is not None
    env = {**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    return subprocess.run(
        [FAKETIME, "-f", shift, sys.executable, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def child(shift: str, url: str, action: str) -> dict[str, object]:
    done = shifted(shift, "-c", CHILD, url, action)
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


async def held_room(url: str) -> dict[str, object]:
    """A room where this process holds task ``held``'s lease, lock ``report`` and its
    presence, all for ten minutes; task ``ready`` is free. Returns what it holds."""
    store = await open_store(url)
    try:
        room = await Rooms(store).create("r")
        await room.plan.add([TaskSpec("held", "held"), TaskSpec("ready", "ready")])
        lease = await room.plan.claim("held", "agent-a", ttl=600)
        lock = await room.locks.try_acquire("report", "agent-a", ttl=600)
        await room.presence.heartbeat("agent-a", ttl=600)
        return {"lease": lease.fence, "lock": lock.fence}
    finally:
        await store.close()


async def still_held(url: str, held: dict[str, object]) -> None:
    store = await open_store(url)
    try:
        room = Rooms(store).room("r")
        task = await room.plan.get("held")
        assert (task.owner, task.fence) == ("agent-a", held["lease"])
        holder = await room.locks.holder("report")
        assert holder is not None and holder.owner == "agent-a"
        online = [m.agent for m in await room.presence.who_is_online()]
        assert online == ["agent-a"]
        assert (await room.plan.get("ready")).status == "ready"
    finally:
        await store.close()


@pytest.mark.parametrize("action", ["claim", "lock", "presence"])
async def test_a_process_an_hour_ahead_takes_nothing_live(tmp_path: Path, action: str) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    held = await held_room(url)
    answer = child("+1h", url, action)
    assert answer.get("error") == "clock_skew", answer
    assert "3600" in str(answer["message"]) and "ahead" in str(answer["message"])
    await still_held(url, held)


async def test_a_process_an_hour_behind_writes_no_lease(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    held = await held_room(url)
    answer = child("-1h", url, "claim-ready")
    assert answer.get("error") == "clock_skew", answer
    assert "behind" in str(answer["message"])
    await still_held(url, held)  # "ready" was not given a lease expired for everyone


async def test_a_process_within_the_tolerance_works(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    await held_room(url)
    answer = child("+0.3", url, "claim-ready")
    assert "ok" in answer, answer
    # a tolerance wider than the skew lets the child judge by its own clock, as every
    # process did before the check: the lease it takes was live for everyone else
    answer = child("+1h", f"{url}?max_clock_skew=7200", "claim-ready")
    assert "ok" in answer, answer


def test_doctor_reports_a_skewed_clock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    fine = shifted("+0", "-m", "agentrooms", "doctor", "--url", url)
    assert "file system" in fine.stdout, fine.stdout + fine.stderr
    skewed = shifted("+1h", "-m", "agentrooms", "doctor", "--url", url)
    assert skewed.returncode != 0
    assert "clock_skew" in skewed.stdout + skewed.stderr
    assert "ahead" in skewed.stdout + skewed.stderr


async def test_a_clock_set_wrong_while_running_is_refused_at_once(tmp_path: Path) -> None:
    """A step of the clock against the monotonic clock re-checks before the next call."""
    offset = [0.0]

    def clock() -> float:
        import time

        return time.time() + offset[0]

    store = SqliteStore(f"sqlite:///{tmp_path / 'x.db'}", clock=clock)
    try:
        await store.read("r", ["k"])
        offset[0] = 30.0
        with pytest.raises(ClockSkew) as refused:
            await store.read("r", ["k"])
        assert refused.value.offset == pytest.approx(30.0, abs=0.5)
        offset[0] = 0.0
        await store.read("r", ["k"])  # agrees again: served again
    finally:
        await store.close()


def test_the_file_system_clock_is_this_host_clock(tmp_path: Path) -> None:
    import time

    assert abs(file_clock_offset(str(tmp_path), time.time)) < 0.1
    check = ClockCheck(str(tmp_path / "x.db"), lambda: time.time() - 5, 1.0)
    with pytest.raises(ClockSkew, match=r"5\.0\d\d s behind"):
        check.measure()


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
async def test_a_bad_tolerance_is_a_bad_request(tmp_path: Path, value: str) -> None:
    with pytest.raises(BadRequest, match="max_clock_skew"):
        await open_store(f"sqlite:///{tmp_path / 'x.db'}?max_clock_skew={value}")
