"""What one more room on a page costs: ``Rooms.page`` split into its two requests, and
each request into the server's part and the client's, per backend.

On one store of ``--rooms`` rooms (common.store_url), ``--rounds`` rounds each time, in
turns, a page of 10 and a page of 100 rooms, and each part alone at both sizes: the
registry read (``Store.scan_keys`` of the 16 shards, as far as the page reads ahead) and
the description (``describe_rooms`` of the page's names: one ``Store.glance`` and a
``RoomInfo`` per room). The server's own time is read where the server reports it:
Redis's ``INFO commandstats`` (microseconds per EVALSHA), PostgreSQL's ``EXPLAIN
(ANALYZE, TIMING OFF)`` execution time, and on SQLite the statements alone, timed in the
worker thread (rows fetched, nothing built). Reported: medians in milliseconds, and per
room the difference between the two page sizes over the 90 rooms between them, against
the page-of-10's time over 80 (the most a room may cost for the page of 100 to stay
within twice the page of 10).

    python3 dev.py bench page_costs [--backends sqlite,redis,postgres] [--rooms 10000]
        [--rounds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentrooms import Rooms, open_store
from agentrooms.rooms import keys, registry
from agentrooms.rooms.room import describe_rooms
from agentrooms.store import Store
from bench_pages import seed
from common import machine, store_url

SIZES = (10, 100)
KEYS, SETS = [keys.META, keys.ARCHIVED], [keys.READY]


async def median_ms(call: Callable[[], Awaitable[object]], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


async def redis_server_ms(url: str, call: Callable[[], Awaitable[object]], rounds: int) -> float:
    """The server's microseconds per EVALSHA over ``rounds`` calls, in milliseconds."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(url.partition("?")[0])
    try:
        await client.config_resetstat()
        for _ in range(rounds):
            await call()
        stats = await client.info("commandstats")
        return float(stats["cmdstat_evalsha"]["usec_per_call"]) / 1000
    finally:
        await client.aclose()


async def postgres_server_ms(url: str, sql: str, args: tuple[Any, ...], rounds: int) -> float:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        times = []
        for _ in range(rounds):
            plan = await conn.fetch("EXPLAIN (ANALYZE, TIMING OFF) " + sql, *args)
            line = next(r[0] for r in plan if r[0].startswith("Execution Time"))
            times.append(float(line.split()[2]))
        return statistics.median(times)
    finally:
        await conn.close()


async def sqlite_server_ms(
    store: Store, names: list[str], batch: int, rounds: int
) -> tuple[float, float]:
    """The glance's and the registry read's statements alone, run in the worker."""
    from agentrooms.store.sqlite.sql import QUERIES

    rooms = json.dumps(names)

    def job(ops: Any) -> tuple[float, float]:
        execute = ops._conn.execute
        glance = [
            ("glance_records", {"rooms": rooms, "keys": json.dumps(KEYS), "now_ms": 0}),
            ("glance_seqs", {"rooms": rooms}),
            ("glance_set_sizes", {"rooms": rooms, "names": json.dumps(SETS)}),
        ]
        shard = {"low": "room/", "high": "room0", "skip": None, "now_ms": 0, "limit": batch + 1}
        scans = [("scan_keys", {**shard, "room": room}) for room in registry.SHARD_ROOMS]
        out = []
        for statements in (glance, scans):
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for name, params in statements:
                    execute(QUERIES[name], params).fetchall()
                times.append(time.perf_counter() - t0)
            out.append(statistics.median(times) * 1000)
        return out[0], out[1]

    result: tuple[float, float] = await store._call(job, write=False)  # type: ignore[attr-defined]
    return result


async def measure(
    backend: str, url: str, store: Store, names: list[str], rounds: int
) -> dict[str, float]:
    rooms = Rooms(store)
    out: dict[str, float] = {}
    for n in SIZES:
        batch = registry.batch_for(n)

        def read_names(batch: int = batch) -> Awaitable[object]:
            return store.scan_keys(registry.SHARD_ROOMS, "room/", batch)

        def describe(n: int = n) -> Awaitable[object]:
            return describe_rooms(store, names[:n])

        out[f"page {n}"] = await median_ms(lambda n=n: rooms.page(n), rounds)  # type: ignore[misc]
        out[f"registry {n}"] = await median_ms(read_names, rounds)
        out[f"describe {n}"] = await median_ms(describe, rounds)
        if backend == "redis":
            out[f"registry server {n}"] = await redis_server_ms(url, read_names, rounds)
            out[f"describe server {n}"] = await redis_server_ms(url, describe, rounds)
        elif backend == "postgres":
            sql: dict[str, str] = store._sql  # type: ignore[attr-defined]
            shards = (list(registry.SHARD_ROOMS), "room/", "room0", "", batch)
            out[f"registry server {n}"] = await postgres_server_ms(
                url, sql["scan_keys"], shards, rounds
            )
            glance = (names[:n], KEYS, SETS)
            out[f"describe server {n}"] = await postgres_server_ms(
                url, sql["glance"], glance, rounds
            )
        elif backend == "sqlite":
            described, read = await sqlite_server_ms(store, names[:n], batch, rounds)
            out[f"describe server {n}"], out[f"registry server {n}"] = described, read
    return out


def per_room_us(medians: dict[str, float], part: str) -> float:
    small, large = SIZES
    return (medians[f"{part} {large}"] - medians[f"{part} {small}"]) / (large - small) * 1000


async def main(args: argparse.Namespace) -> None:
    print(machine())
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            async with store_url(backend, Path(tmp), "costs") as url:
                store = await open_store(url)
                try:
                    names = await seed(store, args.rooms)
                    await Rooms(store).page(100)
                    medians = await measure(backend, url, store, names, args.rounds)
                finally:
                    await store.close()
        print(f"\n{backend}: {args.rooms} rooms, medians of {args.rounds}, ms")
        for n in SIZES:
            print(
                f"  page of {n:3d}: "
                + "  ".join(
                    f"{part} {medians[f'{part} {n}']:.3f}"
                    for part in (
                        "page",
                        "registry",
                        "registry server",
                        "describe",
                        "describe server",
                    )
                )
            )
        parts = {
            p: per_room_us(medians, p)
            for p in ("page", "registry", "registry server", "describe", "describe server")
        }
        print(
            f"  per room, us: page {parts['page']:.1f} = registry {parts['registry']:.1f} "
            f"(server {parts['registry server']:.1f}) + description {parts['describe']:.1f} "
            f"(server {parts['describe server']:.1f}); page of 10 / 80 = "
            f"{medians['page 10'] / 80 * 1000:.1f}"
        )


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="sqlite,redis,postgres")
    p.add_argument("--rooms", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=30)
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
