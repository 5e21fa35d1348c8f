"""Client cost of one Redis command: agentrooms' wire against redis-py's asyncio client.

One caller sends a command, waits for its reply, and sends the next, for ``--duration``
seconds per arm; then 64 callers at once. Reported per command: wall time, and the client
process's CPU time (``time.process_time``), which is what limits an agent process on
Redis: the server answers a GET in a few microseconds. Arms, in the same run:

* ``redis-py GET``: ``await client.get(key)``, redis-py's asyncio client with hiredis;
* ``wire GET``: the same command on :class:`agentrooms.store.redis.wire.Wire`;
* ``redis-py EVALSHA read``: our ``read.lua`` through redis-py's ``evalsha``;
* ``store.read``: ``RedisStore.read`` of one key (the same script, on the wire, with the
  store's validation, deadline and decoding).

Arms alternate in rounds, so drift on a shared machine hits all of them.

    python3 dev.py bench wire [--duration 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from agentrooms.store import Put, open_store
from agentrooms.store.redis.backend import RedisStore
from agentrooms.store.redis.keys import room_keys
from agentrooms.store.redis.scripts import READ
from agentrooms.store.redis.wire import dial, pack_command
from common import REDIS_URL, drop_redis_prefix, machine, unique

Op = Callable[[], Awaitable[object]]


async def measure(op: Op, callers: int, duration: float) -> tuple[float, float]:
    """(wall us, client CPU us) per command over ``duration`` seconds."""
    done = 0
    stop = time.perf_counter() + duration

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await op()
            done += 1

    for _ in range(200):  # warm up
        await op()
    c0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall / done * 1e6, cpu / done * 1e6


async def main() -> None:
    import redis.asyncio as aredis

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    prefix = unique("wirebench")
    store = await open_store(f"{REDIS_URL}?prefix={prefix}")
    assert isinstance(store, RedisStore)
    client = aredis.Redis.from_url(REDIS_URL)
    wire = await dial(store._options)
    room = "bench"
    key = room_keys(prefix, room).record + "k"
    await store.transact(room, writes=[Put("k", {"n": 1})])
    plain = f"{prefix}:plain"
    await client.set(plain, '{"n": 1}')
    get = pack_command("GET", plain)
    arms: dict[str, Op] = {
        "redis-py GET": lambda: client.get(plain),
        "wire GET": lambda: wire.call(get),
        "redis-py EVALSHA read": lambda: client.evalsha(READ.sha, 1, key),
        "store.read": lambda: store.read(room, ["k"]),
    }
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    try:
        for _ in range(args.rounds):
            for callers in (1, 64):
                for name, op in arms.items():
                    results.setdefault((name, callers), []).append(
                        await measure(op, callers, args.duration)
                    )
    finally:
        wire.close()
        await client.aclose()
        await store.close()
        await drop_redis_prefix(prefix)

    print(f"# one Redis command: client cost per command, {machine()}")
    print(f"\n{args.rounds} rounds x {args.duration}s per arm, alternating; medians\n")
    print("| callers | arm | wall us | client CPU us | CPU vs redis-py's same command |")
    print("|---:|---|---:|---:|---:|")
    peer = {"wire GET": "redis-py GET", "store.read": "redis-py EVALSHA read"}
    for (name, callers), runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        versus = ""
        if name in peer:
            peers = results[(peer[name], callers)]
            ratios = [c / pc for (_, c), (_, pc) in zip(runs, peers, strict=True)]
            versus = f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f})"
        print(f"| {callers} | {name} | {wall:.1f} | {cpu:.1f} | {versus} |")


if __name__ == "__main__":
    asyncio.run(main())
