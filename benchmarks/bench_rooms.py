"""Agents claiming and completing tasks in one room, and agents sharing one lock.

Claims, side by side per backend and agent count (closed loop, fixed time):

* ``per-task``: this design — each task its own record, claim_next over the ready set,
  a lease with a fencing token, complete.
* ``plan-lock``: the naive design — the whole plan as one JSON document under one lock
  (acquire with backoff, read, mark, write, release; the same for completion).
* ``plan-cas``: the next naive design — the whole plan as one document written by
  compare-and-swap through the commit loop (full jitter).
* ``per-task/processes``: ``per-task`` with the agents spread over one OS process per
  core (not for ``memory://``). The other designs run every agent in this one
  interpreter, eight agents per store handle, which caps the client at one core.

Reported: completed tasks/s, wasted write attempts (conflicts, or lock tries that found
it held, over all claim and completion attempts), p50/p99 claim latency, duplicates
(must be 0).

Locks: N agents acquire/release one lock for a fixed time (1 ms inside): our polling
lock (``acquire``), our queued lock (``wait_acquire``), and python-redis-lock (redis only,
threads) in the same run. Reported: acquisitions/s relative to one agent, and how many
agents acquired at least once.

Plan size: claim_next latency with 10 vs 10,000 tasks in the plan.

    python3 dev.py bench rooms [--backends sqlite,redis,postgres] [--agents 1,2,4,8,16,32,64]
        [--duration 3] [--lock-agents 48] [--parts claims,locks,size]
        [--designs per-task,plan-lock,plan-cas,per-task/processes] [--plot FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from agentrooms.commit import Change, CommitOptions, View
from agentrooms.errors import LockHeld
from agentrooms.metrics import Metrics
from agentrooms.retry import FullJitter, RetryPolicy
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.store import Put, Store, open_store
from common import REDIS_URL, CpuMeter, machine, ms, store_url, unique

TASKS = 3000


@dataclass
class Result:
    backend: str
    design: str
    agents: int
    completed: int = 0
    attempts: int = 0  # claim attempts, including wasted ones
    wasted: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    duplicates: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    cpu: CpuMeter = field(default_factory=CpuMeter)

    @property
    def rate(self) -> float:
        return self.completed / self.elapsed if self.elapsed else 0.0

    @property
    def waste(self) -> float:
        return self.wasted / self.attempts if self.attempts else 0.0

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def handles(url: str, n: int) -> list[Store]:
    if url.startswith("memory:"):
        return [await open_store(url)]
    return [await open_store(url) for _ in range(max(1, n // 8))]


def record_done(done: dict[str, int], result: Result, task_id: str) -> None:
    done[task_id] = done.get(task_id, 0) + 1
    if done[task_id] > 1:
        result.duplicates += 1


# ----------------------------------------------------------------------- per-task


async def per_task(stores: list[Store], result: Result, duration: float) -> None:
    room = await _plan_room(stores[0])
    result.cpu.start()
    found = await _claimers(stores, room, range(result.agents), time.time() + duration)
    result.cpu.stop()
    _tally(result, [found])


async def per_task_processes(url: str, result: Result, duration: float) -> None:
    """The per-task design with the agents spread over one OS process per core (each
    with its own event loop and store handles), as agents that are processes are: one
    interpreter running every agent measures that interpreter's one core as much as the
    store."""
    store = await open_store(url)
    try:
        room = await _plan_room(store)
    finally:
        await store.close()
    count = min(result.agents, PROCESSES)
    shares = [range(result.agents)[p::count] for p in range(count)]
    start = time.time() + 2.0  # every process has opened its stores by then
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(count, mp_context=context) as pool:
        runs = [
            pool.submit(_claimers_in_process, url, room, share, start, start + duration)
            for share in shares
        ]
        await asyncio.sleep(max(0.0, start - time.time()))
        result.cpu.start()
        found = [await asyncio.wrap_future(run) for run in runs]
        result.cpu.stop()
    _tally(result, found)
    result.cpu.client = sum(f.cpu for f in found) / result.elapsed / (os.cpu_count() or 1)


PROCESSES = os.cpu_count() or 1
PER_TASK_PROCESSES = "per-task/processes"


@dataclass
class Claimed:
    """What one process's claiming agents did."""

    done: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    conflicts: int = 0
    elapsed: float = 0.0
    cpu: float = 0.0  # this process's CPU seconds while its agents ran


async def _plan_room(store: Store) -> str:
    room = await Rooms(store).create(unique("claims"))
    for start in range(0, TASKS, 500):
        await room.plan.add([TaskSpec(f"t{i:05}") for i in range(start, min(TASKS, start + 500))])
    return room.name


