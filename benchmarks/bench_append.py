"""Where one SQLite writer's append goes: our store, its parts, and `eventsourcing`.

One writer appends one event at a time, each acknowledged only once durable (WAL,
``synchronous=FULL``), as the bench's event-sourcing peer cell does. Arms, alternated
round by round in one run, each on a fresh database in the same directory:

* ``fdatasync``: a 4 KiB ``pwrite`` and ``fdatasync`` of a file: the disk's floor;
* ``sqlite3, same SQL``: the statements our engine runs for an append (``BEGIN
  IMMEDIATE``, reserve a sequence number, insert the event, ``COMMIT``), from plain
  ``sqlite3`` on the calling thread;
* ``engine, calling thread``: our engine (the SQL above plus its Python), called
  directly, without the store's thread;
* ``thread hop``: the bare round trip from an event loop to a thread and back (a queue
  put, the thread's ``call_soon_threadsafe``), with no work: what any asyncio front end
  to blocking SQLite pays per call;
* ``ours: store.transact``: the real thing, ``await store.transact(room, appends=...)``;
* ``eventsourcing``: ``app.save`` of an aggregate with one new event, on the calling
  thread (if installed: ``agentrooms-bench``).

Prints the median microseconds per append of each arm and its ratio to eventsourcing.

    python3 dev.py bench append [--appends 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import queue
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrooms.store import open_store
from agentrooms.store.sqlite.config import parse_url
from agentrooms.store.sqlite.engine import Engine
from agentrooms.store.sqlite.operations import Operations
from agentrooms.store.types import Append, Limits
from agentrooms.store.validation import prepare_transact
from common import machine

Arm = Callable[[Path, int], float]  # (fresh directory, appends) -> seconds per append


def fdatasync(where: Path, n: int) -> float:
    fd = os.open(where / "floor", os.O_RDWR | os.O_CREAT)
    try:
        block = b"x" * 4096
        t0 = time.perf_counter()
        for _ in range(n):
            os.pwrite(fd, block, 0)
            os.fdatasync(fd)
        return (time.perf_counter() - t0) / n
    finally:
        os.close(fd)


def raw_sql(where: Path, n: int) -> float:
    conn = sqlite3.connect(where / "raw.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL").fetchall()
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("CREATE TABLE rooms (room TEXT PRIMARY KEY, seq INTEGER NOT NULL)")
        conn.execute(
            "CREATE TABLE events (room TEXT, seq INTEGER, type TEXT, data TEXT, "
            "time_ms INTEGER, PRIMARY KEY (room, seq))"
        )
        data = json.dumps({"by": 1})
        t0 = time.perf_counter()
        for _ in range(n):
            conn.execute("BEGIN IMMEDIATE")
            (seq,) = conn.execute(
                "INSERT INTO rooms (room, seq) VALUES ('r', 1) "
                "ON CONFLICT (room) DO UPDATE SET seq = seq + excluded.seq RETURNING seq"
            ).fetchone()
            conn.execute(
                "INSERT INTO events VALUES ('r', ?, 'Incremented/v1', ?, ?)",
                (seq, data, int(time.time() * 1000)),
            )
            conn.execute("COMMIT")
        return (time.perf_counter() - t0) / n
    finally:
        conn.close()


def engine(where: Path, n: int) -> float:
    eng = Engine(parse_url(f"sqlite:///{where / 'engine.db'}"), time.time, 30.0)
    failure = eng.start()
    if failure is not None:
        raise failure
    try:
        prepared = prepare_transact([], [], [Append("Incremented/v1", {"by": 1})], Limits())

        def job(ops: Operations) -> Any:
            return ops.transact("r", prepared)

        t0 = time.perf_counter()
        for _ in range(n):
            (outcome,) = eng.run([job], True)
            if isinstance(outcome, BaseException):
                raise outcome
        return (time.perf_counter() - t0) / n
    finally:
        eng.close()


def hop(where: Path, n: int) -> float:
    async def run() -> float:
        loop = asyncio.get_running_loop()
        jobs: queue.SimpleQueue[asyncio.Future[None] | None] = queue.SimpleQueue()

        def serve() -> None:
            while (future := jobs.get()) is not None:
                loop.call_soon_threadsafe(future.set_result, None)

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                future = loop.create_future()
                jobs.put(future)
                await future
            return (time.perf_counter() - t0) / n
        finally:
            jobs.put(None)
            thread.join()

    return asyncio.run(run())


def ours(where: Path, n: int) -> float:
    async def run() -> float:
        store = await open_store(f"sqlite:///{where / 'ours.db'}")
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                await store.transact("r", appends=[Append("Incremented/v1", {"by": 1})])
            elapsed = time.perf_counter() - t0
            assert await store.last_seq("r") == n
            return elapsed / n
        finally:
            await store.close()

    return asyncio.run(run())


def eventsourcing(where: Path, n: int) -> float:
    from eventsourcing.application import Application

    from agentrooms_bench.peers import _es_counter

    counter_class = _es_counter()  # the bench cell's aggregate, defined once per process
    env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(where / "es.db")}
    app: Application[Any] = Application(env=env)
    try:
        counter = counter_class()
        app.save(counter)
        t0 = time.perf_counter()
        for _ in range(n):
            counter.increment(1)
            app.save(counter)
        elapsed = time.perf_counter() - t0
        assert app.repository.get(counter.id).n == n
        return elapsed / n
    finally:
        app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--appends", type=int, default=2000, help="appends per arm per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, arms alternated")
    args = parser.parse_args()
    arms: dict[str, Arm] = {
        "fdatasync": fdatasync,
        "sqlite3, same SQL": raw_sql,
        "engine, calling thread": engine,
        "thread hop": hop,
        "ours: store.transact": ours,
    }
    if importlib.util.find_spec("eventsourcing") is not None:
        arms["eventsourcing"] = eventsourcing
    else:
        print("eventsourcing is not installed (agentrooms-bench): its arm is skipped")
    print(machine())
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory(prefix="bench-append-") as tmp:
        for rnd in range(args.rounds):
            for name, arm in arms.items():
                where = Path(tmp) / f"{rnd}-{len(seconds[name])}-{name.split()[0].strip(',:')}"
                where.mkdir()
                seconds[name].append(arm(where, args.appends))
    es = statistics.median(seconds["eventsourcing"]) if "eventsourcing" in seconds else None
    print(f"\n{args.appends} appends per arm, {args.rounds} rounds; median (range) per append")
    print(f"{'arm':<26}{'us/append':>12}{'range':>16}{'vs eventsourcing':>18}")
    for name, values in seconds.items():
        mid = statistics.median(values)
        span = f"{min(values) * 1e6:.0f}-{max(values) * 1e6:.0f}"
        versus = f"{es / mid:.2f}x" if es else "-"  # >1: more appends per second
        print(f"{name:<26}{mid * 1e6:>12.1f}{span:>16}{versus:>18}")


if __name__ == "__main__":
    main()
