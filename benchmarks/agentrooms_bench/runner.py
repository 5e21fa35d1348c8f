"""Running cells: warm-up, closed loop (throughput), open loop (latency), loss check.

A **cell** is one policy at one writer count and one think time on one backend, one
repetition. Each cell uses a fresh room and runs:

1. **warm-up** (closed loop, not measured; its updates are still checked);
2. **closed loop** for ``duration`` seconds: every agent makes updates back to back.
   Goodput = acked updates / elapsed time (the tail of the operations in flight at the
   deadline included). Rejection rate and attempts per update come from this phase;
3. **open loop** for ``open_duration`` seconds at a fixed arrival rate (``--rate``, or
   ``--load`` times this cell's closed-loop goodput): arrival *k* is scheduled at
   ``t0 + k / rate`` by the clock and taken by the next free agent; its latency is
   measured from the *scheduled* time, so a slow operation delays the arrivals behind it
   and that wait is counted (no coordinated omission). Arrivals not started within
   ``open_duration`` after the phase ended are recorded as ``missed``;
4. the **loss check**: the state is read back and compared, per agent, with what was
   acked (:mod:`.scenarios`). A cell that lost or duplicated an update fails the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from agentrooms.reliability.stores import Target
from agentrooms_bench.records import OpRecord
from agentrooms_bench.scenarios import (
    Applied,
    CellEnv,
    Op,
    Outcome,
    Scenario,
    make_scenario,
    uses_store,
)

__all__ = ["CellSpec", "Ledger", "Settings", "run_cell", "summarize", "verify"]


@dataclass(frozen=True)
class Settings:
    policies: tuple[str, ...]
    writers: tuple[int, ...]
    think_ms: tuple[float, ...]
    repetitions: int = 3
    duration: float = 3.0
    open_duration: float = 3.0
    warmup: float = 0.5
    load: float = 0.5
    rate: float | None = None
    budget: float = 10.0
    lock_agents: int = 48
    peers: bool = True
    quick: bool = False

    def signature(self) -> dict[str, Any]:
        """What gives a cell's numbers their meaning: a rerun into the same directory
        must use the same, or finished cells would mix two experiments."""
        keep = ("duration", "open_duration", "warmup", "load", "rate", "budget", "lock_agents")
        return {k: v for k, v in asdict(self).items() if k in keep}


@dataclass(frozen=True)
class CellSpec:
    backend: str
    policy: str
    writers: int
    think_ms: float
    rep: int

    @property
    def id(self) -> str:
        return f"{self.backend}/{self.policy}/w{self.writers}/t{self.think_ms:g}ms/r{self.rep}"


@dataclass
class Ledger:
    """What each agent was told: acked updates and ones whose outcome is unknown."""

    agents: int
    acked: list[int] = field(default_factory=list)
    doubt: list[int] = field(default_factory=list)
    acked_ids: set[str] = field(default_factory=set)
    doubt_ids: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.acked = [0] * self.agents
        self.doubt = [0] * self.agents

    def add(self, agent: int, op_id: str, outcome: Outcome) -> None:
        if outcome.outcome == "ok":
            self.acked[agent] += 1
            self.acked_ids.add(op_id)
        elif outcome.doubt:
            self.doubt[agent] += 1
            self.doubt_ids.add(op_id)


def verify(ledger: Ledger, applied: Applied) -> dict[str, Any]:
    """Lost and duplicated updates, from the state read back against the ledger."""
    lost = duplicated = 0
    if applied.ids is not None:
        found = set(applied.ids)
        lost = len(ledger.acked_ids - found)
        duplicated = sum(n - 1 for n in applied.ids.values() if n > 1)
        duplicated += len(found - ledger.acked_ids - ledger.doubt_ids)
        total = sum(applied.ids.values())
    else:
        counts = applied.counts or {}
        for agent in set(counts) | set(range(ledger.agents)):
            if agent >= ledger.agents:
                duplicated += counts[agent]  # an update by nobody
                continue
            have, acked, doubt = counts.get(agent, 0), ledger.acked[agent], ledger.doubt[agent]
            lost += max(0, acked - have)
            duplicated += max(0, have - acked - doubt)
        total = sum(counts.values())
    return {
        "acked": sum(ledger.acked),
        "in_doubt": sum(ledger.doubt),
        "applied": total,
        "lost": lost + len(applied.problems),
        "duplicated": duplicated,
        "problems": applied.problems[:5],
    }


def _pct(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def jain(counts: list[int]) -> float | None:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2); 1 when all equal."""
    squares = sum(x * x for x in counts)
    return sum(counts) ** 2 / (len(counts) * squares) if squares else None


