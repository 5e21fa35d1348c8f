"""A torture run's settings, the faults it may draw, and each history's fault plan."""

from __future__ import annotations

import random
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from agentrooms.reliability.broken import BROKEN
from agentrooms.reliability.recorder import Workload

__all__ = [
    "BACKENDS",
    "CLIENT_CANCEL",
    "CLIENT_KILL",
    "SERVER_KILL",
    "SERVER_KILL_IN_FLIGHT",
    "SERVER_STOP",
    "SURFACES",
    "PlannedFault",
    "Settings",
    "StoreFault",
    "Unsupported",
    "fault_kinds",
    "plan_faults",
]

BACKENDS = ("memory", "sqlite", "redis", "postgres")
SURFACES = ("library", "http", "mcp")

CLIENT_KILL = "client kill -9"
CLIENT_CANCEL = "client task cancelled"
SERVER_KILL = "server kill -9, restart"
SERVER_STOP = "server SIGSTOP, SIGCONT"
SERVER_KILL_IN_FLIGHT = "server kill -9 in flight"

HTTP_TIMEOUT = 0.6  # seconds before a sent request's outcome is unknown
MCP_TIMEOUT = 2.0
CALL_TIMEOUT = 4.0  # a whole call (a put is a loop of requests)
VERIFY_TIMEOUT = 10.0
SPARES = 2  # client processes started ahead, to replace killed ones at once
OPEN_TIMEOUT = 30.0  # seconds a client process tries to open the store
RESTARTS = 3  # tries to start a killed server again
NO_DELETE = tuple((k, w) for k, w in Workload().weights if k != "delete")


class Unsupported(ValueError):
    """A run the runner cannot do as asked (the message says why)."""


def check_target(backend: str, surface: str) -> None:
    """``Unsupported`` unless ``backend`` and ``surface`` are known and go together."""
    if backend not in BACKENDS:
        raise Unsupported(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if surface not in SURFACES:
        raise Unsupported(f"unknown surface {surface!r}; known: {', '.join(SURFACES)}")
    if backend == "memory" and surface != "library":
        raise Unsupported(
            f"memory:// lives inside one process, and the {surface} surface needs "
            "server processes that share the store: use --surface library on memory, "
            "or the backends sqlite, redis or postgres"
        )


def check_url(url: str | None, backend: str) -> None:
    """``Unsupported`` if ``url`` is given and is not a ``backend`` store."""
    if url is not None:
        from agentrooms.reliability.stores import backend_of

        if backend_of(url) != backend:
            raise Unsupported(f"the URL {url!r} is not a {backend} store")


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
    surface); ``url``: the store, with no store faults (default: one the run owns,
    :func:`~agentrooms.reliability.faults.store_under_test`: a SQLite file, a
    ``redis-server`` of its own, a PostgreSQL database on the local server, behind a
    proxy, with their faults); ``servers``: server processes (HTTP, MCP); ``budget``:
    seconds the checker may take per history before the history is undecided."""

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
        check_target(self.backend, self.surface)
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
        check_url(self.url, self.backend)

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


def fault_kinds(
    settings: Settings, store_faults: Sequence[StoreFault] = (), *, proxied: bool = False
) -> dict[str, int]:
    """The faults a run of ``settings`` draws from, each with its weight (a server's
    restart costs seconds of CPU: it is drawn half as often as the others).
    ``proxied``: the servers reach the store through the run's proxy, which can hold a
    server's request to the store while that server is killed
    (:data:`SERVER_KILL_IN_FLIGHT`, over HTTP and MCP)."""
    if not settings.faults:
        return {}
    kinds = {CLIENT_CANCEL if settings.backend == "memory" else CLIENT_KILL: 2}
    if settings.surface in ("http", "mcp"):  # an MCP call has a read timeout of its own
        kinds |= {SERVER_KILL: 1, SERVER_STOP: 2}
        if proxied:
            kinds[SERVER_KILL_IN_FLIGHT] = 1
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
