"""One lock passed between processes: how long a handoff takes when the next holder is
in another process, on each backend, beside python-redis-lock on Redis.

``--procs`` spawned processes of ``--agents`` agents each take one lock ``--rounds``
times, holding it 1 ms. Ours queue (``wait_acquire``); a waiter in another process
learns of its handoff from the room's log (Redis: a blocking read; PostgreSQL:
``LISTEN``/``NOTIFY``; SQLite: the store thread's poll for other processes' commits).
python-redis-lock's agents are threads, woken by ``BLPOP``. Ours run on
:mod:`agentrooms_bench.loop` (asyncio with timer waits to the microsecond, so a 1 ms
hold lasts as long as a thread's ``time.sleep``). A warm-up round per process
first, so process start-up is not timed. Reports acquisitions/s (median over
``--repeat``) and the ratio to python-redis-lock. Ours run twice: agents that
``release`` and then queue again (``locks.hold``), and agents that pass the lock on with
``requeue`` (the handoff and the return to the line in one write).

    python3 dev.py bench handoff [--backends sqlite,redis,postgres] [--procs 3] \\
        [--agents 2] [--rounds 15] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing
import statistics
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from agentrooms.rooms import Rooms
from agentrooms.store import open_store
from agentrooms_bench import loop as bench_loop
from common import REDIS_URL, machine, store_url, unique

HOLD = 0.001


def ours(url: str, room: str, requeue: bool, proc: int, agents: int, rounds: int) -> int:
    """Run in a spawned process: this process's agents take the lock ``rounds`` times."""

    async def run() -> int:
        store = await open_store(url)
        taken = 0
        try:
            locks = Rooms(store).room(room).locks

            async def agent(owner: str) -> None:
                nonlocal taken
                if not requeue:
                    for _ in range(rounds):
                        async with locks.hold("one", owner, ttl=30, queue_timeout=120):
                            await asyncio.sleep(HOLD)
                            taken += 1
                    return
                lock = await locks.wait_acquire("one", owner, ttl=30, timeout=120)
                for turn in range(rounds):
                    await asyncio.sleep(HOLD)
                    taken += 1
                    if turn < rounds - 1:
                        lock = await locks.requeue(lock, timeout=120)
                await locks.release(lock)

            await asyncio.gather(*(agent(f"p{proc}a{i}") for i in range(agents)))
        finally:
            await store.close()
        return taken

    return bench_loop.run(run())  # timer waits to the microsecond, as a thread's


def peer(key: str, proc: int, agents: int, rounds: int) -> int:
    """Run in a spawned process: python-redis-lock, one thread per agent."""
    import redis

    redis_lock: Any = importlib.import_module("redis_lock")
    counts = [0] * agents

    def agent(i: int) -> None:
        conn = redis.Redis.from_url(REDIS_URL)
        try:
            for _ in range(rounds):
                with redis_lock.Lock(conn, key, expire=30):
                    time.sleep(HOLD)
                    counts[i] += 1
        finally:
            conn.close()

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def timed(pool: ProcessPoolExecutor, args: argparse.Namespace, job: Any, *fixed: Any) -> float:
    """Warm every process with one round, then time ``job(*fixed, proc, agents, rounds)``
    in all of them; the acquisitions per second."""
    procs, every = args.procs, [[value] * args.procs for value in fixed]
    list(pool.map(job, *every, range(procs), [1] * procs, [1] * procs))
    t0 = time.perf_counter()
    counts: list[int] = list(
        pool.map(job, *every, range(procs), [args.agents] * procs, [args.rounds] * procs)
    )
    taken = sum(counts)
    elapsed = time.perf_counter() - t0
    expected = procs * args.agents * args.rounds
    assert taken == expected, f"{taken} acquisitions, {expected} expected"
    return taken / elapsed


async def measure(
    backend: str, tmp: Path, pool: ProcessPoolExecutor, args: argparse.Namespace
) -> dict[bool, list[float]]:
    """Rates of ours without and with ``requeue``, alternated."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    async with store_url(backend, tmp, "handoff") as url:
        store = await open_store(url)
        try:
            for _ in range(args.repeat):
                for requeue, measured in rates.items():
                    room = (await Rooms(store).create(unique("handoff"))).name
                    rate = await asyncio.to_thread(timed, pool, args, ours, url, room, requeue)
                    measured.append(rate)
                    await store.delete_room(room)
        finally:
            await store.close()
    return rates


def measure_peer(pool: ProcessPoolExecutor, args: argparse.Namespace) -> list[float]:
    import redis

    rates = []
    admin = redis.Redis.from_url(REDIS_URL)
    try:
        for _ in range(args.repeat):
            key = unique("arbench-handoff")
            rates.append(timed(pool, args, peer, key))
            admin.delete(f"lock:{key}", f"lock-signal:{key}")
    finally:
        admin.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sqlite,redis,postgres")
    parser.add_argument("--procs", type=int, default=3)
    parser.add_argument("--agents", type=int, default=2, help="agents per process")
    parser.add_argument("--rounds", type=int, default=15, help="acquisitions per agent")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    spawn = multiprocessing.get_context("spawn")
    rows: list[tuple[str, list[float]]] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-handoff-") as tmp,
        ProcessPoolExecutor(args.procs, mp_context=spawn) as pool,
    ):
        for backend in args.backends.split(","):
            ours_rates = asyncio.run(measure(backend, Path(tmp), pool, args))
            rows.append((f"ours, {backend}", ours_rates[False]))
            rows.append((f"ours requeue, {backend}", ours_rates[True]))
            if backend == "redis" and importlib.util.find_spec("redis_lock") is not None:
                rows.append(("python-redis-lock, redis", measure_peer(pool, args)))
    print(
        f"\n{args.procs} processes x {args.agents} agents x {args.rounds} rounds, "
        f"{HOLD * 1000:g} ms held; median (range) of {args.repeat}"
    )
    peer_rate = next((statistics.median(r) for n, r in rows if n.startswith("python")), None)
    print(f"{'lock':<28}{'acq/s':>9}{'range':>14}{'ms each':>10}{'vs python-redis-lock':>22}")
    for name, rates in rows:
        mid = statistics.median(rates)
        span = f"{min(rates):,.0f}-{max(rates):,.0f}"
        versus = f"{mid / peer_rate:.2f}x" if peer_rate and "redis" in name else "-"
        print(f"{name:<28}{mid:>9,.0f}{span:>14}{1000 / mid:>10.2f}{versus:>22}")


if __name__ == "__main__":
    main()