def summarize(records: list[OpRecord], elapsed: float, agents: int = 0) -> dict[str, Any]:
    """The numbers of one phase (``jain``: the fairness of acked updates over
    ``agents`` agents)."""
    done = [r for r in records if r.outcome != "missed"]
    ok = [r for r in done if r.outcome == "ok"]
    per_agent = [0] * agents
    for r in ok:
        if 0 <= r.agent < agents:
            per_agent[r.agent] += 1
    latencies = sorted(r.latency for r in records if r.outcome in ("ok", "missed"))
    attempts = sum(r.attempts for r in done)
    rejected = sum(r.rejected for r in done)
    per_update = sorted(float(r.attempts) for r in ok)
    return {
        "ops": len(ok),
        "exhausted": sum(r.outcome == "exhausted" for r in done),
        "errors": sum(r.outcome == "error" for r in done),
        "missed": len(records) - len(done),
        "elapsed": round(elapsed, 6),
        "goodput": len(ok) / elapsed if elapsed > 0 else 0.0,
        "attempts": attempts,
        "rejected": rejected,
        "rejection_rate": rejected / attempts if attempts else 0.0,
        "attempts_per_update": attempts / len(ok) if ok else None,
        "attempts_p99": _pct(per_update, 0.99),
        "p50": _pct(latencies, 0.50),
        "p90": _pct(latencies, 0.90),
        "p99": _pct(latencies, 0.99),
        "p999": _pct(latencies, 0.999),
        "max": latencies[-1] if latencies else None,
        "jain": jain(per_agent) if agents else None,
        "served": sum(1 for n in per_agent if n) if agents else None,
    }


MAX_ERRORS_KEPT = 5


