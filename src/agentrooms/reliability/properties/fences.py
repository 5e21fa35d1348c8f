"""Fences: a task's result is never recorded under a stale fence.

A plan of independent tasks; workers ``claim_next`` with short leases, sometimes renew,
sometimes stall past their lease (a sleep; for worker processes also SIGSTOP from the
run, or ``kill -9`` and a restart), then complete with the fence they were granted.
Journal: every grant (``claim``: task, fence), every ``renew`` and ``complete`` attempt
(its fence; accepted, or the rejection's type), every ``stall``. The run ends when every
task is done; the final tasks are read once more.

:func:`check_fences` asserts, per task: no two grants share a fence; a grant
acknowledged before another was called has the smaller fence; an accepted renew or
completion carried the fence of the latest grant acknowledged before it was called (a
stale one is rejected, with ``StaleFence`` and nothing else); at most one completion
is accepted, and the task ends done with the result and fence of that completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import signal
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentrooms.errors import InvalidTransition, StaleFence
from agentrooms.reliability.history import Operation
from agentrooms.reliability.properties.common import (
    UNKNOWN,
    Closer,
    Journal,
    Processes,
    PropertyReport,
    life,
    load_journals,
    prepare,
    settled,
    supervised,
    surface_of,
    task_life,
    worker_main,
    worker_process,
)
from agentrooms.reliability.properties.http import HttpPlan
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.rooms.plan import DONE, Lease
from agentrooms.store import Store, open_store
from agentrooms.store.types import JSON

__all__ = ["FenceWork", "check_fences", "run_fences"]


@dataclass(frozen=True, slots=True)
class FenceWork:
    """``tasks`` in the plan; leases of ``ttl`` seconds; each lease is renewed once with
    probability ``renew`` and its holder stalls ``stall_for`` (times ``ttl``, drawn
    uniformly) before completing with probability ``stall``."""

    tasks: int = 16
    ttl: float = 0.15
    renew: float = 0.3
    stall: float = 0.35
    stall_for: tuple[float, float] = (2.5, 5.0)


class HasStatus(Protocol):
    @property
    def status(self) -> str: ...


class PlanCalls(Protocol):
    """What a worker calls: :class:`~agentrooms.rooms.plan.Plan`, or
    :class:`~agentrooms.reliability.properties.http.HttpPlan` over HTTP."""

    async def claim_next(self, agent: str, *, ttl: float) -> Lease | None: ...

    async def renew(self, lease: Lease, ttl: float) -> Lease: ...

    async def complete(self, lease: Lease, result: JSON = None) -> object: ...

    async def tasks(self) -> Sequence[HasStatus]: ...


async def fence_worker(
    plan: PlanCalls, journal: Journal, rng: random.Random, work: FenceWork
) -> None:
    """Claim and complete tasks until every task of the plan is done."""
    agent = f"w{journal.client}"
    while True:
        n = journal.call("claim", "plan", {"agent": agent, "ttl": work.ttl})
        try:
            lease = await plan.claim_next(agent, ttl=work.ttl)
        except UNKNOWN:
            continue  # unknown outcome: the call line stays without a return
        if lease is None:
            journal.ret(n, {"task": None})
            with contextlib.suppress(*UNKNOWN):
                if all(t.status == DONE for t in await plan.tasks()):
                    return
            await asyncio.sleep(work.ttl / 3)
            continue
        journal.ret(n, {"task": lease.task_id, "fence": lease.fence})
        if rng.random() < work.renew:
            renewed = await _attempt(plan, journal, "renew", lease, work.ttl)
            lease = renewed or lease
        if rng.random() < work.stall:
            pause = work.ttl * rng.uniform(*work.stall_for)
            journal.note("stall", lease.task_id, {"fence": lease.fence, "seconds": pause})
            await asyncio.sleep(pause)
        await _attempt(plan, journal, "complete", lease, work.ttl)


async def _attempt(
    plan: PlanCalls, journal: Journal, op: str, lease: Lease, ttl: float
) -> Lease | None:
    """One renew or complete with ``lease``'s fence, recorded; the renewed lease."""
    n = journal.call(op, lease.task_id, {"fence": lease.fence})
    try:
        if op == "renew":
            renewed = await plan.renew(lease, ttl)
        else:
            await plan.complete(lease, {"fence": lease.fence, "by": journal.client})
            renewed = None
    except (StaleFence, InvalidTransition) as exc:
        current = exc.current if isinstance(exc, StaleFence) else None
        journal.ret(n, {"ok": False, "error": type(exc).__name__, "current": current})
        return None
    except UNKNOWN:
        return None  # unknown outcome
    journal.ret(n, {"ok": True})
    return renewed


