"""The properties on demand: many recorded runs of one property on one backend and
surface (``agentrooms torture --property``).

:func:`run_properties` provisions the store once (isolated to the run unless a URL is
given), starts the server processes of the HTTP and MCP surfaces once, then records and
checks runs one after another until a number of runs or minutes. Run ``i`` has seed
``seed + i`` and fresh rooms; with faults each run injects its property's own (see
:mod:`agentrooms.reliability.properties`) and, over HTTP or MCP, one ``kill -9`` of a
server a moment after the workers start, which is restarted on its port. A run with an
anomaly is saved to ``out``: its journals and a ``.meta.json`` with the seed, the
anomalies and the command that replays it.

The outbox runs through the library only: neither the HTTP API nor MCP exposes effects
(a side effect is performed by the worker process that holds it; see
docs/reliability.md), so ``--surface http|mcp`` with it is refused as a bad request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentrooms.reliability.properties.common import PropertyReport
from agentrooms.reliability.properties.cursors import run_cursors
from agentrooms.reliability.properties.fences import run_fences
from agentrooms.reliability.properties.outbox import run_outbox
from agentrooms.reliability.servers import ServerProcess
from agentrooms.reliability.torture.settings import check_target, check_url

__all__ = [
    "PROPERTIES",
    "PropertyRun",
    "PropertySettings",
    "PropertySummary",
    "run_properties",
]

PROPERTIES = ("fences", "cursors", "outbox")


@dataclass(frozen=True, slots=True)
class PropertySettings:
    """Runs of ``property`` on ``backend`` through ``surface``; run ``i`` has seed
    ``seed + i``; it stops after ``runs`` runs or ``minutes`` (the first reached; at
    least one is set). ``workers``: workers per run; ``faults``: inject faults;
    ``url``: the store (default: one isolated to the run); ``servers``: server
    processes (HTTP, MCP)."""

    property: str
    backend: str
    surface: str = "library"
    seed: int = 0
    runs: int | None = None
    minutes: float | None = None
    workers: int = 3
    faults: bool = True
    url: str | None = None
    servers: int = 2

    def validate(self) -> None:
        """``ValueError`` (``Unsupported``, with the reason) if the runs cannot be done as
        asked."""
        if self.property not in PROPERTIES:
            raise ValueError(f"unknown property {self.property!r}; known: {', '.join(PROPERTIES)}")
        check_target(self.backend, self.surface)
        if self.property == "outbox" and self.surface != "library":
            raise ValueError(
                "the outbox is checked through the library only: neither the HTTP API nor "
                "MCP exposes effects (docs/reliability.md says why)"
            )
        if self.workers < 1 or self.servers < 2:
            raise ValueError("workers must be at least 1, servers at least 2")
        if self.runs is None and self.minutes is None:
            raise ValueError("give a number of runs (--histories) or of minutes")
        check_url(self.url, self.backend)

    def replay(self, seed: int) -> str:
        """The command that records run ``seed`` again, alone."""
        cmd = ["agentrooms", "torture", "--property", self.property, "--backend", self.backend]
        cmd += ["--surface", self.surface, "--seed", str(seed), "--histories", "1"]
        cmd += ["--clients", str(self.workers)]
        if self.surface != "library":
            cmd += ["--servers", str(self.servers)]
        if not self.faults:
            cmd.append("--no-faults")
        return shlex.join(cmd)


@dataclass(frozen=True, slots=True)
class PropertyRun:
    """One run: its seed, the report, and where it was saved if it failed."""

    seed: int
    report: PropertyReport
    server_faults: int
    saved: Path | None


@dataclass(slots=True)
class PropertySummary:
    """The totals of the runs (``ok``: at least one run, no anomaly)."""

    settings: PropertySettings
    runs: int = 0
    operations: int = 0
    unknown: int = 0
    anomalies: int = 0
    faults: int = 0
    server_faults: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    failing: list[PropertyRun] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.runs > 0 and not self.failing

    def add(self, run: PropertyRun) -> None:
        self.runs += 1
        self.operations += run.report.operations
        self.unknown += run.report.unknown
        self.anomalies += len(run.report.anomalies)
        self.faults += run.report.faults
        self.server_faults += run.server_faults
        self.counts.update(run.report.counts)
        if not run.report.ok:
            self.failing.append(run)


@contextlib.asynccontextmanager
async def _servers(
    settings: PropertySettings, url: str, workdir: Path
) -> AsyncIterator[list[ServerProcess]]:
    """The run's server processes (none on the library surface), stopped on exit."""
    if settings.surface == "library":
        yield []
        return
    procs = [ServerProcess(url, workdir) for _ in range(settings.servers)]
    try:
        await procs[0].start()  # the first one prepares the store alone
        await asyncio.gather(*(p.start() for p in procs[1:]))
        yield procs
    finally:
        for p in procs:
            p.stop()


