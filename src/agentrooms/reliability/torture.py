"""The long tier: many short histories on one backend through one surface, under
faults, each checked as it ends.

A run (:func:`run_torture`) starts what it needs once (the store, the server processes
of the HTTP and MCP surfaces, the client processes) and records histories one after
another until a number of histories or minutes. History ``i`` has seed ``seed + i``: its
rooms are fresh, its clients draw their calls from that seed
(:class:`~agentrooms.reliability.recorder.Workload`), and so does its fault plan
(:func:`plan_faults`), so ``--seed S --histories 1`` replays the same workload and the
same faults. Each history is checked by
:func:`~agentrooms.reliability.recorder.verify` (linearizability, the log and the command
ids); one that is not linearizable, undecided, or with an anomaly is saved (JSON lines
of its operations, and a ``.meta.json`` with the seed, the settings, the faults and the
command that replays it).

Clients: on ``memory://`` they are asyncio tasks of this process (nothing else can share
the store); elsewhere each is a client process, forked from a fork server that imported
the library once and kept for the whole run, that streams every call and every outcome
to the runner as it happens (over a socket), so a client killed with ``kill -9`` leaves
its call in flight as an unknown outcome.

Faults, drawn per history from those the backend and surface allow (:func:`fault_kinds`):
``kill -9`` of a client process (a cancelled client task on ``memory://``); over HTTP,
``kill -9`` of a server process (restarted on its port in the background) and
SIGSTOP/SIGCONT of one; over MCP, the kill; and the store faults a caller passes in
(:class:`StoreFault`). Each fault is injected after a number of answers, so it lands
mid-history however fast the machine is; at most one server is down at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import multiprocessing
import os
import random
import shlex
import signal
import socket
import sqlite3
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agentrooms.reliability.broken import BROKEN, StaleReads
from agentrooms.reliability.history import Operation, dump_jsonl
from agentrooms.reliability.recorder import (
    COMMITS,
    LOG,
    UNKNOWN_OUTCOME,
    LibrarySurface,
    RunReport,
    Surface,
    Workload,
    _output,
    _workload,
    run_client,
    verify,
)
from agentrooms.reliability.servers import ServerProcess
from agentrooms.store import Store, open_store
from agentrooms.store.wrap import Forwarding

__all__ = [
    "BACKENDS",
    "SURFACES",
    "HistoryResult",
    "Journal",
    "Journaled",
    "PlannedFault",
    "Settings",
    "StoreFault",
    "Summary",
    "Unsupported",
    "fault_kinds",
    "plan_faults",
    "run_torture",
]

T = TypeVar("T")

BACKENDS = ("memory", "sqlite", "redis", "postgres")
SURFACES = ("library", "http", "mcp")

CLIENT_KILL = "client kill -9"
CLIENT_CANCEL = "client task cancelled"
SERVER_KILL = "server kill -9, restart"
SERVER_STOP = "server SIGSTOP, SIGCONT"

HTTP_TIMEOUT = 0.6  # seconds before a sent request's outcome is unknown
MCP_TIMEOUT = 2.0
CALL_TIMEOUT = 4.0  # a whole call (a put is a loop of requests)
VERIFY_TIMEOUT = 10.0
SPARES = 2  # client processes started ahead, to replace killed ones at once
NO_DELETE = tuple((k, w) for k, w in Workload().weights if k != "delete")


class Unsupported(ValueError):
    """A run the runner cannot do as asked (the message says why)."""


class StoreFault(Protocol):
    """A fault of the store under test: ``inject`` starts it, ``heal`` ends it (both
    bounded in time)."""

    @property
    def name(self) -> str: ...

    async def inject(self) -> None: ...

    async def heal(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Settings:
    """One run: ``backend`` through ``surface``; history ``i`` has seed ``seed + i``,
    ``clients`` clients of ``ops`` calls each on ``keys`` records; it stops after
    ``histories`` histories or ``minutes`` (the first reached; at least one is set).
    ``faults``: inject faults; ``broken``: a store of
    :data:`~agentrooms.reliability.broken.BROKEN` wrapped around the real one (library
    surface); ``url``: the store (default: one isolated to the run on the local
    server); ``servers``: server processes (HTTP, MCP); ``budget``: seconds the checker
    may take per history before the history is undecided."""

    backend: str
    surface: str = "library"
    seed: int = 0
    clients: int = 3
    ops: int = 15
    keys: int = 2
    histories: int | None = None
    minutes: float | None = None
    faults: bool = True
    broken: str | None = None
    url: str | None = None
    servers: int = 3
    budget: float = 30.0

    def validate(self) -> None:
        """``Unsupported`` (with the reason) if the run cannot be done as asked."""
        if self.backend not in BACKENDS:
            raise Unsupported(f"unknown backend {self.backend!r}; known: {', '.join(BACKENDS)}")
        if self.surface not in SURFACES:
            raise Unsupported(f"unknown surface {self.surface!r}; known: {', '.join(SURFACES)}")
        if self.backend == "memory" and self.surface != "library":
            raise Unsupported(
                f"memory:// lives inside one process, and the {self.surface} surface needs "
                "server processes that share the store: use --surface library on memory, "
                "or the backends sqlite, redis or postgres"
            )
        if self.broken is not None:
            if self.broken not in BROKEN:
                raise Unsupported(f"unknown broken store {self.broken!r}; known: {sorted(BROKEN)}")
            if self.surface != "library":
                raise Unsupported(
                    "a broken store wraps the store inside the clients' processes: "
                    "it runs on the library surface only"
                )
        if self.clients < 1 or self.ops < 1 or self.keys < 1 or self.servers < 2:
            raise Unsupported("clients, ops and keys must be at least 1, servers at least 2")
        if self.histories is None and self.minutes is None:
            raise Unsupported("give a number of histories or of minutes")
        if self.url is not None:
            from agentrooms.reliability.stores import backend_of

            if backend_of(self.url) != self.backend:
                raise Unsupported(f"the URL {self.url!r} is not a {self.backend} store")

    def workload(self, seed: int) -> Workload:
        """What history ``seed``'s clients do."""
        return Workload(
            ops=self.ops,
            keys=self.keys,
            seed=seed,
            timeout=CALL_TIMEOUT,
            weights=NO_DELETE if self.surface == "mcp" else Workload().weights,
        )

    def replay(self, seed: int) -> str:
        """The command that runs history ``seed`` again, alone."""
        cmd = ["agentrooms", "torture", "--backend", self.backend, "--surface", self.surface]
        cmd += ["--seed", str(seed), "--histories", "1", "--clients", str(self.clients)]
        cmd += ["--ops", str(self.ops), "--keys", str(self.keys)]
        if self.surface != "library":
            cmd += ["--servers", str(self.servers)]
        if not self.faults:
            cmd.append("--no-faults")
        if self.broken is not None:
            cmd += ["--broken", self.broken]
        if self.url is not None:
            cmd += ["--url", _shown(self.url)]
        return shlex.join(cmd)


