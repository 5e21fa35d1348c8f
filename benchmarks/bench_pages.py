"""Listing rooms by page: one page of rooms at a few rooms and at many, per backend.

Per backend, two stores of this run only (common.store_url): one with ``--small`` rooms,
one with ``--large``, timed in turns (each round times a call on both, so that both see
the same load). ``--rounds`` rounds time ``Rooms.page(100)`` from the
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


Calls = dict[str, Callable[[], Awaitable[RoomList]]]


async def prepare(store: Store, count: int) -> Calls:
    """Seed ``count`` rooms; the calls timed on them."""
    names = await seed(store, count)
    rooms = Rooms(store)
    middle, last = names[len(names) // 2], names[-1]
    first = await rooms.page(PAGE)
    assert len(first.rooms) == min(PAGE, count)
    return {
        "first page": lambda: rooms.page(PAGE),
        "middle page": lambda: rooms.page(PAGE, middle),
        "one-room token": lambda: rooms.page(PAGE, among=[last]),
    }


async def measure(small: Calls, large: Calls, rounds: int) -> dict[str, tuple[float, float]]:
    """Per call, the medians over ``rounds`` on the small and the large store, the two
    taken in turns (each round times both), so both see the same load."""
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in small}
    for _ in range(rounds):
        for name in small:
            for calls, out in ((small, times[name][0]), (large, times[name][1])):
                t0 = time.perf_counter()
                await calls[name]()
                out.append(time.perf_counter() - t0)
    return {name: (statistics.median(a), statistics.median(b)) for name, (a, b) in times.items()}


async def main(args: argparse.Namespace) -> None:
    print(machine())
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            async with (
                store_url(backend, Path(tmp), "pages") as small_url,
                store_url(backend, Path(tmp), "pages") as large_url,
            ):
                small_store = await open_store(small_url)
                large_store = await open_store(large_url)
                try:
                    small = await prepare(small_store, args.small)
                    large = await prepare(large_store, args.large)
                    medians = await measure(small, large, args.rounds)
                finally:
                    await small_store.close()
                    await large_store.close()
        print(f"\n{backend}: a page of {PAGE} rooms, medians of {args.rounds} rounds")
        for name, (at_small, at_large) in medians.items():
            print(
                f"  {name:15s} {args.small:>6} rooms {ms(at_small):>9}  "
                f"{args.large:>6} rooms {ms(at_large):>9}  "
                f"ratio {at_large / at_small:.2f} (goal <= 2)"
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
