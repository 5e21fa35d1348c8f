"""Fences, cursors and the outbox, recorded under faults on every backend and checked,
through the library and (fences, cursors) through the HTTP API and MCP against several
server processes; and each checker shown to flag a hand-made history that breaks its
property."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrooms import StaleFence
from agentrooms.cli import app
from agentrooms.reliability.history import Operation
from agentrooms.reliability.properties import (
    PropertyReport,
    check_cursors,
    check_fences,
    check_outbox,
    run_cursors,
    run_fences,
    run_outbox,
)
from agentrooms.reliability.properties.common import Journal, load_journals
from agentrooms.reliability.properties.cursors import CursorWork
from agentrooms.reliability.properties.fences import FenceWork, fence_worker
from agentrooms.reliability.servers import ServerProcess
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.rooms.plan import Lease, Plan, Task
from agentrooms.store import open_store
from agentrooms.store.types import JSON
from tests.conftest import Backend

WORKERS = 3


def _room(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:10]}"


def _show(backend: Backend, report: PropertyReport) -> None:
    print(
        f"{backend.name} {report.name}: {report.operations} ops, {report.unknown} unknown, "
        f"{report.faults} faults, {report.counts}"
    )


async def test_fences_hold_under_stalls_and_stops(backend: Backend, tmp_path: Path) -> None:
    report = await run_fences(
        backend.url, _room("fences"), workers=WORKERS, seed=1, workdir=tmp_path, faults=True
    )
    _show(backend, report)
    assert report.ok, report.anomalies
    counts = report.counts
    assert counts["done"] == counts["tasks"] == 16
    # every task ended done (its completion acknowledged, or answered lost to a kill:
    # check_fences accepts a result only from a completion that may have applied)
    # the faults reached the paths that matter: leases lost and taken over, and late
    # holders fenced out
    assert counts["reclaims"] >= 1 and counts["stale_rejected"] >= 1 and report.faults >= 1


async def test_cursors_deliver_every_event_once_across_consumer_kills(
    backend: Backend, tmp_path: Path
) -> None:
    # two agents with a consumer each, and two consumers sharing a third agent's cursor
    report = await run_cursors(
        backend.url, _room("cursors"), workers=2, seed=1, workdir=tmp_path, faults=True
    )
    _show(backend, report)
    assert report.ok, report.anomalies
    counts = report.counts
    assert counts["agents"] == 3 and counts["events"] == 31  # room.created and 30
    # two lives of each agent's own consumer were killed (the shared agent's two
    # consumers may handle too few events in a life to reach its kill point)
    assert counts["kills"] >= 2 * 2
    assert counts["redelivered"] >= 1  # some events came again after an unacknowledged ack


async def test_outbox_effects_are_performed_once_or_reconciled(
    backend: Backend, tmp_path: Path
) -> None:
    report = await run_outbox(
        backend.url, _room("outbox"), workers=WORKERS, seed=1, workdir=tmp_path, faults=True
    )
    _show(backend, report)
    assert report.ok, report.anomalies
    counts = report.counts
    assert counts["effects"] == 16 and counts["kills"] >= 1
    assert counts["unrecorded_claims"] >= 1 and counts["reconciled"] >= 1
    if backend.shared_across_processes:
        # the performer stopped past its lease was taken over, the effect performed
        # again after the reconciler found nothing, and its late record refused
        assert counts["stops"] == 1 and counts["performed_twice_reconciled"] >= 1
        assert counts["stale_records"] >= 1


# ------------------------------------------------------------- over HTTP

SERVERS = 2


# Two backends, not three: the HTTP path is the same server code on each, and every
# server and worker process start costs more than the rest of a run (Redis runs these
# properties through the library above; run_fences and run_cursors take its servers too).
@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def shared_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str, Path]:
    """The backend, its URL and a work folder (a sync fixture: the backends' session
    fixtures run their own event loop)."""
    workdir = tmp_path_factory.mktemp(f"props-{request.param}")
    if request.param == "sqlite":
        return request.param, f"sqlite:///{workdir / 'store.db'}", workdir
    url: str = request.getfixturevalue(f"{request.param}_url")
    return request.param, url, workdir


@pytest.fixture(scope="module")
async def servers(
    shared_store: tuple[str, str, Path],
) -> AsyncIterator[tuple[str, str, list[ServerProcess]]]:
    backend, url, workdir = shared_store
    procs = [ServerProcess(url, workdir) for _ in range(SERVERS)]
    try:
        await procs[0].start()  # the first one prepares the store alone
        await asyncio.gather(*(p.start() for p in procs[1:]))
        yield backend, url, procs
    finally:
        for p in procs:
            p.stop()


async def _kill_and_restart(proc: ServerProcess, started: asyncio.Event) -> None:
    """``kill -9`` of one server a moment after the run's workers started, then its
    restart on its port."""
    await started.wait()
    await asyncio.sleep(0.2)
    proc.kill()
    await proc.start()


async def test_fences_hold_over_http_under_stops_and_a_server_kill(
    servers: tuple[str, str, list[ServerProcess]], tmp_path: Path
) -> None:
    backend, url, procs = servers
    started = asyncio.Event()
    fault = asyncio.create_task(_kill_and_restart(procs[1], started))
    report = await run_fences(
        url,
        _room("fences"),
        workers=WORKERS,
        seed=2,
        workdir=tmp_path,
        faults=True,
        work=FenceWork(tasks=10),
        servers=[p.base for p in procs],
        started=started,
    )
    await fault
    print(
        f"{backend} http {report.name}: {report.operations} ops, {report.unknown} unknown, "
        f"{report.faults} faults, {report.counts}"
    )
    assert report.ok, report.anomalies
    counts = report.counts
    assert counts["done"] == counts["tasks"] == 10
    assert counts["reclaims"] >= 1 and counts["stale_rejected"] >= 1
    assert [f for _, f in procs[1].faults][-1:] == ["kill -9"] and procs[1].running


async def test_cursors_deliver_every_event_once_over_http(
    servers: tuple[str, str, list[ServerProcess]], tmp_path: Path
) -> None:
    backend, url, procs = servers
    started = asyncio.Event()
    fault = asyncio.create_task(_kill_and_restart(procs[0], started))
    # fewer consumer lives than through the library: each process start costs more
    # than the rest of the run
    report = await run_cursors(
        url,
        _room("cursors"),
        workers=2,
        seed=2,
        workdir=tmp_path,
        faults=True,
        work=CursorWork(events=20, kills=1),
        servers=[p.base for p in procs],
        started=started,
    )
    await fault
    print(
        f"{backend} http {report.name}: {report.operations} ops, {report.unknown} unknown, "
        f"{report.faults} faults, {report.counts}"
    )
    assert report.ok, report.anomalies
    assert report.counts["events"] == 21 and report.counts["kills"] >= 2
    assert procs[0].running


async def test_fences_and_cursors_hold_over_mcp_under_client_and_server_kills(
    servers: tuple[str, str, list[ServerProcess]], tmp_path: Path
) -> None:
    # both properties at once, to pay for the MCP worker processes' start-up once; a
    # server is killed while both run (not restarted: on a loaded machine a server's
    # start can take longer than the runs), and workers are killed too
    backend, url, procs = servers
    bases = [p.base for p in procs]
    fences_started, cursors_started = asyncio.Event(), asyncio.Event()
    both = asyncio.Event()

    async def when_both() -> None:
        await fences_started.wait()
        await cursors_started.wait()
        both.set()

    async def kill() -> None:
        await both.wait()
        await asyncio.sleep(0.5)
        procs[1].kill()

    fault = asyncio.gather(when_both(), kill())
    fences, cursors = await asyncio.gather(
        run_fences(
            url,
            _room("fences"),
            workers=2,
            seed=3,
            workdir=tmp_path / "fences",
            faults=True,
            work=FenceWork(tasks=4, ttl=0.4, stall=0.5),
            servers=bases,
            surface="mcp",
            started=fences_started,
        ),
        run_cursors(
            url,
            _room("cursors"),
            workers=1,
            seed=3,
            workdir=tmp_path / "cursors",
            faults=True,
            work=CursorWork(events=12, batch=3, kills=1),
            servers=bases,
            surface="mcp",
            started=cursors_started,
        ),
    )
    await fault
    for report in (fences, cursors):
        print(
            f"{backend} mcp {report.name}: {report.operations} ops, {report.unknown} unknown, "
            f"{report.faults} faults, {report.counts}"
        )
    assert fences.ok, fences.anomalies
    assert cursors.ok, cursors.anomalies
    assert fences.counts["done"] == fences.counts["tasks"] == 4
    assert fences.counts["stalls"] >= 1 and fences.faults >= 1
    # consumers were killed; each of the two agents got every event once, but those a
    # read whose answer was lost may have taken
    assert cursors.counts["events"] == 13 and cursors.counts["kills"] >= 1
    assert cursors.counts["delivered"] == 13 * 2 - cursors.counts["lost_to_unknown_reads"]
    assert [f for _, f in procs[1].faults][-1:] == ["kill -9"] and not procs[1].running


# ------------------------------------------------------------- the checkers flag


def _op(
    client: int, key: str, op: str, inp: Any, out: Any, call: int, ret: int | None
) -> Operation:
    return Operation(client, key, op, inp, out, call, ret)


def _grant(client: int, task: str, fence: int, call: int, ret: int) -> Operation:
    return _op(client, "plan", "claim", {}, {"task": task, "fence": fence}, call, ret)


def test_fences_checker_flags_a_stale_completion_that_was_accepted() -> None:
    good = [
        _grant(1, "t0", 1, 0, 10),
        _grant(2, "t0", 2, 50, 60),
        _op(
            1,
            "t0",
            "complete",
            {"fence": 1},
            {"ok": False, "error": "StaleFence", "current": 2},
            70,
            80,
        ),
        _op(2, "t0", "complete", {"fence": 2}, {"ok": True}, 90, 100),
    ]
    final = {"t0": {"status": "done", "fence": 2, "result": {"fence": 2, "by": 2}}}
    assert check_fences(good, final)[0] == []
    stale = [*good[:2], _op(1, "t0", "complete", {"fence": 1}, {"ok": True}, 70, 80)]
    found, _ = check_fences(
        stale, {"t0": {"status": "done", "fence": 2, "result": {"fence": 1, "by": 1}}}
    )
    assert any("stale fence 1 accepted" in a for a in found), found
    assert any("recorded under fence 2" in a for a in found), found
    # a stale attempt refused some other way than StaleFence, and a fence granted twice
    other = [
        *good[:2],
        _op(1, "t0", "complete", {"fence": 1}, {"ok": False, "error": "InvalidTransition"}, 70, 80),
        good[3],
    ]
    assert any("rejected with InvalidTransition" in a for a in check_fences(other, final)[0])
    twice = [_grant(1, "t0", 1, 0, 10), _grant(2, "t0", 1, 20, 30), good[3]]
    found, _ = check_fences(twice, final)
    assert any("share fence 1" in a for a in found) and any("after the grant" in a for a in found)


def _read(client: int, agent: str, seqs: list[int], call: int, ret: int) -> Operation:
    return _op(client, agent, "read", {"limit": 5}, {"seqs": seqs}, call, ret)


def _processed(client: int, agent: str, seq: int, t: int) -> Operation:
    return _op(client, agent, "process", {"seq": seq}, {}, t, t)


def _ack(
    client: int, agent: str, seq: int, position: int | None, call: int, ret: int | None
) -> Operation:
    out = None if position is None else {"position": position}
    return _op(client, agent, "ack", {"seq": seq}, out, call, ret)


def test_cursors_checker_flags_a_skipped_and_a_duplicated_event() -> None:
    # killed mid-ack of 2 (unknown outcome), so 2 may come again; then all acked
    good = [
        _read(1, "a", [1, 2], 0, 10),
        _processed(1, "a", 1, 11),
        _ack(1, "a", 1, 1, 12, 13),
        _processed(1, "a", 2, 14),
        _ack(1, "a", 2, None, 15, None),
        _read(2, "a", [2, 3], 30, 40),
        _processed(2, "a", 2, 41),
        _ack(2, "a", 2, 2, 42, 43),
        _processed(2, "a", 3, 44),
        _ack(2, "a", 3, 3, 45, 46),
    ]
    assert check_cursors(good, 3, {"a": 3})[0] == []
    # event 2 delivered again although its ack had been acknowledged
    dup = [*good[:4], _ack(1, "a", 2, 2, 15, 16), *good[5:]]
    found, _ = check_cursors(dup, 3, {"a": 3})
    assert any("delivered again after an ack of 2" in a for a in found), found
    # the second read starts after 3: event 2 skipped (its ack never asked for)
    skip = [
        *good[:3],
        _read(2, "a", [3], 30, 40),
        _processed(2, "a", 3, 44),
        _ack(2, "a", 3, 3, 45, 46),
    ]
    found, _ = check_cursors(skip, 3, {"a": 3})
    assert any("no ack had asked past 1" in a for a in found), found
    assert any("never processed events [2]" in a for a in found), found
    # a cursor that does not reach the end, and a gap inside one read
    assert any("cursor ends at 2" in a for a in check_cursors(good, 3, {"a": 2})[0])
    gap = [_read(1, "a", [1, 3], 0, 10)]
    assert any("not consecutive" in a for a in check_cursors(gap, 3, {"a": 3})[0])


def test_cursors_checker_with_the_auto_ack_flags_a_duplicate_and_a_loss() -> None:
    def read(client: int, seqs: list[int] | None, call: int, ret: int | None) -> Operation:
        out = None if seqs is None else {"seqs": seqs}
        return _op(client, "a", "read", {"limit": 5, "ack": "auto"}, out, call, ret)

    good = [read(1, [1, 2], 0, 10), read(1, [3], 20, 30), read(1, [], 40, 50)]
    assert check_cursors(good, 3, {"a": 3}, ack="auto")[0] == []
    # a read whose answer was lost may have taken event 3: at most once, allowed
    lost = [read(1, [1, 2], 0, 10), read(1, None, 20, None), read(2, [], 40, 50)]
    found, counts = check_cursors(lost, 3, {"a": 3}, ack="auto")
    assert found == [] and counts["lost_to_unknown_reads"] == 1
    # an event delivered twice, and one skipped with no lost read to explain it
    twice = [read(1, [1, 2], 0, 10), read(1, [2, 3], 20, 30)]
    found, _ = check_cursors(twice, 3, {"a": 3}, ack="auto")
    assert any("event 2 delivered 2 times" in a for a in found), found
    skipped = [read(1, [1], 0, 10), read(1, [3], 20, 30)]
    found, _ = check_cursors(skipped, 3, {"a": 3}, ack="auto")
    assert any("started after 2, where no read ended" in a for a in found), found
    assert any("events [2] never delivered" in a for a in found), found


def test_outbox_checker_flags_a_double_performance() -> None:
    claim = _op(1, "outbox", "claim", None, {"effect": "e0", "fence": 1}, 0, 10)
    killed = [claim, _op(1, "e0", "record", {"fence": 1}, None, 11, None)]
    check = _op(9, "e0", "check", {"fence": 2}, {"found": 1}, 100, 101)
    final = {"e0": {"status": "succeeded", "fence": 2}}
    # performed once by the killed holder, found by the reconciler's check: reconciled
    assert check_outbox([*killed, check], final, [("e0", 1, 1, 20)])[0] == []
    # performed again after the check had seen it (or with no check at all)
    twice = [("e0", 1, 1, 20), ("e0", 3, 2, 200)]
    found, _ = check_outbox([*killed, check], final, twice)
    assert any("no reconciliation between" in a for a in found), found
    # the same fence performing twice, and a claim left unrecorded and never reconciled
    found, _ = check_outbox(killed, final, [("e0", 1, 1, 20), ("e0", 1, 1, 30)])
    assert any("2 times under fence 1" in a for a in found), found
    assert any("never recorded nor reconciled" in a for a in found), found
    # a check that looked before the first performance landed explains a second one
    blind = _op(9, "e0", "check", {"fence": 2}, {"found": 0}, 15, 16)
    assert check_outbox([*killed, blind], final, [("e0", 1, 1, 20), ("e0", 3, 2, 200)])[0] == []
    assert any(
        "not succeeded" in a
        for a in check_outbox(
            [*killed, check], {"e0": {"status": "pending", "fence": 2}}, [("e0", 1, 1, 20)]
        )[0]
    )


class AcceptsStaleFences:
    """A broken plan: a completion refused with ``StaleFence`` is sent again under the
    task's current fence, so a late holder's result is recorded."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    async def claim_next(self, agent: str, *, ttl: float) -> Lease | None:
        return await self.plan.claim_next(agent, ttl=ttl)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        return await self.plan.renew(lease, ttl)

    async def complete(self, lease: Lease, result: JSON = None) -> object:
        try:
            return await self.plan.complete(lease, result)
        except StaleFence:
            task = await self.plan.get(lease.task_id)
            if task.owner is None:
                raise
            forged = dataclasses.replace(lease, agent=task.owner, fence=task.fence)
            return await self.plan.complete(forged, result)

    async def tasks(self) -> list[Task]:
        return await self.plan.tasks()


