"""What the property recorders share: the report, the journal, and the workers' supervisor.

The journal is JSON lines, one file per worker incarnation. A call's line (``c`` the
client, ``n`` its number, ``key``, ``op``, ``input``, ``call``) is written and flushed
*before* the call, its return's line (``c``, ``n``, ``output``, ``return``) after it,
so a worker killed mid-call leaves a call without a return: an unknown outcome. Times
are ``time.monotonic_ns()`` (one clock for every process of the machine). Merged, a
journal is a list of :class:`~agentrooms.reliability.history.Operation`.

A :class:`Supervisor` runs workers (processes, or tasks of this process for
``memory://``) and restarts each one killed by a fault as a new client (a new
incarnation), until each exits cleanly; :func:`supervised` starts one, lets its
workers go together and ends it on the way out. What every worker life shares is here
too: its journal's path (:func:`life`), the life of a task (:func:`task_life`) or of a
process (:func:`worker_process`, :func:`worker_main`), and its seeded death
(:func:`die_at`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from agentrooms.errors import StoreUnavailable
from agentrooms.reliability.history import Operation
from agentrooms.reliability.outcomes import UnknownOutcome

__all__ = [
    "INCARNATIONS",
    "UNKNOWN",
    "Closer",
    "Journal",
    "Killed",
    "Processes",
    "PropertyReport",
    "Supervisor",
    "abandon",
    "die",
    "die_at",
    "kill_point",
    "life",
    "load_journals",
    "prepare",
    "ready_then_wait",
    "settled",
    "supervised",
    "surface_of",
    "task_life",
    "touch",
    "worker_main",
    "worker_process",
]

T = TypeVar("T")

INCARNATIONS = 100
"""Client ids are ``slot * INCARNATIONS + incarnation``: one per life of a worker."""

CONNECT_BUDGET = 30.0
"""Seconds a worker process tries to open its store (or client) while it is out of reach."""

UNKNOWN = (StoreUnavailable, UnknownOutcome, TimeoutError)
"""What a worker's call may raise when its outcome is unknown: the library's
``StoreUnavailable``, what an HTTP or MCP caller saw (``UnknownOutcome``), or a deadline.
Nothing else is caught: a raw driver exception ends the worker, and so the run, with
its traceback."""


@dataclass(frozen=True, slots=True)
class PropertyReport:
    """One recorded run of a property: the calls it made (``operations``), those with an
    unknown outcome, the anomalies the checker found, the faults injected, and counts
    that say what the run exercised (named per property)."""

    name: str
    operations: int
    unknown: int
    anomalies: list[str]
    faults: int
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.anomalies


class Killed(BaseException):
    """A fault ends a worker that is a task (the counterpart of ``kill -9`` of a process):
    nothing after it runs, nothing is cleaned up."""


class Journal:
    """A worker's journal file; each line is flushed as soon as it is written."""

    def __init__(self, path: str | Path, client: int) -> None:
        self.client = client
        self._n = 0
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def _write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._file.flush()

    def call(self, op: str, key: str, input: Any = None) -> int:
        """Record a call about to be made; its number, for :meth:`ret`."""
        self._n += 1
        row = {"c": self.client, "n": self._n, "key": key, "op": op, "input": input}
        self._write({**row, "call": time.monotonic_ns()})
        return self._n

    def ret(self, n: int, output: Any) -> None:
        """Record the outcome of call ``n`` (``output`` must not be ``None``)."""
        self._write({"c": self.client, "n": n, "output": output, "return": time.monotonic_ns()})

    def note(self, op: str, key: str, input: Any = None) -> None:
        """Record something done at one instant (processing an event, a fault)."""
        self.ret(self.call(op, key, input), {})

    def close(self) -> None:
        self._file.close()