def check_fences(
    ops: list[Operation], final: dict[str, dict[str, Any]]
) -> tuple[list[str], dict[str, int]]:
    """The anomalies of a fences history (``final``: each task's ``status``, ``fence``
    and ``result`` at the end), and counts of what it did."""
    grants: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        if op.op == "claim" and not op.unknown and op.output["task"] is not None:
            grants[op.output["task"]].append(op)
    counts: Counter[str] = Counter({"stale_rejected": 0})
    found = _grant_anomalies(grants)
    accepted = _attempt_anomalies(ops, grants, found, counts)
    for task, state in final.items():
        found.extend(_final_anomalies(ops, task, state, accepted.get(task, []), grants[task]))
    counts["tasks"] = len(final)
    counts["done"] = sum(state["status"] == DONE for state in final.values())
    # done by a completion whose answer was lost (a killed worker or server): the task
    # is done once all the same, but no accepted completion shows it
    counts["done_unanswered"] = sum(
        state["status"] == DONE and not accepted.get(task) for task, state in final.items()
    )
    counts["grants"] = sum(len(g) for g in grants.values())
    counts["reclaims"] = sum(1 for g in grants.values() for op in g if op.output["fence"] > 1)
    counts["accepted"] = sum(len(a) for a in accepted.values())
    counts["stalls"] = sum(op.op == "stall" for op in ops)
    return found, dict(counts)


def _grant_anomalies(grants: dict[str, list[Operation]]) -> list[str]:
    """No two grants of a task share a fence; fences grow in real-time order."""
    found: list[str] = []
    for task, got in grants.items():
        fences = Counter(op.output["fence"] for op in got)
        found.extend(f"task {task}: {k} grants share fence {f}" for f, k in fences.items() if k > 1)
        for a in got:
            for b in got:
                if a.ret is not None and a.ret < b.call and a.output["fence"] >= b.output["fence"]:
                    found.append(
                        f"task {task}: grant of fence {b.output['fence']} came after the "
                        f"grant of fence {a.output['fence']} was acknowledged"
                    )
    return found


def _attempt_anomalies(
    ops: list[Operation],
    grants: dict[str, list[Operation]],
    found: list[str],
    counts: Counter[str],
) -> dict[str, list[Operation]]:
    """Renews and completions: an accepted one was not stale, a refused one was refused
    with ``StaleFence``. Adds to ``found`` and ``counts``; the accepted completions."""
    granted = {
        (op.client, op.output["task"], op.output["fence"]) for g in grants.values() for op in g
    }
    accepted: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        if op.op not in ("renew", "complete"):
            continue
        counts[f"{op.op}_attempts"] += 1
        if op.unknown:
            continue
        task, fence = op.key, op.input["fence"]
        if (op.client, task, fence) not in granted:
            found.append(f"client {op.client} used fence {fence} on {task}, never granted to it")
        newer = [
            g.output["fence"]
            for g in grants[task]
            if g.ret is not None and g.ret < op.call and g.output["fence"] > fence
        ]
        if op.output["ok"]:
            if newer:
                found.append(
                    f"task {task}: {op.op} with stale fence {fence} accepted after fence "
                    f"{max(newer)} was granted"
                )
            if op.op == "complete":
                accepted[task].append(op)
        elif op.output["error"] != "StaleFence":
            found.append(
                f"task {task}: {op.op} with fence {fence} rejected with {op.output['error']}"
            )
        else:
            counts["stale_rejected"] += 1
            current = op.output.get("current")
            if current is not None and current <= fence:
                found.append(f"task {task}: fence {fence} refused as stale, current {current}")
    return accepted


def _final_anomalies(
    ops: list[Operation],
    task: str,
    state: dict[str, Any],
    done: list[Operation],
    grants: list[Operation],
) -> list[str]:
    """The task ended done once, with the result and fence of its one completion, and
    was not granted after it."""
    found: list[str] = []
    if len(done) > 1:
        found.append(f"task {task} was completed {len(done)} times")
    if state["status"] != DONE:
        return [*found, f"task {task} ended {state['status']}, not done"]
    result = state["result"]
    if not isinstance(result, dict) or result.get("fence") != state["fence"]:
        return [*found, f"task {task}: result {result!r} recorded under fence {state['fence']}"]
    if not any(
        op.op == "complete"
        and op.key == task
        and op.input["fence"] == result["fence"]
        and op.client == result["by"]
        and (op.unknown or op.output["ok"])
        for op in ops
    ):
        found.append(f"task {task}: result {result!r} matches no accepted completion")
    late = [g for g in grants for op in done if op.ret is not None and g.call > op.ret]
    found.extend(
        f"task {task}: granted (fence {g.output['fence']}) after it was done" for g in late
    )
    return found


async def _final(store: Store, room: str) -> dict[str, dict[str, Any]]:
    tasks = await Rooms(store).room(room).plan.tasks()
    return {t.id: {"status": t.status, "fence": t.fence, "result": t.result} for t in tasks}