async def _claimers(stores: list[Store], room: str, agents: range, stop: float) -> Claimed:
    """``agents`` claiming and completing tasks of ``room`` until ``stop`` (wall clock)
    or the plan is done."""
    metrics = Metrics(CollectorRegistry())
    claimed = Claimed()

    async def agent(i: int) -> None:
        plan = Rooms(stores[i % len(stores)], metrics=metrics).room(room).plan
        while time.time() < stop:
            t0 = time.perf_counter()
            lease = await plan.claim_next(f"agent-{i}", ttl=60)
            if lease is None:
                return
            claimed.latencies.append(time.perf_counter() - t0)
            await plan.complete(lease, i)
            claimed.done.append(lease.task_id)

    t0, cpu0 = time.time(), time.process_time()
    await asyncio.gather(*(agent(i) for i in agents))
    claimed.elapsed, claimed.cpu = time.time() - t0, time.process_time() - cpu0
    claimed.conflicts = metrics.snapshot()["errors"]["conflict"]
    return claimed


def _claimers_in_process(url: str, room: str, agents: range, start: float, stop: float) -> Claimed:
    async def run() -> Claimed:
        stores = [await open_store(url) for _ in range(max(1, len(agents) // 8))]
        try:
            await asyncio.sleep(max(0.0, start - time.time()))
            return await _claimers(stores, room, agents, stop)
        finally:
            for s in stores:
                await s.close()

    return asyncio.run(run())


def _tally(result: Result, found: list[Claimed]) -> None:
    done: dict[str, int] = {}
    for claimed in found:
        for task_id in claimed.done:
            record_done(done, result, task_id)
        result.latencies += claimed.latencies
        result.wasted += claimed.conflicts
    result.completed = sum(len(c.done) for c in found)
    result.elapsed = max(c.elapsed for c in found)
    result.attempts = result.completed * 2 + result.wasted  # claim + complete writes


# ---------------------------------------------------------------- whole-plan designs


def _first_ready(plan: dict[str, str]) -> str | None:
    return next((t for t, status in plan.items() if status == "ready"), None)


async def plan_lock(stores: list[Store], result: Result, duration: float) -> None:
    rooms = Rooms(stores[0])
    room = await rooms.create(unique("planlock"))
    await stores[0].transact(
        room.name, writes=[Put("plan", {f"t{i:05}": "ready" for i in range(TASKS)})]
    )
    done: dict[str, int] = {}
    stop = time.perf_counter() + duration

    async def locked(
        r: Any, agent: str, change: Callable[[dict[str, str]], str | None]
    ) -> str | None:
        while True:
            result.attempts += 1
            try:
                lock = await r.locks.try_acquire("plan", agent, ttl=30)
                break
            except LockHeld:
                result.wasted += 1
                await asyncio.sleep(0.005)
        try:
            plan = (await r.store.read(r.name, ["plan"])).value("plan")
            picked = change(plan)
            await r.store.transact(r.name, [lock.guard()], [Put("plan", plan)])
            return picked
        finally:
            await r.locks.release(lock)

    def claim(plan: dict[str, str]) -> str | None:
        task = _first_ready(plan)
        if task is not None:
            plan[task] = "claimed"
        return task

    async def agent(i: int) -> None:
        r = Rooms(stores[i % len(stores)]).room(room.name)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            task = await locked(r, f"agent-{i}", claim)
            if task is None:
                return
            result.latencies.append(time.perf_counter() - t0)

            def complete(plan: dict[str, str], task: str = task) -> str | None:
                plan[task] = "done"
                return task

            await locked(r, f"agent-{i}", complete)
            record_done(done, result, task)
            result.completed += 1

    t0 = time.perf_counter()
    result.cpu.start()
    await asyncio.gather(*(agent(i) for i in range(result.agents)))
    result.cpu.stop()
    result.elapsed = time.perf_counter() - t0


async def plan_cas(stores: list[Store], result: Result, duration: float) -> None:
    from agentrooms.commit import commit
    from agentrooms.errors import InvalidTransition

    metrics = Metrics(CollectorRegistry())
    room = unique("plancas")
    await stores[0].transact(
        room, writes=[Put("plan", {f"t{i:05}": "ready" for i in range(TASKS)})]
    )
    policy = RetryPolicy(max_attempts=10_000, budget=60, backoff=FullJitter())
    done: dict[str, int] = {}
    stop = time.perf_counter() + duration

    def claim(view: View, _: None) -> Change:
        plan = dict(view.get("plan"))
        task = _first_ready(plan)
        if task is None:
            raise InvalidTransition("no ready task")
        plan[task] = "claimed"
        return Change(writes=[Put("plan", plan)], result=task)

    def complete(view: View, task: str) -> Change:
        plan = dict(view.get("plan"))
        plan[task] = "done"
        return Change(writes=[Put("plan", plan)])

    async def agent(i: int) -> None:
        store = stores[i % len(stores)]
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            try:
                claimed = await commit(
                    store,
                    room,
                    claim,
                    None,
                    keys=["plan"],
                    options=CommitOptions(policy=policy, metrics=metrics),
                )
            except InvalidTransition:
                return
            result.latencies.append(time.perf_counter() - t0)
            await commit(
                store,
                room,
                complete,
                claimed.result,
                keys=["plan"],
                options=CommitOptions(policy=policy, metrics=metrics),
            )
            record_done(done, result, claimed.result)
            result.completed += 1

    t0 = time.perf_counter()
    result.cpu.start()
    await asyncio.gather(*(agent(i) for i in range(result.agents)))
    result.cpu.stop()
    result.elapsed = time.perf_counter() - t0
    result.wasted = metrics.snapshot()["errors"]["conflict"]
    result.attempts = result.completed * 2 + result.wasted


DESIGNS: dict[str, Callable[[list[Store], Result, float], Awaitable[None]]] = {
    "per-task": per_task,
    "plan-lock": plan_lock,
    "plan-cas": plan_cas,
}


async def claims(
    backend: str, url: str, agents: list[int], duration: float, designs: list[str] | None = None
) -> list[Result]:
    out = []
    for n in agents:
        for design in [*DESIGNS, PER_TASK_PROCESSES]:
            if designs is not None and design not in designs:
                continue
            result = Result(backend, design, n)
            if design == PER_TASK_PROCESSES:
                if url.startswith("memory:"):
                    continue  # a memory store is private to its process
                await per_task_processes(url, result, duration)
            else:
                stores = await handles(url, n)
                try:
                    await DESIGNS[design](stores, result, duration)
                finally:
                    for s in stores:
                        await s.close()
            if result.duplicates:
                raise SystemExit(f"DUPLICATE CLAIMS: {result}")
            print(
                f"  {backend:8} {design:9} N={n:<3} {result.rate:8.0f} tasks/s "
                f"wasted {result.waste:6.1%} p99 {ms(result.pct(0.99))} ms",
                flush=True,
            )
            out.append(result)
    return out


# --------------------------------------------------------------------------- locks


async def our_lock(url: str, agents: int, duration: float, queued: bool, backend: str) -> Result:
    stores = await handles(url, agents)
    name = "queued-lock" if queued else "polling-lock"
    result = Result(backend, name, agents)
    room = await Rooms(stores[0]).create(unique("lock"))
    per_agent: dict[int, int] = {}
    stop = time.perf_counter() + duration

    async def agent(i: int) -> None:
        locks = Rooms(stores[i % len(stores)]).room(room.name).locks
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            try:
                if queued:
                    lock = await locks.wait_acquire(
                        "one", f"a{i}", ttl=10, timeout=max(0.1, stop - time.perf_counter())
                    )
                else:
                    lock = await locks.acquire("one", f"a{i}", ttl=10, tries=1_000_000, step=0.01)
            except LockHeld:
                return
            result.latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.001)
            await locks.release(lock)
            per_agent[i] = per_agent.get(i, 0) + 1
            result.completed += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(agents)))
    result.elapsed = time.perf_counter() - t0
    result.extra["served"] = len(per_agent)
    for s in stores:
        await s.close()
    return result


