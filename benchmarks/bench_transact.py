"""Single-record transact on independent keys: agentrooms vs the raw client, side by side.

8 concurrent writers, each doing compare-and-set on its own key back to back (closed
loop). The raw arm does the same compare-and-set with the bare driver:

* redis:    redis-py (hiredis) running a small CAS Lua script (EVALSHA)
* postgres: asyncpg ``UPDATE ... SET version = version + 1 WHERE key = $ AND version = $``
* sqlite:   sqlite3, one connection per writer thread, BEGIN IMMEDIATE / UPDATE / COMMIT,
            WAL with synchronous=FULL (our default)

Arms alternate (ours, raw, ours, raw, ...) so drift on a shared machine hits both; the
ratio is the median over paired repetitions.

    python3 dev.py bench transact [--duration 3] [--rounds 3] [--backends sqlite,redis,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentrooms.store import Put, VersionIs, open_store
from common import (
    REDIS_URL,
    Arm,
    closed_loop,
    drop_redis_prefix,
    machine,
    median_arm,
    ms,
    postgres_database,
    ratio_stats,
    spread,
    unique,
)

WRITERS = 8
PAYLOAD = {"n": 0, "pad": "x" * 100}

Op = Callable[[], Awaitable[None]]


async def store_cas_arm(
    label: str, store: Any, place: Callable[[int], tuple[str, str]], duration: float
) -> Arm:
    """WRITERS writers on ``store``, each compare-and-setting its own record back to back:
    writer ``w``'s is ``place(w)``, a (room, key)."""

    async def make(w: int) -> Op:
        room, key = place(w)
        version = (await store.transact(room, writes=[Put(key, PAYLOAD)])).versions[key]

        async def op() -> None:
            nonlocal version
            result = await store.transact(room, [VersionIs(key, version)], [Put(key, PAYLOAD)])
            version = result.versions[key]

        return op

    return await closed_loop(label, WRITERS, duration, make)


async def ours_arm(url: str, duration: float) -> Arm:
    store = await open_store(url)
    room = unique("bench")
    try:
        return await store_cas_arm("agentrooms", store, lambda w: (room, f"k{w}"), duration)
    finally:
        await store.close()


# ------------------------------------------------------------------------------ raw

REDIS_CAS = """
local v = redis.call('HGET', KEYS[1], 'ver')
if v ~= ARGV[1] then return -1 end
local n = redis.call('HINCRBY', KEYS[1], 'ver', 1)
redis.call('HSET', KEYS[1], 'val', ARGV[2])
return n
"""


async def lua_cas_arm(
    label: str, client: Any, key_of: Callable[[int], str], duration: float
) -> Arm:
    """WRITERS writers on the redis-py ``client``, each running REDIS_CAS on its own hash
    ``key_of(w)`` back to back."""
    cas = client.register_script(REDIS_CAS)
    text = json.dumps(PAYLOAD)

    async def make(w: int) -> Op:
        key = key_of(w)
        await client.hset(key, mapping={"ver": 1, "val": text})
        version = 1

        async def op() -> None:
            nonlocal version
            new = await cas(keys=[key], args=[version, text])
            assert new != -1
            version = int(new)

        return op

    return await closed_loop(label, WRITERS, duration, make)


async def raw_redis(duration: float) -> Arm:
    import redis.asyncio as redis

    client = redis.Redis.from_url(REDIS_URL)
    prefix = unique("rawbench")
    try:
        return await lua_cas_arm(
            "raw redis-py Lua CAS", client, lambda w: f"{prefix}:k{w}", duration
        )
    finally:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def raw_postgres(url: str, duration: float, dedicated: bool = False) -> Arm:
    """Through asyncpg's pool (how an application uses it), or with one dedicated
    connection per writer (the least client overhead asyncpg allows)."""
    import asyncpg

    pool = await asyncpg.create_pool(url, min_size=WRITERS, max_size=WRITERS)
    text = json.dumps(PAYLOAD)
    table = unique("rawbench").replace("-", "_")
    conns: list[Any] = []
    try:
        await pool.execute(
            f"CREATE TABLE {table} "
            "(key text PRIMARY KEY, value text NOT NULL, version bigint NOT NULL)"
        )

        async def make(w: int) -> Op:
            key = f"k{w}"
            await pool.execute(f"INSERT INTO {table} VALUES ($1, $2, 1)", key, text)
            version = 1
            sql = (
                f"UPDATE {table} SET value = $1, version = version + 1 "
                "WHERE key = $2 AND version = $3 RETURNING version"
            )
            conn = await asyncpg.connect(url) if dedicated else None
            if conn is not None:
                conns.append(conn)
            runner = conn if conn is not None else pool

            async def op() -> None:
                nonlocal version
                new = await runner.fetchval(sql, text, key, version)
                assert new is not None
                version = new

            return op

        name = "raw asyncpg UPDATE, " + ("own connections" if dedicated else "pool")
        return await closed_loop(name, WRITERS, duration, make)
    finally:
        for conn in conns:
            await conn.close()
        await pool.execute(f"DROP TABLE IF EXISTS {table}")
        await pool.close()