def _shown(url: str) -> str:
    from agentrooms.cli import shown_url

    return shown_url(url)


def fault_kinds(settings: Settings, store_faults: Sequence[StoreFault] = ()) -> dict[str, int]:
    """The faults a run of ``settings`` draws from, each with its weight (a server's
    restart costs seconds of CPU: it is drawn half as often as the others)."""
    if not settings.faults:
        return {}
    kinds = {CLIENT_CANCEL if settings.backend == "memory" else CLIENT_KILL: 2}
    if settings.surface == "http":
        kinds |= {SERVER_KILL: 1, SERVER_STOP: 2}
    elif settings.surface == "mcp":
        kinds[SERVER_KILL] = 1
    kinds |= {f.name: 2 for f in store_faults}
    return kinds


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """A fault of a history: ``kind``, injected once the history's calls have had
    ``after`` answers, aimed at target ``target`` (an index, taken modulo the number of
    candidates then), healed ``seconds`` later (or when the clients are done)."""

    kind: str
    after: int
    target: int
    seconds: float


def plan_faults(seed: int, kinds: dict[str, int], calls: int) -> list[PlannedFault]:
    """The faults of history ``seed`` (none to two, drawn from ``kinds`` by weight),
    drawn from the seed alone, in the order they are injected; ``calls``: the history's
    calls."""
    if not kinds:
        return []
    rng = random.Random(f"faults/{seed}")
    count = rng.choices((0, 1, 2), (4, 5, 1))[0]
    names, weights = list(kinds), list(kinds.values())
    planned = [
        PlannedFault(
            rng.choices(names, weights)[0],
            rng.randrange(1, max(2, calls * 2 // 3)),
            rng.randrange(1 << 16),
            round(rng.uniform(0.2, 1.0), 3),
        )
        for _ in range(count)
    ]
    return sorted(planned, key=lambda f: f.after)


# ------------------------------------------------------------------------ journaling


class Journal:
    """The calls of a history's clients as they happen: a call opens an entry, its
    answer (or its unknown outcome) closes it; an entry still open at the end (a killed
    client's call in flight) is an unknown outcome. ``answered`` counts closed entries."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []
        self.open: dict[tuple[int, int], tuple[str, str, Any, int]] = {}
        self.answered = 0

    def event(self, client: int, event: dict[str, Any]) -> None:
        """``{"c": [n, op, key, input, call]}``, ``{"r": [n, output, return]}`` or
        ``{"u": n}`` from ``client``; ``ValueError`` for anything else."""
        if "c" in event:
            n, op, key, inp, call = event["c"]
            self.open[(client, n)] = (op, key, inp, call)
            return
        if "r" in event:
            n, output, ret = event["r"]
        elif "u" in event:
            n, output, ret = event["u"], None, None
        else:
            raise ValueError(f"not a journal event: {event!r}")
        op, key, inp, call = self.open.pop((client, n))
        self.ops.append(Operation(client, key, op, inp, output, call, ret))
        self.answered += 1

    def close(self) -> list[Operation]:
        """Every operation, the open ones as unknown outcomes, in call order."""
        for (client, _), (op, key, inp, call) in self.open.items():
            self.ops.append(Operation(client, key, op, inp, None, call, None))
        self.open.clear()
        return sorted(self.ops, key=lambda o: o.call)


class Journaled:
    """A :class:`~agentrooms.reliability.recorder.Surface` that reports each call to
    ``emit`` before it is made and its outcome after (``{"u": n}`` when it raised or was
    cancelled); the calls go to ``inner``."""

    def __init__(self, inner: Surface, emit: Callable[[dict[str, Any]], None]) -> None:
        self.inner, self.emit, self.n = inner, emit, 0

    async def _run(self, op: str, key: str, inp: Any, call: Awaitable[T]) -> T:
        n, self.n = self.n, self.n + 1
        self.emit({"c": [n, op, key, inp, time.monotonic_ns()]})
        try:
            result = await call
        except BaseException:
            self.emit({"u": n})
            raise
        self.emit({"r": [n, _output(op, result), time.monotonic_ns()]})
        return result

    async def read(self, key: str) -> tuple[str | None, int | None]:
        return await self._run("read", key, None, self.inner.read(key))

    async def put(self, key: str, value: str) -> int:
        return await self._run("put", key, {"value": value}, self.inner.put(key, value))

    async def cas(self, key: str, version: int | None, value: str) -> tuple[bool, int | None]:
        inp = {"version": version, "value": value}
        return await self._run("cas", key, inp, self.inner.cas(key, version, value))

    async def delete(self, key: str) -> None:
        await self._run("delete", key, None, self.inner.delete(key))

    async def append(self, item: str) -> int:
        return await self._run("append", LOG, {"id": item}, self.inner.append(item))

    async def read_log(self) -> list[tuple[int, str]]:
        return await self._run("read_log", LOG, None, self.inner.read_log())

    async def commit(self, command_id: str) -> tuple[int, bool | None] | None:
        inp = {"id": command_id}
        return await self._run("commit", COMMITS, inp, self.inner.commit(command_id))

    async def read_commits(self) -> list[str]:
        return await self._run("read_commits", COMMITS, None, self.inner.read_commits())

    async def close(self) -> None:
        await self.inner.close()


def _wrap(store: Store, broken: str | None, seed: int) -> Store:
    if broken is None:
        return store
    cls: type[Forwarding] = BROKEN[broken]
    return cls(store, seed=seed) if cls is StaleReads else cls(store)


def _spread(bases: Sequence[str], i: int) -> list[str]:
    """``bases`` from the ``i``-th on: client ``i``'s MCP session opens there."""
    k = i % len(bases)
    return [*bases[k:], *bases[:k]]


# ------------------------------------------------------------------- client processes

PRELOAD = [
    "agentrooms.reliability.torture",
    "agentrooms.reliability.surfaces",
    "agentrooms.store.sqlite.backend",
    "agentrooms.store.redis.backend",
    "agentrooms.store.postgres.backend",
]
"""What the fork server imports once, so a client process starts in milliseconds (a
killed one is replaced between two histories)."""
_CONTEXT: ForkServerContext | None = None


def _context() -> ForkServerContext:
    global _CONTEXT
    if _CONTEXT is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        _CONTEXT = context
    return _CONTEXT


async def _job(
    store: Store | None,
    spec: dict[str, Any],
    job: dict[str, Any],
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, int]:
    """One client's part of one history, its calls and outcomes given to ``emit`` as
    they happen; how failures were reported to it."""
    from agentrooms.reliability.surfaces import HttpSurface, McpSurface

    client, room, seed = job["client"], job["room"], job["seed"]
    surface: Surface
    inner: HttpSurface | McpSurface | None = None
    if spec["surface"] == "library":
        assert store is not None
        surface = LibrarySurface(_wrap(store, spec.get("broken"), seed), room)
    elif spec["surface"] == "http":
        inner = HttpSurface(job["bases"], room, f"a{client}", seed=seed, timeout=HTTP_TIMEOUT)
        surface = inner
    else:
        bases = _spread(job["bases"], client)
        inner = McpSurface(bases, room, seed=seed, timeout=MCP_TIMEOUT)
        surface = inner
    try:
        await run_client(Journaled(surface, emit), client, _workload(job["workload"]))
    finally:
        await surface.close()
    return dict(inner.reports) if inner is not None else {}


async def _client_process(sock: socket.socket, spec: dict[str, Any]) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=LINE_LIMIT)

    def emit(message: dict[str, Any]) -> None:
        writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    store = await open_store(spec["url"]) if spec["surface"] == "library" else None
    try:
        emit({"ready": os.getpid()})
        while line := await reader.readline():
            try:
                reports = await _job(store, spec, json.loads(line), emit)
            except Exception:
                emit({"crash": traceback.format_exc()[-4000:]})
            else:
                emit({"done": reports})
            await writer.drain()
    finally:
        if store is not None:
            await store.close()
        writer.close()


def _client_main(sock: socket.socket, spec: dict[str, Any]) -> None:
    """A client process (forked by the fork server): ``spec`` holds ``surface``, and
    ``url`` and ``broken`` for the library surface. On ``sock`` it sends ``{"ready":
    pid}``, then runs each job line it receives (client, room, seed, workload, bases),
    sending a :class:`Journal` event per call and outcome, then ``{"done": reports}``
    (or ``{"crash": traceback}``); it exits when the socket closes."""
    asyncio.run(_client_process(sock, spec))


LINE_LIMIT = 1 << 24


class Worker:
    """A client process of the run, and its socket."""

    def __init__(
        self,
        proc: BaseProcess,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.proc, self.reader, self.writer = proc, reader, writer
        self.killed = False

    @classmethod
    async def spawn(cls, spec: dict[str, Any]) -> Worker:
        """Start one and wait until it is ready; ``RuntimeError`` if it exits first."""
        ours, theirs = socket.socketpair()
        proc = _context().Process(target=_client_main, args=(theirs, spec), daemon=True)
        try:
            await asyncio.to_thread(proc.start)
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=LINE_LIMIT)
        if not await reader.readline():
            writer.close()
            await asyncio.to_thread(proc.join, 10)
            raise RuntimeError(f"a client process exited {proc.exitcode} at start")
        return cls(proc, reader, writer)

    async def run(self, job: dict[str, Any], journal: Journal) -> tuple[str, Any]:
        """Send ``job`` and feed its events to ``journal`` until it ends: ``("done",
        reports)``, ``("crash", traceback)`` or ``("died", exit code)``."""
        client = job["client"]
        try:
            self.writer.write((json.dumps(job) + "\n").encode())
            await self.writer.drain()
            while line := await self.reader.readline():
                event = json.loads(line)
                if "done" in event:
                    return "done", event["done"]
                if "crash" in event:
                    return "crash", event["crash"]
                journal.event(client, event)
        except ConnectionError:
            pass
        await asyncio.to_thread(self.proc.join, 10)
        return "died", self.proc.exitcode

    def kill(self) -> None:
        """``kill -9`` the process (its pid only)."""
        self.killed = True
        if self.proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)

    async def stop(self) -> None:
        """Close its socket (it exits), ``kill -9`` after 10 s."""
        self.writer.close()
        await asyncio.to_thread(self.proc.join, 10)
        if self.proc.exitcode is None:
            self.kill()
            await asyncio.to_thread(self.proc.join, 10)


