"""The outbox: each effect is performed once, or reconciled.

The run requests effects; performer processes (tasks on ``memory://``) claim and
perform them with :class:`~agentrooms.effects.Worker`, and the run's own
:class:`~agentrooms.effects.Reconciler` settles what they leave. The external system
is a sink, a SQLite file of the run: performing an effect inserts one row (its id, the
idempotency key; the fence; the performer; the time). The sink does not deduplicate, so
every performance is counted; the reconciler's check asks it whether the id is there.
A performer's life may end (``kill -9`` of its own process) at one seeded point: after
its claim and before the call, or after the call and before recording it. Journal:
``claim`` (the fence), ``perform`` (call line before the sink insert), ``record`` (the
status recorded, or ``StaleFence``), ``kill``, and the reconciler's ``check`` (rows
found).

:func:`check_outbox` asserts: every effect ended ``succeeded``, with at least one
performance; no effect was performed twice under one fence, and a second performance
only where a reconciler's check began before the earlier one reached the sink (the
documented at-least-once window, reconciled); every claim whose holder did not record
its outcome was followed by a reconciler's check of that effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import random
import signal
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrooms.effects import SUCCEEDED, TERMINAL, Effect, Outbox, Outcome, Reconciler, Worker
from agentrooms.errors import StaleFence, StoreUnavailable
from agentrooms.reliability.history import Operation
from agentrooms.reliability.properties.common import (
    INCARNATIONS,
    Closer,
    Journal,
    Processes,
    PropertyReport,
    die_at,
    kill_point,
    life,
    load_journals,
    prepare,
    settled,
    supervised,
    task_life,
    touch,
    worker_main,
    worker_process,
)
from agentrooms.rooms import Rooms
from agentrooms.store import open_store
from agentrooms.store.types import JSON

__all__ = ["OutboxWork", "Sink", "check_outbox", "run_outbox"]

POINTS = ("before_call", "after_call")
RECONCILER = INCARNATIONS * 1000  # the reconciler's client id in the journal


@dataclass(frozen=True, slots=True)
class OutboxWork:
    """``effects`` requested; performers hold leases of ``ttl`` seconds (renewed while
    they perform); the first ``kills`` lives of each performer end at a seeded point.
    With kills, and processes, the first performer's first life stops itself (SIGSTOP)
    before its first call, and the run resumes it ``stop_for`` seconds later: its lease
    has lapsed, the effect was taken over, and its late call is a second performance."""

    effects: int = 16
    ttl: float = 0.4
    kills: int = 2
    stop_for: float = 1.5


class Sink:
    """The external system: a SQLite file with one row per performance."""

    def __init__(self, path: str | Path) -> None:
        self.db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS performed"
            " (key TEXT, fence INTEGER, client INTEGER, t INTEGER)"
        )

    def perform(self, key: str, fence: int, client: int) -> None:
        self.db.execute(
            "INSERT INTO performed VALUES (?, ?, ?, ?)", (key, fence, client, time.monotonic_ns())
        )

    def found(self, key: str) -> int:
        row = self.db.execute("SELECT count(*) FROM performed WHERE key = ?", (key,)).fetchone()
        return int(row[0])

    def rows(self) -> list[tuple[str, int, int, int]]:
        return [
            tuple(r)
            for r in self.db.execute("SELECT key, fence, client, t FROM performed ORDER BY t")
        ]

    def close(self) -> None:
        self.db.close()


async def performer(
    outbox: Outbox,
    sink: Sink,
    journal: Journal,
    work: OutboxWork,
    kill_at: tuple[int, str] | None,
    stopped: Callable[[], bool],
    in_process: bool,
) -> None:
    """Claim, perform and record effects until the run says stop; ``kill_at``: (the
    how-many-th effect this life handles, the point) to die at."""
    handled = 0

    async def handler(effect: Effect) -> JSON:
        here = kill_at[1] if kill_at is not None and kill_at[0] == handled else None
        if here == "before_call":
            die_at(journal, effect.id, here, in_process)
        if here == "stop_before_call" and not in_process:
            journal.note("stop", effect.id, {"fence": effect.fence})
            os.kill(os.getpid(), signal.SIGSTOP)  # the run sends SIGCONT, leases later
        n = journal.call("perform", effect.id, {"fence": effect.fence})
        sink.perform(effect.id, effect.fence, journal.client)
        journal.ret(n, {})
        if here == "after_call":
            die_at(journal, effect.id, here, in_process)
        return {"sink": journal.client}

    worker = Worker(outbox, handler, name=f"p{journal.client}", lease_ttl=work.ttl)
    while not stopped():
        n = journal.call("claim", "outbox")
        try:
            effect = await worker.claim()
        except StoreUnavailable:
            continue
        journal.ret(
            n,
            {
                "effect": None if effect is None else effect.id,
                "fence": None if effect is None else effect.fence,
            },
        )
        if effect is None:
            await asyncio.sleep(0.02)
            continue
        n = journal.call("record", effect.id, {"fence": effect.fence})
        try:
            recorded = await worker.perform(effect)
        except StaleFence:
            journal.ret(n, {"error": "StaleFence"})
        except StoreUnavailable:
            pass
        else:
            journal.ret(n, {"status": recorded.status})
        handled += 1


def check_outbox(
    ops: list[Operation],
    final: dict[str, dict[str, Any]],
    performed: list[tuple[str, int, int, int]],
) -> tuple[list[str], dict[str, int]]:
    """The anomalies of an outbox history (``final``: each effect's ``status`` at the
    end; ``performed``: the sink's rows, (key, fence, client, time)), and counts."""
    found: list[str] = []
    rows: dict[str, list[tuple[str, int, int, int]]] = defaultdict(list)
    for row in sorted(performed, key=lambda r: r[3]):
        rows[row[0]].append(row)
    checks: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        if op.op == "check":
            checks[op.key].append(op)
    counts: Counter[str] = Counter(
        {"reconciled": 0, "unrecorded_claims": 0, "performed_twice_reconciled": 0}
    )
    for key, state in final.items():
        done = rows.get(key, [])
        if state["status"] != SUCCEEDED:
            found.append(f"effect {key} ended {state['status']}, not succeeded")
        if not done:
            found.append(f"effect {key} ended {state['status']} without being performed")
        fences = Counter(r[1] for r in done)
        found.extend(
            f"effect {key} was performed {k} times under fence {f}"
            for f, k in fences.items()
            if k > 1
        )
        for before, again in itertools.pairwise(done):
            blind = [c for c in checks[key] if c.output == {"found": 0} and c.call < before[3]]
            if not blind:
                found.append(
                    f"effect {key} was performed again (fence {again[1]}) after fence "
                    f"{before[1]} had performed it, with no reconciliation between"
                )
            else:
                counts["performed_twice_reconciled"] += 1
        counts["reconciled"] += bool(checks[key])
    claims = [op for op in ops if op.op == "claim" and not op.unknown and op.output["effect"]]
    records = [op for op in ops if op.op == "record" and not op.unknown]
    for claim in claims:
        key, fence = claim.output["effect"], claim.output["fence"]
        if any(r.key == key and r.input["fence"] == fence for r in records):
            continue
        counts["unrecorded_claims"] += 1
        if not any(c.call > claim.call for c in checks[key]):
            found.append(
                f"effect {key}: the claim of fence {fence} was never recorded nor reconciled"
            )
    counts["effects"] = len(final)
    counts["performances"] = len(performed)
    counts["claims"] = len(claims)
    counts["stale_records"] = sum(r.output.get("error") == "StaleFence" for r in records)
    counts["kills"] = sum(op.op == "kill" for op in ops)
    counts["stops"] = sum(op.op == "stop" for op in ops)
    return found, dict(counts)


async def run_outbox(
    url: str,
    room: str,
    *,
    workers: int,
    seed: int,
    workdir: Path,
    faults: bool,
    work: OutboxWork | None = None,
    started: asyncio.Event | None = None,
) -> PropertyReport:
    """Record and check one outbox history on the store at ``url`` (room ``room`` is
    created): ``workers`` performers (processes, or tasks for ``memory://``) and a
    reconciler in this process; ``faults`` kills performers mid-effect. ``started`` is
    set once the performers run (for a caller that times faults of its own)."""
    work = work or OutboxWork()
    if not faults:
        work = dataclasses.replace(work, kills=0)
    in_process = prepare(url, workdir)
    stop_file = workdir / f"{room}.stop"
    sink_path = workdir / f"{room}.sink.db"
    sink = Sink(sink_path)
    store = await open_store(url)
    paths: list[Path] = [workdir / f"outbox-{RECONCILER}.jsonl"]
    try:
        outbox = Outbox(await Rooms(store).create(room))
        for i in range(work.effects):
            await outbox.request(f"e{i}", "call", {"i": i}, max_attempts=100)
        procs = Processes(MODULE, workdir)

        async def body(slot: int, incarnation: int) -> bool:
            client, path = life(workdir, "outbox", slot, incarnation)
            paths.append(path)
            rng = random.Random(f"{seed}/{client}")
            kill_at = None
            if incarnation < work.kills:
                kill_at = (rng.randrange(work.effects // workers + 1), rng.choice(POINTS))
            if work.kills and not in_process and slot == incarnation == 0:
                kill_at = (0, "stop_before_call")  # a holder paused past its lease
            if not in_process:
                spec = {
                    "url": url,
                    "room": room,
                    "client": client,
                    "out": str(path),
                    "sink": str(sink_path),
                    "kill_at": kill_at,
                    "stop": str(stop_file),
                    "work": dataclasses.asdict(work),
                }
                return await procs.run(slot, spec)
            return await task_life(
                path,
                client,
                lambda journal: performer(
                    outbox, sink, journal, work, kill_at, stop_file.exists, True
                ),
            )

        async with supervised(workers, body, None if in_process else procs, started) as run:
            await _drive(outbox, sink, Journal(paths[0], RECONCILER), work, run, procs, stop_file)
        ops = load_journals(paths)
        effects = await settled(outbox.effects)
        final = {e.id: {"status": e.status, "fence": e.fence} for e in effects}
        anomalies, counts = check_outbox(ops, final, sink.rows())
    finally:
        await store.close()
        sink.close()
    return PropertyReport(
        "outbox",
        len(ops),
        sum(op.unknown for op in ops),
        anomalies,
        counts["kills"] + counts["stops"],
        counts,
    )


async def _drive(
    outbox: Outbox,
    sink: Sink,
    journal: Journal,
    work: OutboxWork,
    run: asyncio.Task[None],
    procs: Processes,
    stop_file: Path,
) -> None:
    """Reconcile until every effect is terminal, then tell the performers to stop and
    wait for them (resuming a stopped one)."""
    await _reconcile(outbox, sink, journal, work, run, procs)
    touch(stop_file)
    while not run.done():  # a stopped performer has yet to finish its call
        await _tick(run, procs, work)
    await run


async def _tick(run: asyncio.Task[None], procs: Processes, work: OutboxWork) -> None:
    """Resume a performer stopped for ``work.stop_for`` seconds, then wait a moment for
    the performers to end."""
    procs.resume_stopped(work.stop_for)
    await asyncio.wait([run], timeout=0.05)


async def _reconcile(
    outbox: Outbox,
    sink: Sink,
    journal: Journal,
    work: OutboxWork,
    run: asyncio.Task[None],
    procs: Processes,
) -> None:
    """Settle what performers leave until every effect is terminal (or the performers
    failed: their error is raised by ``run``); resume a performer that stopped itself
    once it has been stopped ``work.stop_for`` seconds."""

    async def check(effect: Effect) -> Outcome:
        n = journal.call("check", effect.id, {"fence": effect.fence})
        rows = sink.found(effect.id)
        journal.ret(n, {"found": min(rows, 1)})
        return Outcome.applied({"sink": "found"}) if rows else Outcome.not_applied()

    reconciler = Reconciler(outbox, check, lease_ttl=max(2.0, work.ttl * 4), unknown_after=0.0)
    try:
        while not run.done():
            with contextlib.suppress(StoreUnavailable):
                await reconciler.run_once()
                if all(e.status in TERMINAL for e in await outbox.effects()):
                    return
            await _tick(run, procs, work)
        run.result()
    finally:
        journal.close()


async def _connect(spec: dict[str, Any]) -> tuple[tuple[Outbox, Sink], list[Closer]]:
    """What a performer process uses: the room's outbox through its own store, and the
    sink."""
    store = await open_store(spec["url"])
    sink = Sink(spec["sink"])

    async def close_sink() -> None:
        sink.close()

    return (Outbox(Rooms(store).room(spec["room"])), sink), [close_sink, store.close]


async def _performer_process(spec: dict[str, Any]) -> None:
    stop = Path(spec["stop"])
    work, kill_at = OutboxWork(**spec["work"]), kill_point(spec)
    await worker_process(
        spec,
        _connect,
        lambda used, journal: performer(
            used[0], used[1], journal, work, kill_at, stop.exists, False
        ),
    )


MODULE = "agentrooms.reliability.properties.outbox"


def main(argv: Sequence[str] | None = None) -> None:
    """One performer: ``python -m agentrooms.reliability.properties.outbox SPEC``."""
    worker_main(MODULE, "performer", _performer_process, argv)


if __name__ == "__main__":
    main()