def redis_lock_peer(agents: int, duration: float) -> Result:
    import redis
    import redis_lock

    result = Result("redis", "python-redis-lock", agents)
    client = redis.Redis.from_url(REDIS_URL)
    name = unique("prl")
    per_agent: dict[int, int] = {}
    lock_guard = threading.Lock()
    stop = time.perf_counter() + duration

    def agent(i: int) -> None:
        conn = redis.Redis.from_url(REDIS_URL)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            lock = redis_lock.Lock(conn, name, expire=10)
            if not lock.acquire(timeout=max(0.1, stop - time.perf_counter())):
                break
            with lock_guard:
                result.latencies.append(time.perf_counter() - t0)
                per_agent[i] = per_agent.get(i, 0) + 1
                result.completed += 1
            time.sleep(0.001)
            lock.release()
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=agent, args=(i,)) for i in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.elapsed = time.perf_counter() - t0
    result.extra["served"] = len(per_agent)
    client.close()
    return result


async def locks(backend: str, url: str, n: int, duration: float) -> list[Result]:
    out = []
    for queued in (False, True):
        solo = await our_lock(url, 1, duration, queued, backend)
        many = await our_lock(url, n, duration, queued, backend)
        many.extra["solo"] = solo.rate
        out.append(many)
    if backend == "redis":
        solo_peer = await asyncio.to_thread(redis_lock_peer, 1, duration)
        peer = await asyncio.to_thread(redis_lock_peer, n, duration)
        peer.extra["solo"] = solo_peer.rate
        out.append(peer)
    for r in out:
        print(
            f"  {backend:8} {r.design:17} N={n} {r.rate:7.0f}/s = {r.rate / r.extra['solo']:.0%} "
            f"of solo; served {r.extra['served']}/{n}",
            flush=True,
        )
    return out