class Pool:
    """The run's client processes: ``take`` the ones a history needs (waiting for those
    still starting), ``give`` them back; a killed one is replaced in the background."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.idle: list[Worker] = []
        self.starting: set[asyncio.Task[Worker]] = set()

    def spawn(self, n: int = 1) -> None:
        for _ in range(n):
            self.starting.add(asyncio.create_task(Worker.spawn(self.spec)))

    async def take(self, n: int) -> list[Worker]:
        while len(self.idle) < n:
            if not self.starting:
                self.spawn(n - len(self.idle))
            done, _ = await asyncio.wait(self.starting, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                self.starting.discard(task)
                self.idle.append(task.result())
        taken, self.idle = self.idle[:n], self.idle[n:]
        return taken

    def give(self, worker: Worker) -> None:
        self.idle.append(worker)

    async def close(self) -> None:
        started = await asyncio.gather(*self.starting, return_exceptions=True)
        workers = [*self.idle, *(w for w in started if isinstance(w, Worker))]
        self.idle, self.starting = [], set()
        await asyncio.gather(*(w.stop() for w in workers))


class Cluster:
    """The run's server processes: which are up, faults on one, restarts in the
    background."""

    def __init__(self, procs: list[ServerProcess]) -> None:
        self.procs = procs
        self.up = [False] * len(procs)
        self.restarts: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Start every server at once (the store is prepared already)."""
        await asyncio.gather(*(p.start() for p in self.procs))
        self.up = [True] * len(self.procs)

    def bases(self) -> list[str]:
        self.check()
        return [p.base for p, up in zip(self.procs, self.up, strict=True) if up]

    def check(self) -> None:
        """Raise the error of a restart that failed."""
        for task in [t for t in self.restarts if t.done()]:
            self.restarts.discard(task)
            task.result()

    def candidate(self, target: int) -> int | None:
        """The server a fault aimed at ``target`` hits, if two or more are up."""
        up = [i for i, ok in enumerate(self.up) if ok]
        return up[target % len(up)] if len(up) >= 2 else None

    def kill(self, i: int) -> None:
        self.procs[i].kill()
        self.up[i] = False
        self.restarts.add(asyncio.create_task(self._restart(i)))

    async def _restart(self, i: int) -> None:
        await self.procs[i].start()
        self.up[i] = True

    def pause(self, i: int) -> None:
        self.procs[i].pause()
        self.up[i] = False

    def resume(self, i: int) -> None:
        self.procs[i].resume()
        self.up[i] = True

    async def stop(self) -> None:
        """Stop every server, the ones restarting too."""
        for task in self.restarts:
            task.cancel()
        await asyncio.gather(*self.restarts, return_exceptions=True)
        for p in self.procs:
            p.stop()


