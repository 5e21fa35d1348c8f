"""Shared pieces of the benchmark scripts: closed-loop runs, percentiles, tables."""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REDIS_URL = os.environ.get("AGENTROOMS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_ADMIN_URL = os.environ.get(
    "AGENTROOMS_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@dataclass
class Arm:
    """One measured run: latencies of successful operations, plus failures."""

    name: str
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def closed_loop(
    name: str,
    workers: int,
    duration: float,
    make_op: Callable[[int], Awaitable[Callable[[], Awaitable[None]]]],
) -> Arm:
    """Run ``workers`` loops for ``duration`` seconds; each calls its op back to back.
    The ops are made concurrently, so a client that opens connections on demand has
    opened them before the timing starts, as the raw arms' pools have."""
    ops = await asyncio.gather(*(make_op(w) for w in range(workers)))
    arm = Arm(name)
    stop = time.perf_counter() + duration

    async def loop(op: Callable[[], Awaitable[None]]) -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await op()
            arm.latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(op) for op in ops))
    arm.elapsed = time.perf_counter() - t0
    return arm


def median_arm(arms: list[Arm]) -> Arm:
    """The repetition with the median rate (ranges are reported beside it)."""
    ordered = sorted(arms, key=lambda a: a.rate)
    return ordered[len(ordered) // 2]


def spread(arms: list[Arm]) -> str:
    rates = [a.rate for a in arms]
    return f"{min(rates):,.0f}-{max(rates):,.0f}"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    return (
        f"{platform.system()} {platform.release()}, {os.cpu_count()} cores ({cpu}), "
        f"Python {platform.python_version()}"
    )


class CpuMeter:
    """How busy the whole machine and this process were between ``start`` and ``stop``,
    as shares of all its cores (Linux ``/proc/stat``; ``None`` elsewhere). On a machine
    that runs nothing else, the machine share is the client's plus the servers'."""

    def __init__(self) -> None:
        self.machine: float | None = None
        self.client: float | None = None

    @staticmethod
    def _ticks() -> tuple[int, int] | None:
        try:
            first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        except OSError:
            return None
        values = [int(v) for v in first[1:9]]
        return sum(values), values[3] + values[4]  # total, idle + iowait

    def start(self) -> None:
        self._t0, self._p0, self._ticks0 = time.perf_counter(), time.process_time(), self._ticks()

    def stop(self) -> None:
        wall = time.perf_counter() - self._t0
        self.client = (time.process_time() - self._p0) / wall / (os.cpu_count() or 1)
        ticks = self._ticks()
        if ticks is not None and self._ticks0 is not None:
            total, idle = ticks[0] - self._ticks0[0], ticks[1] - self._ticks0[1]
            self.machine = 1 - idle / total if total else None


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def ratio_stats(pairs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Median, min and max of ours/raw over paired repetitions."""
    ratios = [a / b for a, b in pairs if b]
    return statistics.median(ratios), min(ratios), max(ratios)


# ------------------------------------------------------------------------ provisioning


@asynccontextmanager
async def postgres_database() -> AsyncIterator[str]:
    """A PostgreSQL database of its own for this run, dropped at the end."""
    import asyncpg

    name = unique("agentrooms_bench").replace("-", "_")
    admin = await asyncpg.connect(POSTGRES_ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(POSTGRES_ADMIN_URL)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, f"/{name}", "", ""))
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def drop_redis_prefix(prefix: str) -> None:
    import redis.asyncio as redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@asynccontextmanager
async def store_url(backend: str, tmp: Path, tag: str = "bench") -> AsyncIterator[str]:
    """A store for this run only: a SQLite file in ``tmp``, a Redis key prefix (deleted
    at the end), a PostgreSQL database (dropped at the end), or ``memory://``."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp / unique(tag)}.db"
    elif backend == "redis":
        prefix = unique(f"ar{tag}")
        try:
            yield f"{REDIS_URL}?prefix={prefix}"
        finally:
            await drop_redis_prefix(prefix)
    elif backend == "postgres":
        async with postgres_database() as url:
            yield url
    elif backend == "memory":
        yield "memory://"
    else:
        raise SystemExit(f"unknown backend {backend!r}")
