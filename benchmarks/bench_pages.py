"""Listing rooms by page: one page of rooms at a few rooms and at many, per backend.

Per backend, two stores of this run only (common.store_url): one with ``--small`` rooms,
one with ``--large``. In each, ``--rounds`` rounds time ``Rooms.page(100)`` from the
start, ``Rooms.page(100, after=<the middle room>)`` and the page of a token allowed one
room (the last one) (``among=``, as ``GET /v1/rooms`` asks for a token that names
its rooms). Reported: the median of each, and the ratio of the
large store's median to the small one's (issue 24's goal: at most 2).

    python3 dev.py bench pages [--backends sqlite,redis,postgres] [--small 10]
        [--large 10000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from agentrooms import Rooms, open_store
from agentrooms.rooms import RoomList
from agentrooms.store import Store
from common import machine, ms, store_url

PAGE = 100


async def seed(store: Store, count: int) -> list[str]:
    names = [f"room-{i:06d}" for i in range(count)]
    rooms = Rooms(store)
    for at in range(0, count, 200):
        await asyncio.gather(*(rooms.create(n) for n in names[at : at + 200]))
    return names


async def timed(rounds: int, call: Callable[[], Awaitable[RoomList]]) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def measure(url: str, count: int, rounds: int) -> dict[str, float]:
    store = await open_store(url)
    try:
        names = await seed(store, count)
        rooms = Rooms(store)
        middle, last = names[len(names) // 2], names[-1]
        first = await rooms.page(PAGE)
        assert len(first.rooms) == min(PAGE, count)
        return {
            "first page": await timed(rounds, lambda: rooms.page(PAGE)),
            "middle page": await timed(rounds, lambda: rooms.page(PAGE, middle)),
            "one-room token": await timed(rounds, lambda: rooms.page(PAGE, among=[last])),
        }
    finally:
        await store.close()


async def main(args: argparse.Namespace) -> None:
    print(machine())
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            async with store_url(backend, Path(tmp), "pages") as small_url:
                small = await measure(small_url, args.small, args.rounds)
            async with store_url(backend, Path(tmp), "pages") as large_url:
                large = await measure(large_url, args.large, args.rounds)
        print(f"\n{backend}: a page of {PAGE} rooms, medians of {args.rounds} rounds")
        for name in small:
            ratio = large[name] / small[name]
            print(
                f"  {name:15s} {args.small:>6} rooms {ms(small[name]):>9}  "
                f"{args.large:>6} rooms {ms(large[name]):>9}  ratio {ratio:.2f} (goal <= 2)"
            )


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="sqlite,redis,postgres")
    p.add_argument("--small", type=int, default=10)
    p.add_argument("--large", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=15)
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