# ----------------------------------------------------------------------------- results


@dataclass(slots=True)
class HistoryResult:
    """One history: its seed, operations (the clients' calls), unknown outcomes,
    ``verdict`` (``linearizable``, ``not linearizable`` or ``undecided``), anomalies
    (failed properties, crashed clients, a damaged SQLite file), the faults injected,
    how failures were reported to the clients, and where it was saved if it failed."""

    index: int
    seed: int
    room: str
    operations: int
    unknown: int
    verdict: str
    failed_keys: list[str]
    anomalies: list[str]
    faults: list[str]
    reports: Counter[str]
    seconds: float
    saved: Path | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "linearizable" and not self.anomalies


@dataclass(slots=True)
class Summary:
    """A run's totals, and each history's result (``ok``: every history linearizable,
    no anomaly)."""

    settings: Settings
    out: Path
    histories: int = 0
    operations: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    unknown: int = 0
    anomalies: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    reports: Counter[str] = field(default_factory=Counter)
    integrity_checks: int = 0
    saved: list[Path] = field(default_factory=list)
    failing: list[HistoryResult] = field(default_factory=list)
    results: list[HistoryResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.histories > 0 and not self.failing

    def add(self, result: HistoryResult) -> None:
        self.results.append(result)
        self.histories += 1
        self.operations += result.operations
        self.verdicts[result.verdict] += 1
        self.unknown += result.unknown
        self.anomalies += len(result.anomalies)
        self.faults.update(result.faults)
        self.reports.update(result.reports)
        if not result.ok:
            self.failing.append(result)
            if result.saved is not None:
                self.saved.append(result.saved)


def kind_of(outcome: object) -> str | None:
    """How a client's run ended (``done``, ``crash``, ``died``), if it returned."""
    if isinstance(outcome, tuple) and outcome and isinstance(outcome[0], str):
        return outcome[0]
    return None


def verdict(report: RunReport) -> str:
    """``linearizable``, ``not linearizable`` (a key has no linearization) or
    ``undecided`` (the checker's budget ran out first)."""
    if report.result.linearizable:
        return "linearizable"
    return "not linearizable" if report.result.failed else "undecided"


# ------------------------------------------------------------------------------ runner


@contextlib.asynccontextmanager
async def _store(settings: Settings) -> AsyncIterator[tuple[str, list[StoreFault]]]:
    """The store's URL for the run, and the store faults it allows."""
    if settings.url is not None:
        yield settings.url, []
        return
    from agentrooms.reliability.stores import provision

    async with provision(settings.backend) as target:
        yield target.url, []


class _Runner:
    def __init__(
        self,
        settings: Settings,
        url: str,
        store_faults: list[StoreFault],
        workdir: Path,
        out: Path,
    ) -> None:
        self.settings, self.url, self.workdir, self.out = settings, url, workdir, out
        self.store_faults = {f.name: f for f in store_faults}
        self.kinds = fault_kinds(settings, store_faults)
        self.run_id = uuid.uuid4().hex[:8]
        self.store: Store | None = None  # the runner's own handle (verifying, memory)
        self.pool: Pool | None = None
        self.cluster: Cluster | None = None
        self.integrity_checks = 0

    async def start(self) -> None:
        s = self.settings
        self.store = await open_store(self.url)  # prepares the store, before the others
        if s.backend != "memory":
            spec = {"surface": s.surface, "url": self.url, "broken": s.broken}
            self.pool = Pool(spec)
            self.pool.spawn(s.clients + SPARES)  # while the servers start
        if s.surface != "library":
            procs = [ServerProcess(self.url, self.workdir) for _ in range(s.servers)]
            self.cluster = Cluster(procs)
            await self.cluster.start()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        if self.cluster is not None:
            await self.cluster.stop()
        if self.store is not None:
            await self.store.close()

    async def history(self, index: int) -> HistoryResult:
        s = self.settings
        seed = s.seed + index
        started = time.monotonic()
        room = f"torture-{self.run_id}-{seed}"
        workload = s.workload(seed)
        plan = plan_faults(seed, self.kinds, s.clients * s.ops)
        journal = Journal()
        anomalies: list[str] = []
        reports: Counter[str] = Counter()
        bases: list[str] = []
        if self.cluster is not None:
            from agentrooms.reliability.surfaces import logs
            from agentrooms.rooms import Rooms

            bases = self.cluster.bases()
            assert self.store is not None
            rooms = Rooms(self.store)
            await asyncio.gather(*(rooms.create(r) for r in (room, *logs(room))))
        runs: list[asyncio.Task[tuple[str, Any]]] = []
        workers: list[Worker] = []
        if self.pool is None:
            assert self.store is not None
            store = _wrap(self.store, s.broken, seed)  # one broken store for all clients
            for i in range(s.clients):
                surface = LibrarySurface(store, room, interleave=True)
                journaled = Journaled(surface, functools.partial(journal.event, i))
                runs.append(asyncio.create_task(self._task(journaled, i, workload)))
        else:
            workers = await self.pool.take(s.clients)
            for i, worker in enumerate(workers):
                job = {
                    "client": i,
                    "room": room,
                    "seed": seed,
                    "workload": dataclasses.asdict(workload),
                    "bases": bases,
                }
                runs.append(asyncio.create_task(worker.run(job, journal)))
        injected: list[str] = []
        heals: list[asyncio.Task[None]] = []
        over = asyncio.Event()  # the clients are done: heal what is still broken
        injector = asyncio.create_task(
            self._inject(plan, journal, runs, workers, injected, heals, over)
        )
        outcomes = await asyncio.gather(*runs, return_exceptions=True)
        injector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await injector
        over.set()
        await asyncio.gather(*heals)
        for i, outcome in enumerate(outcomes):
            anomalies += self._outcome(i, outcome, workers, reports)
        ops = journal.close()
        if s.backend == "sqlite" and any("kill" in f for f in injected):
            anomalies += await self._integrity()
        final = Journal()
        report = await self._verify(ops, room, final)
        anomalies += report.anomalies
        result = HistoryResult(
            index,
            seed,
            room,
            len(ops),
            sum(o.unknown for o in ops),
            verdict(report),
            report.result.failed,
            anomalies,
            injected,
            reports,
            time.monotonic() - started,
        )
        if not result.ok:
            result.saved = self._save(result, workload, [*ops, *final.close()])
        return result

    @staticmethod
    async def _task(surface: Journaled, client: int, workload: Workload) -> tuple[str, Any]:
        await run_client(surface, client, workload)
        return "done", {}

    def _outcome(
        self, i: int, outcome: Any, workers: list[Worker], reports: Counter[str]
    ) -> list[str]:
        """What client ``i``'s end says: its reports, and an anomaly if it crashed or
        died of something else than a fault. Its process goes back to the pool."""
        worker = workers[i] if workers else None
        if worker is not None:
            assert self.pool is not None
            if worker.killed or kind_of(outcome) == "died":
                worker.writer.close()  # its process is gone: another takes its place
                self.pool.spawn()
            else:
                self.pool.give(worker)
        if isinstance(outcome, asyncio.CancelledError):
            return []  # a cancelled client task: a fault
        if isinstance(outcome, BaseException):
            text = "".join(traceback.format_exception(outcome))[-3000:]
            return [f"client {i} crashed: {text}"]
        kind, detail = outcome
        if kind == "done":
            reports.update(detail)
            return []
        if kind == "crash":
            return [f"client {i} crashed: {detail}"]
        if worker is not None and worker.killed:
            return []
        return [f"client {i}'s process exited {detail} unasked"]

    async def _inject(
        self,
        plan: list[PlannedFault],
        journal: Journal,
        runs: list[asyncio.Task[tuple[str, Any]]],
        workers: list[Worker],
        injected: list[str],
        heals: list[asyncio.Task[None]],
        over: asyncio.Event,
    ) -> None:
        """Inject ``plan``'s faults as the answers come (each named in ``injected``);
        a fault that lasts is healed by a task of ``heals`` after its time, or once
        ``over`` is set."""
        for fault in plan:
            while journal.answered < fault.after:  # noqa: ASYNC110 (the journal is fed by the clients)
                await asyncio.sleep(0.002)
            live = [i for i, r in enumerate(runs) if not r.done()]
            if fault.kind in (CLIENT_KILL, CLIENT_CANCEL):
                if len(live) < 1:
                    continue
                victim = live[fault.target % len(live)]
                if fault.kind == CLIENT_KILL:
                    workers[victim].kill()
                else:
                    runs[victim].cancel()
                injected.append(fault.kind)
                continue
            if fault.kind in (SERVER_KILL, SERVER_STOP):
                assert self.cluster is not None
                cluster = self.cluster
                server = cluster.candidate(fault.target)
                if server is None:
                    continue
                if fault.kind == SERVER_KILL:
                    cluster.kill(server)
                    injected.append(fault.kind)
                    continue
                cluster.pause(server)
                heal: Awaitable[None] = _resume(cluster, server)
            else:
                store_fault = self.store_faults[fault.kind]
                await store_fault.inject()
                heal = store_fault.heal()
            injected.append(fault.kind)
            heals.append(asyncio.create_task(_heal_after(fault.seconds, heal, over)))

    async def _integrity(self) -> list[str]:
        """``PRAGMA integrity_check`` of the SQLite file (after a process was killed)."""
        from agentrooms.store.sqlite.config import parse_url

        path = parse_url(self.url).path

        def run() -> list[str]:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                rows = [str(r[0]) for r in db.execute("PRAGMA integrity_check")]
            return [] if rows == ["ok"] else [f"PRAGMA integrity_check: {rows[:5]}"]

        found = await asyncio.to_thread(run)
        self.integrity_checks += 1
        return found

    async def _verify(self, ops: list[Operation], room: str, final: Journal) -> RunReport:
        """The final reads (recorded in ``final``), through a surface of the run's,
        retried while their outcome is unknown; then the checks."""
        s = self.settings
        for attempt in range(5):
            surface: Surface
            if self.cluster is None:
                assert self.store is not None
                surface = LibrarySurface(self.store, room)
            else:
                from agentrooms.reliability.surfaces import HttpSurface, McpSurface

                bases = self.cluster.bases()
                if s.surface == "http":
                    surface = HttpSurface(bases, room, "verifier", timeout=VERIFY_TIMEOUT)
                else:
                    surface = McpSurface(bases, room, timeout=VERIFY_TIMEOUT)
            journaled = Journaled(surface, functools.partial(final.event, s.clients))
            try:
                return await verify(ops, journaled, s.clients, budget=s.budget)
            except UNKNOWN_OUTCOME:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.5)
            finally:
                await surface.close()
        raise AssertionError("unreachable")

    def _save(self, result: HistoryResult, workload: Workload, ops: list[Operation]) -> Path:
        s = self.settings
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"{s.backend}-{s.surface}-{result.seed}.jsonl"
        dump_jsonl(ops, path)
        meta = {
            "seed": result.seed,
            "backend": s.backend,
            "surface": s.surface,
            "clients": s.clients,
            "servers": s.servers if s.surface != "library" else None,
            "broken": s.broken,
            "url": None if s.url is None else _shown(s.url),
            "workload": dataclasses.asdict(workload),
            "faults": result.faults,
            "verdict": result.verdict,
            "failed_keys": result.failed_keys,
            "anomalies": result.anomalies,
            "unknown": result.unknown,
            "command": s.replay(result.seed),
        }
        meta_path = path.with_suffix(".meta.json")
        meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return path