# ------------------------------------------------------------------------ plan size


async def plan_size(backend: str, url: str) -> dict[int, float]:
    out = {}
    for size in (10, 10_000):
        store = (await handles(url, 1))[0]
        room = await Rooms(store).create(unique("size"))
        for start in range(0, size, 1000):
            await room.plan.add(
                [TaskSpec(f"t{i:05}") for i in range(start, min(size, start + 1000))]
            )
        latencies = []
        for i in range(min(200, size)):
            t0 = time.perf_counter()
            lease = await room.plan.claim_next(f"a{i}", ttl=60)
            latencies.append(time.perf_counter() - t0)
            assert lease is not None
        latencies.sort()
        out[size] = latencies[len(latencies) // 2]
        await store.close()
    print(
        f"  {backend:8} claim_next p50 with 10 tasks {ms(out[10])} ms, with 10,000 "
        f"{ms(out[10_000])} ms ({out[10_000] / out[10]:.2f}x)",
        flush=True,
    )
    return out


def _share(value: float | None) -> str:
    return "" if value is None else f"{value:.0%}"


def claims_table(results: list[Result]) -> str:
    lines = [
        "| backend | design | agents | tasks/s | wasted attempts | claim p50 ms | claim p99 ms "
        "| duplicates | machine CPU | client CPU |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.backend} | {r.design} | {r.agents} | {r.rate:,.0f} | {r.waste:.1%} | "
        f"{ms(r.pct(0.5))} | {ms(r.pct(0.99))} | {r.duplicates} | {_share(r.cpu.machine)} | "
        f"{_share(r.cpu.client)} |"
        for r in results
    ]
    return "\n".join(lines)


def plot(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(dict.fromkeys(r.backend for r in results))
    fig, axes = plt.subplots(1, len(backends), figsize=(5 * len(backends), 4), squeeze=False)
    for col, backend in enumerate(backends):
        ax = axes[0][col]
        for design in [*DESIGNS, PER_TASK_PROCESSES]:
            rows = [r for r in results if r.backend == backend and r.design == design]
            ax.plot([r.agents for r in rows], [r.rate for r in rows], marker="o", label=design)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{backend}: tasks claimed+completed/s")
        ax.set_xlabel("agents")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sqlite,redis,postgres")
    parser.add_argument("--agents", default="1,2,4,8,16,32,64")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--lock-agents", type=int, default=48)
    parser.add_argument("--parts", default="claims,locks,size")
    parser.add_argument(
        "--designs", default=",".join([*DESIGNS, PER_TASK_PROCESSES]), help="claim designs to run"
    )
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    agents = [int(n) for n in args.agents.split(",")]
    parts = set(args.parts.split(","))
    claim_results: list[Result] = []
    lock_results: list[Result] = []
    sizes: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            async with store_url(backend, Path(tmp), "rooms") as url:
                if "claims" in parts:
                    claim_results += await claims(
                        backend, url, agents, args.duration, args.designs.split(",")
                    )
                if "locks" in parts:
                    lock_results += await locks(backend, url, args.lock_agents, args.duration)
                if "size" in parts:
                    sizes[backend] = await plan_size(backend, url)
    print(f"\n# rooms\n\n{machine()}; {args.duration}s per cell; {TASKS} tasks per plan\n")
    if claim_results:
        print(claims_table(claim_results))
        print()
    if lock_results:
        print("| backend | lock | agents | acquisitions/s | vs solo | agents served |")
        print("|---|---|---:|---:|---:|---:|")
        for r in lock_results:
            print(
                f"| {r.backend} | {r.design} | {r.agents} | {r.rate:,.0f} | "
                f"{r.rate / r.extra['solo']:.0%} | {r.extra['served']}/{r.agents} |"
            )
        print()
    for backend, s in sizes.items():
        print(
            f"- {backend}: claim_next p50 {ms(s[10])} ms at 10 tasks, {ms(s[10_000])} ms at 10,000"
        )
    if args.plot and claim_results:
        plot(claim_results, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    asyncio.run(main())