async def run_fences(
    url: str,
    room: str,
    *,
    workers: int,
    seed: int,
    workdir: Path,
    faults: bool,
    work: FenceWork | None = None,
    servers: Sequence[str] = (),
    surface: str | None = None,
    started: asyncio.Event | None = None,
) -> PropertyReport:
    """Record and check one fences history on the store at ``url`` (room ``room`` is
    created). Worker processes, or tasks for ``memory://``; ``faults`` adds stalls past
    the lease (and, for processes, SIGSTOP / SIGCONT and ``kill -9`` with a restart).
    With ``servers`` (the bases of ``agentrooms serve --dev`` processes on ``url``) the
    workers go through ``surface`` (:func:`~.common.surface_of`): the HTTP API, each
    request to a random server, or MCP, one session per worker life. ``started`` is
    set once the workers run (for a caller that times faults of its own).
    ``ValueError`` for a surface that cannot be run as asked."""
    work = work or FenceWork()
    if not faults:
        work = dataclasses.replace(work, stall=0.0)
    in_process = prepare(url, workdir, servers)
    surface = surface_of(servers, surface)
    store = await open_store(url)
    injected = 0
    try:
        created = await Rooms(store).create(room)
        specs = [TaskSpec(f"t{i}", max_attempts=1000) for i in range(work.tasks)]
        await created.plan.add(specs)
        paths: list[Path] = []
        if in_process:

            async def task_body(slot: int, incarnation: int) -> bool:
                client, path = life(workdir, "fences", slot, incarnation)
                paths.append(path)
                plan = Rooms(store).room(room).plan
                rng = random.Random(f"{seed}/{client}")
                return await task_life(
                    path, client, lambda journal: fence_worker(plan, journal, rng, work)
                )

            async with supervised(workers, task_body, None, started) as run:
                await run
        else:
            spec = {
                "url": url,
                "room": room,
                "seed": seed,
                "servers": list(servers),
                "surface": surface,
            }
            injected = await _processes(spec, workers, workdir, faults, work, paths, started)
        ops = load_journals(paths)
        anomalies, counts = check_fences(ops, await settled(lambda: _final(store, room)))
    finally:
        await store.close()
    injected += counts.get("stalls", 0)
    return PropertyReport(
        "fences", len(ops), sum(op.unknown for op in ops), anomalies, injected, counts
    )


async def _processes(
    spec: dict[str, Any],
    workers: int,
    workdir: Path,
    faults: bool,
    work: FenceWork,
    paths: list[Path],
    started: asyncio.Event | None,
) -> int:
    """Run the workers as processes (``spec``: what they share), faulted by
    :func:`_inject` with ``faults``; the faults injected. Each life's journal is
    added to ``paths``."""
    procs = Processes(MODULE, workdir)

    async def body(slot: int, incarnation: int) -> bool:
        client, path = life(workdir, "fences", slot, incarnation)
        paths.append(path)
        mine = {**spec, "client": client, "out": str(path), "work": dataclasses.asdict(work)}
        return await procs.run(slot, mine)

    injected = 0
    async with supervised(workers, body, procs, started) as run:
        if faults:
            rng = random.Random(f"{spec['seed']}/faults")
            injected = await _inject(run, procs, workers, rng, work)
        await run
    return injected


async def _inject(
    run: asyncio.Task[None], procs: Processes, workers: int, rng: random.Random, work: FenceWork
) -> int:
    """SIGSTOP a random working worker (one that has opened what it calls) past its
    lease and SIGCONT it, now and then ``kill -9`` one instead (at most twice per
    worker in all, so that a worker slow to start still gets to finish), until the run
    ends; the number of faults."""
    injected = kills = 0
    while not run.done():
        await asyncio.wait([run], timeout=rng.uniform(0.2, 0.6))
        slot = rng.randrange(workers)
        if run.done() or not procs.working(slot):
            continue
        if rng.random() < 0.25:
            if kills < 2 * workers and procs.signal(slot, signal.SIGKILL):
                injected, kills = injected + 1, kills + 1
            continue
        if procs.signal(slot, signal.SIGSTOP):
            injected += 1
            try:
                await asyncio.sleep(work.ttl * rng.uniform(2.0, 4.0))
            finally:
                procs.signal(slot, signal.SIGCONT)
    return injected


async def _connect(spec: dict[str, Any]) -> tuple[PlanCalls, list[Closer]]:
    """What a worker process calls: the plan over HTTP or MCP, or through its own
    store."""
    if spec["surface"] == "mcp":
        from agentrooms.reliability.properties.mcp import McpPlan  # the MCP SDK: slow

        agent = f"w{spec['client']}"  # the agent fence_worker claims as
        mcp = McpPlan(spec["servers"], spec["room"], agent, seed=spec["client"])
        return mcp, [mcp.close]
    if spec["surface"] == "http":
        http = HttpPlan(spec["servers"], spec["room"], seed=spec["client"])
        return http, [http.close]
    store = await open_store(spec["url"])
    return Rooms(store).room(spec["room"]).plan, [store.close]


async def _worker_process(spec: dict[str, Any]) -> None:
    fields = spec["work"]
    work = FenceWork(**{**fields, "stall_for": tuple(fields["stall_for"])})
    rng = random.Random(f"{spec['seed']}/{spec['client']}")
    await worker_process(
        spec, _connect, lambda plan, journal: fence_worker(plan, journal, rng, work)
    )


MODULE = "agentrooms.reliability.properties.fences"


def main(argv: Sequence[str] | None = None) -> None:
    """One fences worker: ``python -m agentrooms.reliability.properties.fences SPEC``."""
    worker_main(MODULE, "worker", _worker_process, argv)


if __name__ == "__main__":
    main()
