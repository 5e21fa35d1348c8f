"""Locks: the round trips each common path costs, and 48 agents on one lock beside
python-redis-lock, optionally against another checkout of the code in the same run.

``trips`` counts the store calls (transacts, reads, scans) that one process makes on the
paths :mod:`agentrooms.rooms.locks.knowledge` is there to shorten: an uncontended take
and release, a handoff down a line, ``requeue`` with and without anyone in line, a long
line (how often it is scanned), and a chain of handoffs (reads per handoff).

``contest`` runs the peer-library cell of ``agentrooms bench`` (48 agents, 1 ms held, a
counter under the lock) on Redis for ``--impls``, ``--repeat`` times each; with
``--before PATH`` (a ``src`` directory of another checkout) every repetition also runs
that code; each arm runs in a child process of its own, alternating.

    python3 dev.py bench locks trips [--backend memory|sqlite|redis|postgres]
    python3 dev.py bench locks contest [--repeat 3] [--duration 2] [--before PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentrooms.rooms import Lock, Room, Rooms
from agentrooms.store import open_store
from agentrooms.store.base import Store
from agentrooms.store.types import Prepared, ScanPage, Snapshot, TransactResult
from agentrooms.store.wrap import Forwarding
from common import store_url

IMPLS = ("ours-queued", "ours-queued-fused", "ours-requeue", "python-redis-lock")


class Counting(Forwarding):
    """Forwards to ``inner``, counting transacts, reads and scans."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls = self.reads = self.scans = 0

    def counts(self) -> tuple[int, int, int]:
        return self.calls, self.reads, self.scans

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        self.reads += 1
        return await self.inner._read(room, keys)

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        self.scans += 1
        return await self.inner._scan(room, prefix, after, limit)

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        self.calls += 1
        return await self.inner._transact(room, ops)


async def _in_line(room: Room, n: int) -> None:
    while len((await room.store.scan(room.name, "lockq/")).records) < n:  # noqa: ASYNC110
        await asyncio.sleep(0.01)


async def _line_up(room: Room, names: list[str]) -> list[asyncio.Task[Any]]:
    """Waiters ``names`` that each release the lock when handed it, in line in order."""

    async def waiter(name: str) -> None:
        lock = await room.locks.wait_acquire("l", name, ttl=30, timeout=60)
        assert await room.locks.release(lock)

    tasks = []
    for i, name in enumerate(names):
        tasks.append(asyncio.create_task(waiter(name)))
        await _in_line(room, i + 1)
    return tasks


Counted = Callable[[], Awaitable[None]]


async def _uncontended(room: Room) -> Counted:
    async def run() -> None:
        for _ in range(5):
            assert await room.locks.release(await room.locks.try_acquire("l", "a", ttl=30))

    return run


async def _requeue_alone(room: Room) -> Counted:
    async def run() -> None:
        lock = await room.locks.try_acquire("l", "a", ttl=30)
        assert await room.locks.release(await room.locks.requeue(lock, timeout=5))

    return run


async def _handoffs(room: Room, n: int) -> Counted:
    holder = await room.locks.try_acquire("l", "holder", ttl=30)
    tasks = await _line_up(room, [f"w{i}" for i in range(n)])

    async def run() -> None:
        assert await room.locks.release(holder)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)

    return run


async def _ring(room: Room, n: int, turns: int) -> Counted:
    """``n`` agents taking ``turns`` turns each by ``requeue``, the last one a release."""
    first = await room.locks.try_acquire("l", "a0", ttl=30)

    async def agent(i: int, lock: Lock | None = None) -> None:
        if lock is None:
            lock = await room.locks.wait_acquire("l", f"a{i}", ttl=30, timeout=60)
        for _ in range(turns - 1):
            lock = await room.locks.requeue(lock, timeout=60)
        assert await room.locks.release(lock)

    tasks = [asyncio.create_task(agent(i)) for i in range(1, n)]
    await _in_line(room, n - 1)

    async def run() -> None:
        await asyncio.wait_for(asyncio.gather(agent(0, first), *tasks), 60)

    return run


SCENARIOS: list[tuple[str, int, Callable[[Room], Awaitable[Counted]]]] = [
    ("5 uncontended take + release", 16, _uncontended),
    ("requeue, nobody in line (+ release)", 16, _requeue_alone),
    ("2 waiters in line, 3 releases", 16, lambda r: _handoffs(r, 2)),
    ("12 waiters in line, 13 releases", 16, lambda r: _handoffs(r, 12)),
    ("10 waiters, LINE = 3, 11 releases", 3, lambda r: _handoffs(r, 10)),
    ("3 agents x 10 turns by requeue", 16, lambda r: _ring(r, 3, 10)),
]


