"""The operator API: the room page of a big room against reading its plan, and the cost
of open dashboards to an idle server.

Per backend, a room of ``--tasks`` tasks (chains of 1,000) in a store of this run only
(common.store_url), served by a real server process (bench_http's: uvicorn running the
app as ``agentrooms serve --dev`` builds it):

* ``page``: ``--rounds`` rounds, each timing, in this order, the library's plan read
  (``room.plan.tasks()`` in this process), ``Ops.room`` in this process serialised to
  JSON, and ``GET /v1/ops/rooms/R`` from the server over a keep-alive connection. Reported:
  the median and best of each, and the ratio of the API's median to the library's
  (issue 22's goal: at most 2);
* ``idle``: ``--dashboards`` change streams (``GET /v1/ops/rooms/R/stream``, each as its
  own agent, as each dashboard takes one of its agent's stream slots) held open for
  ``--idle`` seconds with nothing happening, against the same seconds with none open.
  Reported: the server process's CPU time (/proc/PID/stat) over the window, as a share of
  one core (goal: at most 10% with ten dashboards).

    python3 dev.py bench ops [--backends sqlite,redis,postgres] [--tasks 10000]
        [--rounds 7] [--dashboards 10] [--idle 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench_http import Server, server_process
from common import machine, store_url, unique

CHAIN = 1000  # tasks per batch, each batch a chain


async def seed(url: str, room: str, tasks: int) -> None:
    from agentrooms.rooms import Rooms, TaskSpec
    from agentrooms.store import open_store

    store = await open_store(url)
    try:
        r = await Rooms(store).create(room)
        for start in range(0, tasks, CHAIN):
            specs = [
                TaskSpec(f"t{i:06d}", deps=[f"t{i - 1:06d}"] if i % CHAIN else [])
                for i in range(start, min(start + CHAIN, tasks))
            ]
            await r.plan.add(specs)
    finally:
        await store.close()


async def page(url: str, base: str, room: str, rounds: int) -> dict[str, list[float]]:
    from agentrooms.ops import Ops, as_json
    from agentrooms.rooms import Rooms
    from agentrooms.store import open_store

    times: dict[str, list[float]] = {"plan.tasks()": [], "Ops.room": [], "HTTP page": []}
    store = await open_store(url)
    try:
        plan = Rooms(store).room(room).plan
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for _ in range(rounds):
                t = time.perf_counter()
                assert len(await plan.tasks()) > 0
                times["plan.tasks()"].append(time.perf_counter() - t)
                t = time.perf_counter()
                json.dumps(as_json(await Ops(store).room(room)))
                times["Ops.room"].append(time.perf_counter() - t)
                t = time.perf_counter()
                response = await http.get(f"/v1/ops/rooms/{room}", headers={"X-Agent": "ops"})
                response.raise_for_status()
                times["HTTP page"].append(time.perf_counter() - t)
    finally:
        await store.close()
    return times


async def idle_cpu(server: Server, room: str, streams: int, seconds: float) -> float:
    """The server's CPU seconds over ``seconds`` with ``streams`` change streams open."""
    base, cpu = server.base, server.cpu_seconds

    async def hold(i: int, opened: asyncio.Event) -> None:
        async with (
            httpx.AsyncClient(base_url=base, timeout=None) as http,
            http.stream(
                "GET", f"/v1/ops/rooms/{room}/stream", headers={"X-Agent": f"dash{i}"}
            ) as response,
        ):
            response.raise_for_status()
            async for _ in response.aiter_bytes():
                opened.set()

    events = [asyncio.Event() for _ in range(streams)]
    holders = [asyncio.create_task(hold(i, e)) for i, e in enumerate(events)]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 30)
        await asyncio.sleep(1.0)  # let the connects settle
        before = cpu()
        await asyncio.sleep(seconds)
        return float(cpu() - before)
    finally:
        for task in holders:
            task.cancel()
        for task in holders:
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await task


def show(name: str, values: list[float]) -> str:
    median, best = statistics.median(values) * 1000, min(values) * 1000
    return f"{name:14} median {median:8.1f} ms  best {best:8.1f} ms"


async def main(args: argparse.Namespace) -> None:
    print(machine())
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            async with store_url(backend, Path(tmp), "ops") as url:
                room = unique("ops")
                await seed(url, room, args.tasks)
                async with server_process(url, Path(tmp) / "server.log") as server:
                    times = await page(url, server.base, room, args.rounds)
                    print(f"\n{backend}: a room of {args.tasks} tasks, {args.rounds} rounds")
                    for name, values in times.items():
                        print("  " + show(name, values))
                    ratio = statistics.median(times["HTTP page"]) / statistics.median(
                        times["plan.tasks()"]
                    )
                    print(f"  HTTP page / plan.tasks() (medians): {ratio:.2f} (goal <= 2)")
                    if args.idle:
                        quiet = await idle_cpu(server, room, 0, args.idle)
                        busy = await idle_cpu(server, room, args.dashboards, args.idle)
                        print(
                            f"  idle server, {args.idle:.0f} s: no dashboard "
                            f"{quiet / args.idle:.1%} of a core, {args.dashboards} dashboards "
                            f"{busy / args.idle:.1%} (goal <= 10%)"
                        )


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="sqlite,redis,postgres")
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dashboards", type=int, default=10)
    p.add_argument("--idle", type=float, default=20.0)
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