def raw_sqlite(path: Path, duration: float) -> Arm:
    text = json.dumps(PAYLOAD)
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute(
        "CREATE TABLE IF NOT EXISTS t (key TEXT PRIMARY KEY, value TEXT, version INTEGER)"
    )
    setup.executemany(
        "INSERT OR REPLACE INTO t VALUES (?, ?, 1)", [(f"k{w}", text) for w in range(WRITERS)]
    )
    setup.close()
    arm = Arm("raw sqlite3 UPDATE")
    lock = threading.Lock()
    stop = time.perf_counter() + duration

    def worker(w: int) -> None:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        key, version, mine = f"k{w}", 1, []
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            cur = conn.execute(
                "UPDATE t SET value = ?, version = version + 1 WHERE key = ? AND version = ?",
                (text, key, version),
            )
            assert cur.rowcount == 1
            conn.execute("COMMIT")
            version += 1
            mine.append(time.perf_counter() - t0)
        conn.close()
        with lock:
            arm.latencies.extend(mine)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    arm.elapsed = time.perf_counter() - t0
    return arm


# ------------------------------------------------------------------------- backends


async def run_backend(
    name: str, duration: float, rounds: int
) -> tuple[list[Arm], dict[str, list[Arm]]]:
    """Our arm and each raw arm, ``rounds`` times, interleaved."""
    ours: list[Arm] = []
    raws: dict[str, list[Arm]] = {}

    def keep(arm: Arm) -> None:
        raws.setdefault(arm.name, []).append(arm)

    if name == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'ours.db'}"
            for _ in range(rounds):
                ours.append(await ours_arm(url, duration))
                keep(await asyncio.to_thread(raw_sqlite, Path(tmp) / "raw.db", duration))
    elif name == "redis":
        prefix = unique("arbench")
        try:
            for _ in range(rounds):
                ours.append(await ours_arm(f"{REDIS_URL}?prefix={prefix}", duration))
                keep(await raw_redis(duration))
        finally:
            await drop_redis_prefix(prefix)
    elif name == "postgres":
        async with postgres_database() as url:
            for _ in range(rounds):
                ours.append(await ours_arm(url, duration))
                keep(await raw_postgres(url, duration))
                keep(await raw_postgres(url, duration, dedicated=True))
    else:
        raise SystemExit(f"unknown backend {name}")
    return ours, raws


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,redis,postgres")
    args = parser.parse_args()
    print(f"# transact vs raw client, {WRITERS} writers on independent keys")
    print(f"\n{machine()}; {args.rounds} rounds x {args.duration}s per arm, alternating\n")
    print("| backend | arm | commits/s (median) | range | p50 ms | p99 ms | agentrooms/this arm |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.backends.split(","):
        all_ours, raws = await run_backend(name, args.duration, args.rounds)
        ours = median_arm(all_ours)
        print(
            f"| {name} | {ours.name} | {ours.rate:,.0f} | {spread(all_ours)} | "
            f"{ms(ours.pct(0.5))} | {ms(ours.pct(0.99))} | |"
        )
        for all_raw in raws.values():
            raw = median_arm(all_raw)
            pairs = [(o.rate, r.rate) for o, r in zip(all_ours, all_raw, strict=True)]
            med, lo, hi = ratio_stats(pairs)
            print(
                f"| {name} | {raw.name} | {raw.rate:,.0f} | {spread(all_raw)} | "
                f"{ms(raw.pct(0.5))} | {ms(raw.pct(0.99))} | **{med:.0%}** ({lo:.0%}-{hi:.0%}) |"
            )


if __name__ == "__main__":
    asyncio.run(main())