async def trips(backend: str) -> None:
    from agentrooms.rooms.locks import Locks, line

    print(f"round trips of one process ({backend}): transacts, reads, scans")
    print(f"  {'':<38} {'with knowledge':>15} {'without':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        async with store_url(backend, Path(tmp), "locktrips") as url:
            store = await open_store(url)
            try:
                for label, named, setup in SCENARIOS:
                    cells = []
                    for knowing in (True, False):
                        counting = Counting(store)
                        room = await Rooms(counting).create(f"trips-{uuid.uuid4().hex[:8]}")
                        if not knowing:
                            room.locks = Locks(room.scope)  # knows nothing
                        assert await room.locks.release(await room.locks.try_acquire("l", "a"))
                        saved, line.LINE = line.LINE, named
                        try:
                            run = await setup(room)
                            before = counting.counts()
                            await run()
                        finally:
                            line.LINE = saved
                        delta = [a - b for a, b in zip(counting.counts(), before, strict=True)]
                        cells.append(" ".join(f"{d:>4}" for d in delta))
                    print(f"  {label:<38} {cells[0]:>15} {cells[1]:>15}")
            finally:
                await store.close()


async def _cells(impls: list[str], duration: float, rep: int) -> dict[str, float]:
    from agentrooms.reliability.stores import provision
    from agentrooms_bench import peers
    from agentrooms_bench.runner import Settings

    settings = Settings(("log",), (1,), (0.0,), repetitions=1, duration=duration)
    rates: dict[str, float] = {}
    async with provision("redis") as target:
        for impl in impls:
            spec = peers.PeerSpec("redis", "locks", impl, 48, rep)
            summary, _ = await peers.run_peer(spec, target, settings)
            assert summary["check"]["lost"] == 0, summary["check"]
            rates[impl] = summary["extra"]["acquisitions"] / duration
    return rates


def contest(impls: list[str], repeat: int, duration: float, before: str | None) -> None:
    here = str(Path(__file__).resolve().parent.parent / "src")
    paths = {"after": here, **({"before": before} if before else {})}
    arms: dict[str, dict[str, list[float]]] = {arm: {} for arm in paths}
    for rep in range(repeat):
        for arm, by_impl in arms.items():  # each arm in a child process of its own
            path = f"{paths[arm]}{os.pathsep}{Path(__file__).parent}"
            args = [sys.executable, __file__, "cell", "--impls", ",".join(impls)]
            args += ["--duration", str(duration), "--rep", str(rep)]
            env = {**os.environ, "PYTHONPATH": path}
            out = subprocess.run(args, env=env, check=True, capture_output=True, text=True)
            rates: dict[str, float] = json.loads(out.stdout.splitlines()[-1])
            for impl, rate in rates.items():
                by_impl.setdefault(impl, []).append(rate)
            print(f"rep {rep} {arm:>6}: " + ", ".join(f"{k} {v:.0f}/s" for k, v in rates.items()))
    print("median acquisitions/s, 48 agents on one lock, Redis (and x python-redis-lock):")
    for arm, by_impl in arms.items():
        peer = statistics.median(by_impl.get("python-redis-lock", [0.0])) or None
        cells = []
        for impl, rates_of in by_impl.items():
            rate = statistics.median(rates_of)
            ratio = f" ({rate / peer:.2f}x)" if peer and impl != "python-redis-lock" else ""
            cells.append(f"{impl} {rate:.0f}{ratio}")
        print(f"  {arm:>6}: " + ", ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trips")
    t.add_argument("--backend", default="memory")
    c = sub.add_parser("contest")
    c.add_argument("--impls", default=",".join(IMPLS))
    c.add_argument("--repeat", type=int, default=3)
    c.add_argument("--duration", type=float, default=2.0)
    c.add_argument("--before", help="a src directory of the code to compare with")
    cell = sub.add_parser("cell")  # one repetition, for --before's child process
    cell.add_argument("--impls", default=",".join(IMPLS))
    cell.add_argument("--duration", type=float, default=2.0)
    cell.add_argument("--rep", type=int, default=0)
    args = parser.parse_args()
    if args.command == "trips":
        asyncio.run(trips(args.backend))
    elif args.command == "contest":
        contest(args.impls.split(","), args.repeat, args.duration, args.before)
    else:
        from agentrooms_bench import loop as bench_loop

        rates = bench_loop.run(_cells(args.impls.split(","), args.duration, args.rep))
        print(json.dumps(rates))


if __name__ == "__main__":
    main()
