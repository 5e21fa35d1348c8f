"""The operator view's cost: the room page's API for a big room against reading the plan
through the library, and what open dashboards cost an idle server.

The server is a real process, ``agentrooms serve --dev`` started by this script on a free
port over the backend's store (a SQLite file in a temp dir, a per-run Redis key prefix or
a per-run PostgreSQL database, both dropped at the end). The room holds ``--tasks`` tasks
(in chains of ten: each task but every tenth depends on the one before).

1. **First screen vs library.** Alternating, ``--repeats`` times each: ``GET
   /v1/ops/rooms/R`` over one keep-alive connection (the room page's one call: stuck list,
   plan counts and first page, locks, presence, cursors, effects, contention, events),
   and ``Plan.tasks()`` through the library in this process (every task, in id order).
   Reported: median and p90 of each, and the ratio of the medians (API / library).
2. **Idle dashboards.** ``--dashboards`` clients each hold ``GET
   /v1/ops/rooms/R/stream`` open (each its own agent and connection) on an otherwise idle
   room; the server's process CPU time (utime + stime from /proc/PID/stat) over
   ``--idle`` seconds, divided by those seconds, is its share of one core.

    python3 dev.py bench ops [--backends sqlite,redis,postgres] [--tasks 10000]
        [--repeats 20] [--dashboards 10] [--idle 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from agentrooms.rooms import Rooms
from agentrooms.rooms.plan import MAX_BATCH, TaskSpec
from agentrooms.store import open_store
from common import store_url

ROOM = "ops-bench"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def specs(n: int) -> list[TaskSpec]:
    return [
        TaskSpec(f"t{i:06d}", f"task {i}", deps=[f"t{i - 1:06d}"] if i % 10 else [])
        for i in range(n)
    ]


async def seed(url: str, n: int) -> None:
    store = await open_store(url)
    try:
        room = await Rooms(store).create(ROOM)
        batch = specs(n)
        for start in range(0, n, MAX_BATCH):
            await room.plan.add(batch[start : start + MAX_BATCH])
    finally:
        await store.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spawn(url: str, port: int, cwd: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "agentrooms", "serve", "--dev", "--port", str(port)]
    with (cwd / "serve.log").open("w") as log:
        return subprocess.Popen(
            [*command, "--url", url], cwd=cwd, stdout=log, stderr=subprocess.STDOUT
        )


async def ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient() as c:
        while True:
            try:
                if (await c.get(f"{base}/readyz", timeout=1)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the server did not start (see serve.log)")
            await asyncio.sleep(0.2)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(ordered) * 1000:8.1f} ms  p90 {p90 * 1000:8.1f} ms"


async def first_screen(url: str, base: str, repeats: int) -> None:
    store = await open_store(url)
    api: list[float] = []
    library: list[float] = []
    try:
        plan = (await Rooms(store).get(ROOM)).plan
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            for i in range(repeats + 1):  # the first round warms both up, unmeasured
                t0 = time.perf_counter()
                answer = await c.get(f"/v1/ops/rooms/{ROOM}", headers={"X-Agent": "op"})
                t1 = time.perf_counter()
                tasks = await plan.tasks()
                t2 = time.perf_counter()
                if answer.status_code != 200:
                    raise SystemExit(f"GET /v1/ops/rooms/{ROOM}: {answer.status_code}")
                if i:
                    api.append(t1 - t0)
                    library.append(t2 - t1)
        total = answer.json()["plan"]["total"]
        print(f"  room page API    {summary(api)}  ({total:,} tasks counted, first page)")
        print(f"  Plan.tasks()     {summary(library)}  ({len(tasks):,} tasks read)")
        ratio = statistics.median(api) / statistics.median(library)
        print(f"  ratio API / library (medians): {ratio:.2f}")
    finally:
        await store.close()


async def idle_dashboards(base: str, pid: int, dashboards: int, seconds: float) -> None:
    opened = asyncio.Event()
    count = 0

    async def dashboard(i: int) -> None:
        nonlocal count
        async with (
            httpx.AsyncClient(base_url=base, timeout=None) as c,
            c.stream(
                "GET", f"/v1/ops/rooms/{ROOM}/stream", headers={"X-Agent": f"dash{i}"}
            ) as response,
        ):
            if response.status_code != 200:
                raise SystemExit(f"stream {i}: {response.status_code}")
            count += 1
            if count == dashboards:
                opened.set()
            async for _ in response.aiter_raw():
                pass

    tasks = [asyncio.create_task(dashboard(i)) for i in range(dashboards)]
    try:
        await asyncio.wait_for(opened.wait(), 30)
        await asyncio.sleep(1)
        c0, t0 = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(seconds)
        used, elapsed = cpu_seconds(pid) - c0, time.monotonic() - t0
        print(
            f"  {dashboards} open streams, idle {elapsed:.0f} s: server CPU {used:.2f} s "
            f"= {100 * used / elapsed:.2f}% of one core"
        )
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def one(backend: str, args: argparse.Namespace, tmp: Path) -> None:
    print(f"{backend}: {args.tasks:,} tasks")
    async with store_url(backend, tmp, "ops") as url:
        await seed(url, args.tasks)
        port = free_port()
        proc = spawn(url, port, tmp)
        base = f"http://127.0.0.1:{port}"
        try:
            await ready(base, proc)
            await first_screen(url, base, args.repeats)
            await idle_dashboards(base, proc.pid, args.dashboards, args.idle)
        finally:
            proc.terminate()
            await asyncio.to_thread(proc.wait, 30)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,redis,postgres")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dashboards", type=int, default=10)
    parser.add_argument("--idle", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            await one(backend, args, Path(tmp))


if __name__ == "__main__":
    asyncio.run(main())
