"""What a CRDT read costs by the number of replica records, and what compaction costs.

For each backend and each count R: R replicas each push a G-counter holding their own
slot (``crdt/<key>/<replica>`` records), then ``load`` merges them (median of
``--reads``), ``compact`` folds them into the base, and ``load`` reads the compacted
value. Prints milliseconds per call; the writes' rate is `agentrooms bench --policies
log,crdt` (BENCHMARKS.md section 8).

    python3 dev.py bench crdt [--backends sqlite,redis,postgres] [--replicas 1,64,1000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from agentrooms.crdt import GCounter, compact, load, push
from agentrooms.store import open_store
from common import machine, store_url, unique


async def measure(backend: str, counts: list[int], reads: int, tmp: Path) -> None:
    async with store_url(backend, tmp, "crdt") as url:
        store = await open_store(url)
        try:
            for count in counts:
                room = unique("crdt-read")
                nodes = [f"n{i}" for i in range(count)]
                await asyncio.gather(
                    *(push(store, room, "c", GCounter().increment(n), replica=n) for n in nodes)
                )
                times = []
                for _ in range(reads):
                    started = time.perf_counter()
                    value = await load(store, room, "c", GCounter, compact_above=None)
                    times.append(time.perf_counter() - started)
                assert value is not None and value.value == count
                started = time.perf_counter()
                assert await compact(store, room, "c", GCounter) == count
                compacted = time.perf_counter() - started
                started = time.perf_counter()
                assert await load(store, room, "c", GCounter) == value
                after = time.perf_counter() - started
                print(
                    f"| {backend} | {count:,} | {statistics.median(times) * 1000:.2f} "
                    f"| {compacted * 1000:.1f} | {after * 1000:.2f} |",
                    flush=True,
                )
                await store.delete_room(room)
        finally:
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,redis,postgres")
    parser.add_argument("--replicas", default="1,64,1000")
    parser.add_argument("--reads", type=int, default=5)
    args = parser.parse_args()
    print(machine())
    print("| backend | replica records | load ms | compact ms | load after compaction ms |")
    print("|---|---:|---:|---:|---:|")
    counts = [int(c) for c in args.replicas.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            asyncio.run(measure(backend, counts, args.reads, Path(tmp)))


if __name__ == "__main__":
    main()