async def _one(
    settings: PropertySettings, url: str, procs: list[ServerProcess], seed: int, workdir: Path
) -> tuple[PropertyReport, int]:
    """Record and check run ``seed``; its report and the server faults injected."""
    room = f"prop-{settings.property}-{uuid.uuid4().hex[:10]}"
    started = asyncio.Event()
    fault: asyncio.Task[int] | None = None
    if procs and settings.faults:
        fault = asyncio.create_task(_kill_a_server(procs[seed % len(procs)], started))
    workers, faults = settings.workers, settings.faults
    try:
        if settings.property == "outbox":
            report = await run_outbox(
                url,
                room,
                workers=workers,
                seed=seed,
                workdir=workdir,
                faults=faults,
                started=started,
            )
        else:
            runner = run_fences if settings.property == "fences" else run_cursors
            report = await runner(
                url,
                room,
                workers=workers,
                seed=seed,
                workdir=workdir,
                faults=faults,
                servers=[p.base for p in procs],
                surface=settings.surface,
                started=started,
            )
    except BaseException:
        if fault is not None:
            fault.cancel()
            with contextlib.suppress(BaseException):
                await fault
        raise
    return report, 0 if fault is None else await fault


async def _kill_a_server(proc: ServerProcess, started: asyncio.Event) -> int:
    """``kill -9`` of ``proc`` a moment after the workers started, then its restart on
    its port; the faults injected (1)."""
    await started.wait()
    await asyncio.sleep(0.2)
    proc.kill()
    await proc.start()
    return 1


def _save(
    out: Path, settings: PropertySettings, seed: int, report: PropertyReport, work: Path
) -> Path:
    """Save a failing run's journals and its ``.meta.json``; the folder."""
    folder = out / f"{settings.property}-{settings.backend}-{settings.surface}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    for journal in work.glob("*.jsonl"):
        shutil.copy2(journal, folder / journal.name)
    meta = {
        "property": settings.property,
        "backend": settings.backend,
        "surface": settings.surface,
        "seed": seed,
        "anomalies": report.anomalies,
        "counts": report.counts,
        "replay": settings.replay(seed),
    }
    (folder / f"seed{seed}.meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return folder


async def run_properties(
    settings: PropertySettings,
    out: str | Path,
    *,
    on_run: Callable[[PropertyRun, PropertySummary], None] | None = None,
) -> PropertySummary:
    """Record and check runs of ``settings`` one after another until ``settings.runs``
    or ``settings.minutes``, saving each failing one to ``out``; the totals. ``on_run``
    is called after each. ``ValueError`` if the runs cannot be done as asked; a store
    that cannot be reached raises the store's error; a server or worker process that
    fails raises ``RuntimeError``."""
    from agentrooms.reliability.stores import provision

    settings.validate()
    summary = PropertySummary(settings)
    started = time.monotonic()
    deadline = None if settings.minutes is None else started + 60 * settings.minutes
    with tempfile.TemporaryDirectory(prefix="agentrooms-properties-") as tmp:
        async with (
            provision(None if settings.url else settings.backend, settings.url) as target,
            _servers(settings, target.url, Path(tmp)) as procs,
        ):
            index = 0
            while (settings.runs is None or index < settings.runs) and (
                deadline is None or time.monotonic() < deadline
            ):
                seed = settings.seed + index
                work = Path(tmp) / f"run-{index}"
                report, server_faults = await _one(settings, target.url, procs, seed, work)
                saved = None if report.ok else _save(Path(out), settings, seed, report, work)
                run = PropertyRun(seed, report, server_faults, saved)
                summary.add(run)
                summary.seconds = time.monotonic() - started
                if on_run is not None:
                    on_run(run, summary)
                index += 1
    summary.seconds = time.monotonic() - started
    return summary