async def test_fences_recorder_and_checker_flag_a_plan_that_accepts_stale_fences(
    tmp_path: Path,
) -> None:
    store = await open_store("memory://")
    try:
        room = await Rooms(store).create(_room("broken"))
        await room.plan.add([TaskSpec(f"t{i}", max_attempts=1000) for i in range(12)])
        work = FenceWork(tasks=12, stall=0.5)
        journals = [Journal(tmp_path / f"{c}.jsonl", c) for c in range(3)]
        await asyncio.gather(
            *(
                fence_worker(AcceptsStaleFences(room.plan), j, random.Random(j.client), work)
                for j in journals
            )
        )
        for j in journals:
            j.close()
        ops = load_journals([tmp_path / f"{c}.jsonl" for c in range(3)])
        final = {
            t.id: {"status": t.status, "fence": t.fence, "result": t.result}
            for t in await room.plan.tasks()
        }
    finally:
        await store.close()
    found, counts = check_fences(ops, final)
    assert any("stale fence" in a and "accepted" in a for a in found), (found, counts)


# ------------------------------------------------------------- on demand


def _table(output: str) -> dict[str, str]:
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


def test_the_command_line_runs_a_property_and_prints_its_summary(tmp_path: Path) -> None:
    args = ["torture", "--property", "cursors", "--backend", "memory", "--histories", "2"]
    result = CliRunner().invoke(app, [*args, "--seed", "7", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    rows = _table(result.output)
    assert rows["runs"] == "2" and rows["anomalies"] == "0" and rows["failing runs saved"] == "0"
    assert int(rows["operations"]) > 0 and int(rows["faults injected"]) > 0
    assert rows["cursors: events"] == str(2 * 31)
    assert f"saved to {tmp_path / 'out'}" in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--property", "outbox", "--backend", "sqlite", "--surface", "http"], "library only"),
        (["--property", "outbox", "--backend", "sqlite", "--surface", "mcp"], "library only"),
        (["--property", "fences", "--backend", "memory", "--surface", "mcp"], "one process"),
        (["--property", "leases", "--backend", "memory"], "unknown property"),
        (["--property", "fences", "--backend", "memory", "--broken", "stale-reads"], "--broken"),
    ],
)
def test_a_property_run_that_cannot_be_done_exits_2_and_says_why(
    args: list[str], says: str
) -> None:
    result = CliRunner().invoke(app, ["torture", *args, "--histories", "1"])
    assert result.exit_code == 2, result.output
    assert says in result.output
