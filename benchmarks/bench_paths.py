"""Path reservations: what one reservation costs with 10, 1,000 and 10,000 held in the room.

Per backend, one store of this run only (common.store_url) with a room per size, filled
with that many live reservations by distinct agents (a third each ``pkg<i>/**``,
``pkg<i>/src/*.py`` and ``pkg<i>/README.md``). Then ``--rounds`` rounds time:

* ``reserve``: a grant of a fresh disjoint pattern ``new/<n>/*.py``;
* ``refused``: a reservation of ``pkg<i>/src/a.py`` that overlaps a held ``pkg<i>/**``;
* ``release``: releasing the grant of that round;
* ``check 10``: ``check`` of ten staged paths under ``pkg<i>/`` (a commit hook's call);
* ``lock (baseline)``: ``try_acquire`` of a free named lock in the same room, a write
  of about the same size for comparison.

Also counted: the index records the grant's scans read (``records read``), which should
not grow with the number held. Reported: medians, and the 10,000 / 10 ratio.

    python3 dev.py bench paths [--backends sqlite,redis,postgres] [--sizes 10,1000,10000]
        [--rounds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrooms import Rooms, open_store
from agentrooms.errors import PathsReserved
from agentrooms.rooms import Reservation, Room
from agentrooms.store import ScanPage, Store
from common import machine, ms, store_url


def held_pattern(i: int) -> str:
    return [f"pkg{i:05d}/**", f"pkg{i:05d}/src/*.py", f"pkg{i:05d}/README.md"][i % 3]


def held_dir(n: int, count: int) -> str:
    """The directory of a held ``pkg<i>/**`` (``i`` a multiple of 3), spread by ``n``."""
    return f"pkg{3 * (n % max(1, count // 3)):05d}"


async def seed(room: Room, count: int) -> None:
    for i in range(count):  # (grants in one room take turns on its fencing counter)
        await room.paths.reserve([held_pattern(i)], f"agent{i % 97}", ttl=3600)


class Counted:
    """Counts the records the store's scans return while on."""

    def __init__(self, store: Store) -> None:
        self.read, self._scan = 0, store.scan

        async def scan(*args: Any, **kwargs: Any) -> ScanPage:
            page = await self._scan(*args, **kwargs)
            self.read += len(page.records)
            return page

        store.scan = scan  # type: ignore[method-assign]


class Arms:
    """The timed operations on one room of ``count`` reservations."""

    def __init__(self, room: Room, count: int) -> None:
        self.room, self.paths, self.count = room, room.paths, count
        self.grants: list[Reservation] = []

    async def reserve(self, n: int) -> None:
        self.grants.append(await self.paths.reserve([f"new/{n}/*.py"], "bench", ttl=600))

    async def refused(self, n: int) -> None:
        try:
            await self.paths.reserve([f"{held_dir(n, self.count)}/src/a.py"], "bench")
        except PathsReserved:
            return
        raise AssertionError("a reservation of a held path was granted")

    async def release(self, n: int) -> None:
        assert await self.paths.release(self.grants[n].id, "bench")

    async def lock(self, n: int) -> None:
        await self.room.locks.try_acquire(f"lock-{n}", "bench")

    async def check(self, n: int) -> None:
        base = held_dir(n, self.count)
        assert await self.paths.check([f"{base}/src/m{k}.py" for k in range(10)], "bench")


ARMS = ("reserve", "refused", "release", "check", "lock")
NAMES = {
    "reserve": "reserve",
    "refused": "refused",
    "release": "release",
    "check": "check 10",
    "lock": "lock (baseline)",
}


async def measure(store: Store, sizes: list[int], rounds: int) -> dict[int, dict[str, float]]:
    """Seed a room per size, then time each arm round-robin over the sizes (so that a
    noisy moment of a shared machine falls on every size alike)."""
    arms: dict[int, Arms] = {}
    for size in sizes:
        room = await Rooms(store).create(f"paths-{size}")
        await seed(room, size)
        arms[size] = Arms(room, size)
    await Arms(await Rooms(store).create("paths-warm"), 1).reserve(0)
    counted = Counted(store)
    times: dict[int, dict[str, list[float]]] = {s: {a: [] for a in ARMS} for s in sizes}
    read = dict.fromkeys(sizes, 0)
    for arm in ARMS:
        for n in range(rounds):
            for size in sizes:
                before = counted.read
                t0 = time.perf_counter()
                await getattr(arms[size], arm)(n)
                times[size][arm].append(time.perf_counter() - t0)
                if arm == "reserve":
                    read[size] += counted.read - before
    out = {}
    for size in sizes:
        out[size] = {NAMES[a]: statistics.median(times[size][a]) for a in ARMS}
        out[size]["records read"] = read[size] / rounds
    return out


async def main(args: argparse.Namespace) -> None:
    print(machine())
    sizes = [int(s) for s in args.sizes.split(",")]
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            async with store_url(backend, Path(tmp), "paths") as url:
                store = await open_store(url)
                try:
                    results = await measure(store, sizes, args.rounds)
                finally:
                    await store.close()
        print(f"\n{backend}: milliseconds, medians of {args.rounds} rounds, by reservations held")
        print(f"  {'':16s}" + "".join(f"{s:>10}" for s in sizes) + "     ratio")
        for name in results[sizes[0]]:
            row = [results[s][name] for s in sizes]
            cells = "".join(
                f"{v:>10.1f}" if name == "records read" else f"{ms(v):>10}" for v in row
            )
            print(
                f"  {name:16s}{cells}  {row[-1] / row[0]:8.2f}"
                if row[0]
                else f"  {name:16s}{cells}"
            )


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="sqlite,redis,postgres")
    p.add_argument("--sizes", default="10,1000,10000")
    p.add_argument("--rounds", type=int, default=30)
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