def load_journals(paths: list[Path]) -> list[Operation]:
    """Every call of the journals, merged (a call without a return: unknown outcome).
    ``ValueError`` on a malformed line; a last line cut off by a kill is dropped."""
    ops: list[Operation] = []
    for path in paths:
        if not path.exists():
            continue
        calls: dict[tuple[int, int], dict[str, Any]] = {}
        order: list[tuple[int, int]] = []
        lines = path.read_text(encoding="utf-8").split("\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    continue  # the process died mid-write (no newline yet)
                raise ValueError(f"{path}: bad line {i + 1}: {line[:200]}") from None
            ident = (row["c"], row["n"])
            if "op" in row:
                calls[ident] = {**row, "output": None, "return": None}
                order.append(ident)
            else:
                calls[ident].update(output=row["output"], **{"return": row["return"]})
        for ident in order:
            row = calls[ident]
            ops.append(Operation.from_json({**row, "client": row["c"]}))
    ops.sort(key=lambda op: op.call)
    return ops


Body = Callable[[int, int], Awaitable[bool]]
"""Runs one incarnation of worker ``slot``: ``body(slot, incarnation)`` returns
``True`` when the worker finished, ``False`` when a fault killed it."""


class Supervisor:
    """Runs ``slots`` workers through ``body`` and restarts each killed one (at most
    ``max_restarts`` times in all: ``RuntimeError`` beyond, a sign the run cannot end)."""

    def __init__(self, slots: int, body: Body, *, max_restarts: int = 200) -> None:
        self.slots, self.body, self.max_restarts = slots, body, max_restarts
        self.restarts = 0

    async def run(self) -> None:
        await asyncio.gather(*(self._slot(s) for s in range(self.slots)))

    async def _slot(self, slot: int) -> None:
        for incarnation in range(INCARNATIONS):
            if await self.body(slot, incarnation):
                return
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise RuntimeError(f"more than {self.max_restarts} restarts")
        raise RuntimeError(f"worker {slot} was killed {INCARNATIONS} times")


class Processes:
    """Worker processes (``python -m MODULE SPEC``) started for a :class:`Supervisor`;
    their pids, so a run can SIGSTOP / SIGCONT / ``kill -9`` the live ones."""

    def __init__(self, module: str, workdir: Path) -> None:
        self.module, self.workdir = module, workdir
        self.live: dict[int, asyncio.subprocess.Process] = {}
        self.ready: dict[int, Path] = {}  # each slot's latest life's ready file
        self.go = workdir / f"go-{os.getpid()}-{id(self)}"
        self._stopped_since: dict[int, float] = {}

    async def release(self, count: int, run: asyncio.Task[None], timeout: float = 60.0) -> None:
        """Wait until ``count`` workers have opened their store (each touched its
        ``ready`` file, see :func:`ready_then_wait`), then let them all go at once.
        ``RuntimeError`` if they are not ready in time; the supervisor's error if ``run``
        (the supervisor's task) ended meanwhile."""
        deadline = time.monotonic() + timeout
        while _count(self.workdir, "*.ready") < count:
            if run.done():
                run.result()
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {count} workers started in {timeout} s")
            await asyncio.sleep(0.01)
        touch(self.go)

    async def run(self, slot: int, spec: dict[str, Any]) -> bool:
        """Run one worker process to its end: ``True`` if it exited 0, ``False`` if a
        signal killed it; ``RuntimeError`` (with its stderr) if it failed."""
        ready = self.workdir / f"{spec['client']}.ready"
        self.ready[slot] = ready
        spec = {**spec, "go": str(self.go), "ready": str(ready)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            json.dumps(spec),
            stderr=asyncio.subprocess.PIPE,
        )
        self.live[slot] = proc
        try:
            _, err = await proc.communicate()
        except asyncio.CancelledError:  # the run gave up: leave no worker behind
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        finally:
            self.live.pop(slot, None)
        if proc.returncode == 0:
            return True
        if proc.returncode == -signal.SIGKILL:
            return False
        tail = err.decode(errors="replace")[-2000:]
        raise RuntimeError(f"worker {spec['client']} exited {proc.returncode}: {tail}")

    def resume_stopped(self, after: float) -> int:
        """SIGCONT every live worker that has been stopped (state ``T``, as
        ``/proc/PID/stat`` says) for ``after`` seconds or more since this was first
        asked; the number resumed."""
        resumed = 0
        now = time.monotonic()
        for slot, proc in list(self.live.items()):
            if not _stopped(proc.pid):
                self._stopped_since.pop(proc.pid, None)
                continue
            since = self._stopped_since.setdefault(proc.pid, now)
            if now - since >= after and self.signal(slot, signal.SIGCONT):
                self._stopped_since.pop(proc.pid, None)
                resumed += 1
        return resumed

    def working(self, slot: int) -> bool:
        """Whether worker ``slot`` runs and its life has opened what it calls."""
        return slot in self.live and _exists(self.ready[slot])

    def signal(self, slot: int, sig: signal.Signals) -> bool:
        """Send ``sig`` to worker ``slot`` if it runs; whether it was sent."""
        proc = self.live.get(slot)
        if proc is None or proc.returncode is not None:
            return False
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return False
        return True


async def ready_then_wait(spec: dict[str, Any]) -> None:
    """In a worker process whose store is open: say so, and wait for the run's go (at
    once for a worker restarted after the start)."""
    touch(Path(spec["ready"]))
    go = Path(spec["go"])
    while True:
        if _exists(go):
            return
        await asyncio.sleep(0.01)


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (Linux ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def prepare(url: str, workdir: Path, servers: Sequence[str] = ()) -> bool:
    """Start a run on the store at ``url``: ``ValueError`` if ``servers`` are to share
    a ``memory://`` store (they cannot); create the run's directory (and its parents)
    if it is missing. Whether the workers are tasks of this process (``memory://``)."""
    in_process = url.startswith("memory:")
    if servers and in_process:
        raise ValueError("servers cannot share a memory:// store")
    workdir.mkdir(parents=True, exist_ok=True)
    return in_process


def surface_of(servers: Sequence[str], surface: str | None) -> str:
    """The surface the workers go through: ``library`` (their own store), ``http`` or
    ``mcp`` (the ``servers``); by default ``http`` with servers, else ``library``.
    ``ValueError`` for an unknown one, a network one without servers, or servers with
    ``library``."""
    chosen = surface or ("http" if servers else "library")
    if chosen not in ("library", "http", "mcp"):
        raise ValueError(f"unknown surface {chosen!r}: library, http or mcp")
    if (chosen == "library") == bool(servers):
        raise ValueError(f"the {chosen} surface {'takes no' if servers else 'needs'} servers")
    return chosen


def _count(directory: Path, pattern: str) -> int:
    return len(list(directory.glob(pattern)))


def touch(path: Path) -> None:
    """Create ``path`` (a flag file) if it is missing."""
    path.touch()


def _exists(path: Path) -> bool:
    return path.exists()


async def abandon(run: asyncio.Task[None]) -> None:
    """Cancel a supervisor's task that has not ended (the run failed elsewhere): its
    worker processes are killed, its worker tasks cancelled."""
    if not run.done():
        run.cancel()
        with contextlib.suppress(BaseException):
            await run


def die(in_process: bool) -> None:
    """The fault that ends this worker here and now: ``kill -9`` of its own process, or
    :class:`Killed` for a worker that is a task."""
    if in_process:
        raise Killed
    os.kill(os.getpid(), signal.SIGKILL)


def die_at(journal: Journal, key: str, point: str, in_process: bool) -> None:
    """Record a seeded ``kill`` at ``point`` (on ``key``), then :func:`die`."""
    journal.note("kill", key, {"point": point})
    die(in_process)


def kill_point(spec: dict[str, Any]) -> tuple[int, str] | None:
    """A worker spec's ``kill_at`` (the how-many-th item its life handles, the point)."""
    at = spec["kill_at"]
    return None if at is None else (int(at[0]), str(at[1]))


def life(workdir: Path, name: str, slot: int, incarnation: int) -> tuple[int, Path]:
    """The client id of life ``incarnation`` of worker ``slot``, and its journal's path."""
    client = slot * INCARNATIONS + incarnation
    return client, workdir / f"{name}-{client}.jsonl"


async def task_life(path: Path, client: int, body: Callable[[Journal], Awaitable[None]]) -> bool:
    """One life of a worker that is a task: ``body`` with its journal; ``True`` if it
    finished, ``False`` if a fault ended it (:class:`Killed`). The journal is closed."""
    journal = Journal(path, client)
    try:
        await body(journal)
    except Killed:
        return False
    finally:
        journal.close()
    return True


@contextlib.asynccontextmanager
async def supervised(
    slots: int,
    body: Body,
    procs: Processes | None,
    started: asyncio.Event | None,
) -> AsyncIterator[asyncio.Task[None]]:
    """A :class:`Supervisor` of ``slots`` workers running as a task: with ``procs``
    (worker processes) the workers are released together once all are ready; then
    ``started`` is set. Yields the task; on the way out it is :func:`abandon`-ed if it
    has not ended (no worker is left behind)."""
    run = asyncio.create_task(Supervisor(slots, body).run())
    try:
        if procs is not None:
            await procs.release(slots, run)
        if started is not None:
            started.set()
        yield run
    finally:
        await abandon(run)


Closer = Callable[[], Awaitable[None]]
"""Closes what a worker opened (a store, a client of the servers)."""


async def worker_process(
    spec: dict[str, Any],
    connect: Callable[[dict[str, Any]], Awaitable[tuple[T, list[Closer]]]],
    body: Callable[[T, Journal], Awaitable[None]],
) -> None:
    """A worker process's life: ``connect(spec)`` opens what it calls (and what closes
    it), then the ready / go handshake (:func:`ready_then_wait`), then ``body`` with
    the life's journal (``spec["out"]``). The journal and the connections are closed
    however ``body`` ends (errors of the closing suppressed: the process is ending). A
    worker started while the store is out of reach (``StoreUnavailable``: a store
    fault) tries to connect again, for :data:`CONNECT_BUDGET` seconds."""
    deadline = time.monotonic() + CONNECT_BUDGET
    while True:
        try:
            calls, closers = await connect(spec)
            break
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    await ready_then_wait(spec)
    journal = Journal(spec["out"], spec["client"])
    try:
        await body(calls, journal)
    finally:
        journal.close()
        for close in closers:
            with contextlib.suppress(Exception):
                await close()


async def settled(call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, called again while it raises ``StoreUnavailable`` (for
    :data:`CONNECT_BUDGET` seconds): a run's own final reads, which may come while a
    store fault of the caller's is still held or just healed."""
    deadline = time.monotonic() + CONNECT_BUDGET
    while True:
        try:
            return await call()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def worker_main(
    module: str,
    what: str,
    run: Callable[[dict[str, Any]], Coroutine[Any, Any, None]],
    argv: Sequence[str] | None = None,
) -> None:
    """The command line of a worker process: ``python -m MODULE SPEC`` (``what``: what
    the JSON spec describes) runs ``run(spec)``."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("spec", help=f"the {what}'s JSON spec")
    asyncio.run(run(json.loads(parser.parse_args(argv).spec)))
