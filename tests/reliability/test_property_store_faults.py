"""The properties' workloads under store faults: fences on PostgreSQL, cursors on Redis,
the outbox on PostgreSQL, each on a store the test owns
(``faults.store_under_test``: behind the TCP proxy), with the property's own faults and
a sequence of store faults injected while the workers run (the proxy's reset of a
request in flight among them). Every property holds, and the workers' calls failed
only in typed ways: a worker catches ``StoreUnavailable`` (and, over HTTP and MCP,
``UnknownOutcome``) and nothing else, so a raw driver exception would end its process
and the run with its traceback."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agentrooms.reliability.faults import (
    ClientPause,
    Fault,
    PgTerminate,
    RedisRestart,
    Rig,
    held,
    store_under_test,
)
from agentrooms.reliability.properties import PropertyReport, run_cursors, run_fences, run_outbox
from agentrooms.reliability.proxy import Blackhole, Reset, ResetInFlight

pytestmark = pytest.mark.usefixtures("services")

HOLD = 0.3  # seconds each store fault is held
GAP = 0.15  # seconds between two of them

FAULTS: dict[str, tuple[type[object], ...]] = {
    "postgres": (ResetInFlight, PgTerminate, ResetInFlight, Blackhole, Reset),
    "redis": (ResetInFlight, ClientPause, ResetInFlight, RedisRestart, Reset),
}
"""The store faults injected one after another while the run lasts, per backend
(``ClientPause``: the ``WRITE`` one); at least the first :data:`AT_LEAST` of them."""
AT_LEAST = 3


@pytest.fixture(scope="module")
def services(request: pytest.FixtureRequest) -> None:
    """Fail (CI) or skip (a laptop) when Redis or PostgreSQL does not answer."""
    request.getfixturevalue("redis_url")
    request.getfixturevalue("postgres_url")


def sequence(rig: Rig) -> list[Fault]:
    """The rig's faults named by :data:`FAULTS`, in that order."""
    chosen: list[Fault] = []
    for cls in FAULTS[rig.backend]:
        (fault,) = [
            f
            for f in rig.faults
            if isinstance(f, cls) and (not isinstance(f, ClientPause) or f.mode == "WRITE")
        ]
        chosen.append(fault)
    return chosen


async def under_store_faults(
    backend: str,
    tmp_path: Path,
    run: Callable[[str, asyncio.Event], Awaitable[PropertyReport]],
) -> tuple[PropertyReport, list[str]]:
    """``run(url, started)`` on a rig of ``backend``, with the rig's :func:`sequence`
    injected (each held :data:`HOLD` seconds) once ``started`` is set, until the run
    ends (a fault held then is healed); the report and what was injected, from the
    rig's log."""
    async with store_under_test(backend, tmp_path) as rig:
        started = asyncio.Event()

        async def inject() -> None:
            await started.wait()
            for fault in sequence(rig):
                await asyncio.sleep(GAP)
                await held(fault, HOLD)

        injector = asyncio.create_task(inject())
        try:
            report = await run(rig.url, started)
        finally:
            if not injector.done():
                injector.cancel()
            await asyncio.gather(injector, return_exceptions=True)
        injected = [what for _, what in rig.log if "heal" not in what]
    print(f"{report}; store faults {injected}")
    assert report.ok, report.anomalies
    return report, injected


def assert_bitten(report: PropertyReport, injected: list[str], backend: str) -> None:
    """The sequence's first faults were injected (the reset in flight twice among
    them), and calls met them."""
    assert AT_LEAST <= len(injected) <= len(FAULTS[backend]), injected
    assert sum("reset in flight" in w for w in injected) >= 2, injected
    assert report.unknown > 0, report


async def test_fences_hold_under_store_faults(tmp_path: Path) -> None:
    async def run(url: str, started: asyncio.Event) -> PropertyReport:
        return await run_fences(
            url,
            f"fences-{uuid.uuid4().hex[:8]}",
            workers=3,
            seed=11,
            workdir=tmp_path / "run",
            faults=True,
            started=started,
        )

    report, injected = await under_store_faults("postgres", tmp_path, run)
    assert_bitten(report, injected, "postgres")
    assert report.counts["done"] == report.counts["tasks"], report.counts


async def test_cursors_deliver_every_event_once_under_store_faults(tmp_path: Path) -> None:
    async def run(url: str, started: asyncio.Event) -> PropertyReport:
        return await run_cursors(
            url,
            f"cursors-{uuid.uuid4().hex[:8]}",
            workers=2,
            seed=12,
            workdir=tmp_path / "run",
            faults=True,
            started=started,
        )

    report, injected = await under_store_faults("redis", tmp_path, run)
    assert_bitten(report, injected, "redis")


async def test_outbox_effects_are_performed_once_or_reconciled_under_store_faults(
    tmp_path: Path,
) -> None:
    async def run(url: str, started: asyncio.Event) -> PropertyReport:
        return await run_outbox(
            url,
            f"outbox-{uuid.uuid4().hex[:8]}",
            workers=3,
            seed=13,
            workdir=tmp_path / "run",
            faults=True,
            started=started,
        )

    report, injected = await under_store_faults("postgres", tmp_path, run)
    assert_bitten(report, injected, "postgres")