class _Cell:
    """One cell's agents, ledger and records while it runs."""

    def __init__(self, spec: CellSpec, scenario: Scenario) -> None:
        self.spec, self.scenario = spec, scenario
        self.ledger = Ledger(spec.writers)
        self.records: list[OpRecord] = []
        self.errors: list[str] = []
        self.seq = [0] * spec.writers
        self.ops: list[Op] = []
        self.origin = time.perf_counter()

    async def op(self, i: int, phase: str, scheduled: float | None = None) -> Outcome | None:
        """One update by agent ``i``; ``None`` if there was no work for it."""
        op_id = f"{i}.{self.seq[i]}"
        started = time.perf_counter()
        result: Outcome | None
        try:
            result = await self.ops[i](op_id)
        except Exception as exc:
            if len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            result = Outcome("error", 0, 0, doubt=True)
        if result is None:
            return None
        self.seq[i] += 1
        self.ledger.add(i, op_id, result)
        begin = started if scheduled is None else scheduled
        self.records.append(
            OpRecord(
                phase,
                self.spec.policy,
                i,
                begin - self.origin,
                time.perf_counter() - begin,
                result.outcome,
                result.attempts,
                result.rejected,
            )
        )
        return result

    async def closed(self, phase: str, seconds: float) -> float:
        """Every agent back to back until the deadline; returns the elapsed time."""
        deadline = time.perf_counter() + seconds

        async def agent(i: int) -> None:
            while time.perf_counter() < deadline:
                result = await self.op(i, phase)
                await asyncio.sleep(0.001 if result is None else 0)  # let the others run

        began = time.perf_counter()
        await asyncio.gather(*(agent(i) for i in range(self.spec.writers)))
        return time.perf_counter() - began

    async def open(self, rate: float, seconds: float) -> float:
        """Arrivals at ``rate`` by the clock, each taken by the next free agent."""
        total = max(1, int(seconds * rate))
        t0 = time.perf_counter() + 0.001
        give_up = t0 + seconds + max(seconds, 1.0)
        arrivals = itertools.count()

        async def agent(i: int) -> None:
            while (k := next(arrivals)) < total:
                scheduled = t0 + k / rate
                now = time.perf_counter()
                if now > give_up:
                    self.records.append(
                        OpRecord(
                            "open",
                            self.spec.policy,
                            i,
                            scheduled - self.origin,
                            now - scheduled,
                            "missed",
                            0,
                            0,
                        )
                    )
                    continue
                if scheduled > now:
                    await asyncio.sleep(scheduled - now)
                while True:
                    if await self.op(i, "open", scheduled) is not None:
                        break
                    await asyncio.sleep(0.001)  # no work yet (a plan being refilled)

        await asyncio.gather(*(agent(i) for i in range(self.spec.writers)))
        return time.perf_counter() - t0

    async def measure(self, settings: Settings) -> dict[str, Any]:
        self.ops = [self.scenario.agent(i) for i in range(self.spec.writers)]
        if settings.warmup > 0:
            await self.closed("warmup", settings.warmup)
        mark = len(self.records)
        elapsed = await self.closed("closed", settings.duration)
        closed = summarize(self.records[mark:], elapsed, self.spec.writers)
        rate = settings.rate if settings.rate else settings.load * closed["goodput"]
        opened: dict[str, Any] | None = None
        if rate > 0 and settings.open_duration > 0:
            mark = len(self.records)
            elapsed = await self.open(rate, settings.open_duration)
            opened = {"rate": rate, **summarize(self.records[mark:], elapsed)}
        return {"closed": closed, "open": opened}


async def run_cell(
    spec: CellSpec, target: Target, settings: Settings
) -> tuple[dict[str, Any], list[OpRecord]]:
    """Run one cell; returns its summary (with the loss check) and its records."""
    if uses_store(spec.policy):
        stores = await target.handles(spec.writers)
    else:  # the raw client alone: our connections closed, as the raw ones are for ours
        stores = []
        await target.close()
    room = f"bench-{spec.policy}-{uuid.uuid4().hex[:10]}"
    env = CellEnv(target, stores, room, spec.writers, spec.think_ms / 1000.0, settings.budget)
    scenario = make_scenario(spec.policy, env)
    cell = _Cell(spec, scenario)
    summary: dict[str, Any] = {
        "kind": "policy",
        "backend": spec.backend,
        "policy": spec.policy,
        "writers": spec.writers,
        "think_ms": spec.think_ms,
        "rep": spec.rep,
        "room": room,
        "handles": len(stores),
    }
    stopped = False
    try:
        await scenario.setup()
        summary.update(await cell.measure(settings))
        stopped = True
        await scenario.stop()
        summary["check"] = verify(cell.ledger, await scenario.applied())
    finally:
        if not stopped:
            try:
                await scenario.stop()
            except Exception as exc:  # already failing: keep the first error
                cell.errors.append(f"stop: {type(exc).__name__}: {exc}")
        await scenario.close()
        if stores:  # keep the store the size it was: later cells measure the same thing
            with contextlib.suppress(Exception):
                await stores[0].delete_room(room)
    summary["extra"] = scenario.extra
    summary["errors"] = cell.errors
    summary["wall_s"] = round(time.perf_counter() - cell.origin, 3)
    summary["finished_at"] = time.time()
    return summary, cell.records
