"""The fold cost of one aggregate of 4,000 events, with and without snapshots.

Appends 4,000 events to one aggregate (in batches of 100), then loads it repeatedly
from its latest snapshot and by replaying the whole stream, per backend; reports the
median load time of each and the ratio. State equality is checked every time.

    python3 dev.py bench sourcing [--backends sqlite,redis,postgres] [--events 4000] [--loads 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrooms.sourcing import Aggregate, Aggregates, DomainEvent
from agentrooms.store import open_store
from common import machine, ms, store_url, unique


def fold(state: dict[str, Any], event: DomainEvent) -> dict[str, Any]:
    return {"n": state.get("n", 0) + 1, "sum": state.get("sum", 0) + event.data["v"]}


def aggregate(snapshot_every: int) -> Aggregate[dict[str, Any]]:
    return Aggregate("counter", dict, fold, {"Added": 1}, snapshot_every=snapshot_every)


async def measure(url: str, events: int, loads: int) -> tuple[float, float, int]:
    store = await open_store(url)
    try:
        room = unique("fold")
        agg = Aggregates(store, room, aggregate(snapshot_every=100))
        for start in range(0, events, 100):
            batch = [DomainEvent.of("Added/v1", {"v": i}) for i in range(start, start + 100)]
            await agg.append("a", batch, expected_version=start)
        with_snap, full = [], []
        expected = {"n": events, "sum": events * (events - 1) // 2}
        for _ in range(loads):
            t0 = time.perf_counter()
            loaded = await agg.load("a")
            with_snap.append(time.perf_counter() - t0)
            assert loaded.state == expected and loaded.snapshot > 0
            t0 = time.perf_counter()
            replayed = await agg.load("a", snapshots=False)
            full.append(time.perf_counter() - t0)
            assert replayed.state == expected and replayed.snapshot == 0
        return statistics.median(with_snap), statistics.median(full), loaded.snapshot
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sqlite,redis,postgres")
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--loads", type=int, default=20)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            async with store_url(backend, Path(tmp), "fold") as url:
                rows.append((backend, *await measure(url, args.events, args.loads)))
    print(f"# fold cost of one aggregate of {args.events} events\n\n{machine()}\n")
    print("| backend | load from snapshot ms | full replay ms | replay / snapshot | snapshot at |")
    print("|---|---:|---:|---:|---:|")
    for backend, snap, full, at in rows:
        print(f"| {backend} | {ms(snap)} | {ms(full)} | {full / snap:.1f}x | event {at} |")


if __name__ == "__main__":
    asyncio.run(main())
