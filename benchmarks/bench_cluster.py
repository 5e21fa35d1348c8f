"""Single-record transact on a Redis Cluster: agentrooms vs redis-py's own cluster client.

8 concurrent writers, each doing compare-and-set on its own key back to back (closed
loop), each writer in a room of its own so the writers spread over the primaries. The raw
arm is ``redis.asyncio.RedisCluster`` running the same small CAS Lua script as
``bench_transact.py``'s redis arm (EVALSHA on the key's primary), one hash-tagged key
per writer. Arms alternate (ours, raw, ours, raw, ...); the ratio is the median over
paired repetitions.

The cluster is started for the run (3 primaries, one replica each, as the tests'
fixture: ``tests/cluster_fixture.py``) unless ``AGENTROOMS_BENCH_CLUSTER_URL`` names one
(``redis+cluster://host:port,...``).

    python3 dev.py bench cluster [--duration 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

from agentrooms.store import open_store
from bench_transact import WRITERS, lua_cas_arm, store_cas_arm
from common import Arm, machine, median_arm, ms, ratio_stats, spread, unique

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.cluster_fixture import start_cluster  # from the repository root, added above


async def ours_arm(url: str, duration: float) -> Arm:
    store = await open_store(f"{url}?prefix={unique('arbench')}")
    places = [(unique(f"bench{w}"), "k") for w in range(WRITERS)]
    try:
        return await store_cas_arm("agentrooms redis+cluster", store, places.__getitem__, duration)
    finally:
        await store.close()


async def raw_arm(host: str, port: int, duration: float) -> Arm:
    from redis.asyncio import RedisCluster

    client = RedisCluster(host=host, port=port)
    await client.initialize()
    prefix = unique("rawbench")
    keys: list[str] = []

    def key_of(w: int) -> str:
        keys.append(f"{{{prefix}:{w}}}:k")
        return keys[-1]

    try:
        return await lua_cas_arm("raw redis-py RedisCluster Lua CAS", client, key_of, duration)
    finally:
        for key in keys:
            await client.delete(key)
        await client.aclose()


async def run(url: str, duration: float, rounds: int) -> tuple[list[Arm], list[Arm]]:
    seed = url.split("://", 1)[1].split(",", 1)[0].split("/", 1)[0]
    host, _, port = seed.rpartition(":")
    ours, raws = [], []
    for _ in range(rounds):
        ours.append(await ours_arm(url, duration))
        raws.append(await raw_arm(host, int(port), duration))
    return ours, raws


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    given = os.environ.get("AGENTROOMS_BENCH_CLUSTER_URL")
    cluster = None if given else start_cluster(Path(tempfile.mkdtemp(prefix="bench-cluster-")))
    try:
        url = given or (cluster.url() if cluster else "")
        url = url.rstrip("/") + "/"
        all_ours, all_raw = await run(url, args.duration, args.rounds)
    finally:
        if cluster is not None:
            cluster.close()
    print(f"# transact on a Redis Cluster vs redis-py RedisCluster, {WRITERS} writers")
    print(f"\n{machine()}; {args.rounds} rounds x {args.duration}s per arm, alternating")
    print("3 primaries + 3 replicas on this machine (loopback)\n")
    print("| arm | commits/s (median) | range | p50 ms | p99 ms | agentrooms/this arm |")
    print("|---|---:|---:|---:|---:|---:|")
    ours, raw = median_arm(all_ours), median_arm(all_raw)
    print(
        f"| {ours.name} | {ours.rate:,.0f} | {spread(all_ours)} | "
        f"{ms(ours.pct(0.5))} | {ms(ours.pct(0.99))} | |"
    )
    med, lo, hi = ratio_stats([(o.rate, r.rate) for o, r in zip(all_ours, all_raw, strict=True)])
    print(
        f"| {raw.name} | {raw.rate:,.0f} | {spread(all_raw)} | {ms(raw.pct(0.5))} | "
        f"{ms(raw.pct(0.99))} | **{med:.0%}** ({lo:.0%}-{hi:.0%}) |"
    )


if __name__ == "__main__":
    asyncio.run(main())