async def _resume(cluster: Cluster, server: int) -> None:
    cluster.resume(server)


async def _heal_after(seconds: float, heal: Awaitable[None], over: asyncio.Event) -> None:
    """Await ``heal`` after ``seconds``, or once ``over`` is set if sooner."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(over.wait(), seconds)
    await heal


async def run_torture(
    settings: Settings,
    out: str | Path,
    *,
    on_history: Callable[[HistoryResult, Summary], None] | None = None,
) -> Summary:
    """Run ``settings``: start the store, servers and client processes once, record
    and check histories one after another until ``settings.histories`` or
    ``settings.minutes``, save each failing one to ``out``; the totals. ``on_history``
    is called after each. ``Unsupported`` if the run cannot be done as asked; a store
    that cannot be reached raises the store's error."""
    settings.validate()
    summary = Summary(settings, Path(out))
    started = time.monotonic()
    deadline = None if settings.minutes is None else started + 60 * settings.minutes
    with tempfile.TemporaryDirectory(prefix="agentrooms-torture-") as tmp:
        async with _store(settings) as (url, store_faults):
            runner = _Runner(settings, url, store_faults, Path(tmp), Path(out))
            try:
                await runner.start()
                index = 0
                while (settings.histories is None or index < settings.histories) and (
                    deadline is None or time.monotonic() < deadline
                ):
                    result = await runner.history(index)
                    summary.add(result)
                    summary.integrity_checks = runner.integrity_checks
                    summary.seconds = time.monotonic() - started
                    if on_history is not None:
                        on_history(result, summary)
                    index += 1
            finally:
                await runner.close()
    summary.seconds = time.monotonic() - started
    return summary
