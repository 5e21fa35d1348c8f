"""Faults on the stores a reliability run uses, and the rig that owns those stores.

A :class:`Fault` has a ``name``, ``inject()`` and ``heal()``. The heal is idempotent and
always restores service; every fault is bounded (a run injects it, waits, heals it:
:func:`held`). Each inject and heal is appended to the fault's ``faults`` log as
``(time.monotonic_ns(), what)``, the clock the histories use.

* the TCP proxy's modes (:mod:`agentrooms.reliability.proxy`): delay, drop, reset,
  blackhole, and a reset aimed at a request in flight (forwarded, its reply cut),
  between the client and Redis or PostgreSQL;
* :class:`RedisServer`: a test-owned ``redis-server`` on a free port;
  :class:`RedisRestart` (``kill -9``, then start again on the same port) and
  :class:`ClientPause` (``CLIENT PAUSE ms WRITE|ALL``, healed by ``CLIENT UNPAUSE``);
* :class:`PgTerminate`: ``pg_terminate_backend`` of every connection to the run's own
  database, never another database's, never its own control connection;
* :class:`SqliteWriterKill`: ``kill -9`` of a process writing to the SQLite file; the
  heal runs ``PRAGMA integrity_check`` (``RuntimeError`` unless ``ok``) and starts a new
  writer.

:func:`store_under_test` yields a :class:`Rig`: the URL clients use (through the proxy
for Redis and PostgreSQL) and the faults a run may draw from.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import asyncpg
import redis.asyncio as aioredis

from agentrooms.reliability.proxy import Blackhole, Delay, Drop, Reset, ResetInFlight, TcpProxy
from agentrooms.reliability.servers import free_port, kill_process, stop_process

__all__ = [
    "ClientPause",
    "Fault",
    "PgTerminate",
    "RedisRestart",
    "RedisServer",
    "Rig",
    "SqliteWriterKill",
    "held",
    "store_under_test",
]

Log = list[tuple[int, str]]
START_TIMEOUT = 20.0
POSTGRES_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
PAUSE_ALL_MS = 1000
"""How long the rig's ``CLIENT PAUSE ALL`` lasts: the server's own expiry is its heal."""


class Fault(Protocol):
    """One bounded fault. ``heal`` is idempotent and restores service."""

    name: str
    faults: Log

    async def inject(self) -> None: ...

    async def heal(self) -> None: ...


async def held(fault: Fault, seconds: float) -> None:
    """Inject ``fault``, hold it ``seconds``, heal it (also when cancelled)."""
    await fault.inject()
    try:
        await asyncio.sleep(seconds)
    finally:
        await asyncio.shield(fault.heal())


class _Logged:
    name = "fault"

    def __init__(self, log: Log | None) -> None:
        self.faults: Log = [] if log is None else log

    def _note(self, what: str) -> None:
        self.faults.append((time.monotonic_ns(), f"{self.name} {what}"))


# ------------------------------------------------------------------------------ Redis


class RedisServer:
    """A ``redis-server`` this process starts on a free 127.0.0.1 port in ``workdir``:
    no persistence (``--save "" --appendonly no``), or with ``aof`` every write logged
    and fsynced before its reply (``--appendonly yes --appendfsync always``)."""

    def __init__(self, workdir: str | Path, *, aof: bool = False, port: int | None = None) -> None:
        self.dir = Path(workdir)
        self.aof = aof
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.faults: Log = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self) -> aioredis.Redis:
        """A control connection straight to the server (not through any proxy)."""
        return aioredis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    async def start(self) -> None:
        """Start the server and wait until it answers PING (``RuntimeError`` if not)."""
        assert not self.running, "already running"
        self.proc = self._spawn()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            client = self.client()
            try:
                if await client.ping():
                    return
            except (OSError, aioredis.RedisError):
                pass
            finally:
                await client.aclose()
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            await asyncio.sleep(0.05)

    def _spawn(self) -> subprocess.Popen[bytes]:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else []
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        cmd += ["--dir", str(self.dir), "--save", "", "--appendonly", "no", *persistence]
        cmd += ["--daemonize", "no", "--logfile", str(self.dir / f"redis-{self.port}.log")]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self) -> None:
        """``kill -9`` of the server's pid, reaped."""
        assert self.proc is not None and self.running, "not running"
        kill_process(self.proc)
        self.faults.append((time.monotonic_ns(), "redis-server kill -9"))

    async def restart(self) -> None:
        """``kill -9``, then start again on the same port."""
        self.kill()
        await self.start()
        self.faults.append((time.monotonic_ns(), "redis-server started"))

    def stop(self) -> None:
        """Stop the server if it runs (:func:`~agentrooms.reliability.servers.stop_process`)."""
        stop_process(self.proc)


class RedisRestart(_Logged):
    """``kill -9`` of the test-owned server; the heal starts it on the same port. Without
    AOF the restarted server holds nothing: the store forgets every acknowledged write."""

    def __init__(self, server: RedisServer, log: Log | None = None) -> None:
        super().__init__(log)
        self.server = server
        self.name = "redis restart" + (" (aof always)" if server.aof else " (no persistence)")

    async def inject(self) -> None:
        if self.server.running:
            self.server.kill()
        self._note("kill -9")

    async def heal(self) -> None:
        if not self.server.running:
            await self.server.start()
        self._note("heal (started)")


class ClientPause(_Logged):
    """``CLIENT PAUSE ms WRITE`` (writes wait, reads answer) or ``ALL``, bounded by
    ``ms`` on the server itself. ``WRITE`` is healed at once by ``CLIENT UNPAUSE``.
    Under ``ALL`` the server holds every command, ``CLIENT UNPAUSE`` too (and a new
    connection's handshake), so its heal waits for the pause to end on the server,
    ``ms`` after the inject, then sends ``CLIENT UNPAUSE`` (a no-op by then)."""

    def __init__(
        self, server: RedisServer, mode: str = "WRITE", ms: int = 10_000, log: Log | None = None
    ) -> None:
        assert mode in ("WRITE", "ALL")
        super().__init__(log)
        self.server, self.mode, self.ms = server, mode, ms
        self.name = f"redis CLIENT PAUSE {mode}"
        self.until = 0.0  # time.monotonic() when the server ends the pause itself

    async def inject(self) -> None:
        client = self.server.client()
        try:
            await client.client_pause(self.ms, all=self.mode == "ALL")
        finally:
            await client.aclose()
        self.until = time.monotonic() + self.ms / 1000
        self._note("inject")

    async def heal(self) -> None:
        if self.mode == "ALL":
            await asyncio.sleep(max(0.0, self.until - time.monotonic()))
        if self.server.running:
            client = self.server.client()
            try:
                await client.client_unpause()
            finally:
                await client.aclose()
        self._note("heal")


# ------------------------------------------------------------------------- PostgreSQL


class PgTerminate(_Logged):
    """``pg_terminate_backend`` of every connection to ``database`` but the control
    connection's own (which is to the ``postgres`` database). ``terminated`` counts
    them. Nothing to heal: clients connect again."""

    def __init__(self, admin_url: str, database: str, log: Log | None = None) -> None:
        super().__init__(log)
        self.admin_url, self.database = admin_url, database
        self.name = "postgres pg_terminate_backend"
        self.terminated = 0

    async def inject(self) -> None:
        conn = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            rows = await conn.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = $1 AND pid <> pg_backend_pid()",
                self.database,
            )
        finally:
            await conn.close()
        self.terminated += sum(1 for r in rows if r[0])
        self._note(f"inject ({len(rows)} connections)")

    async def heal(self) -> None:
        self._note("heal")


# ----------------------------------------------------------------------------- SQLite


def integrity_check(path: str | Path) -> str:
    """``PRAGMA integrity_check`` of the SQLite file (``ok`` when sound)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()
    return "\n".join(str(r[0]) for r in rows)


class SqliteWriterKill(_Logged):
    """``kill -9`` of a process that writes to the SQLite file without pause (appends
    and puts in a room of its own, so it is mid-transaction most of the time); the heal
    checks ``PRAGMA integrity_check`` (``RuntimeError`` unless ``ok``; each result in
    ``checks``) and starts a new writer. :meth:`stop` ends the writer."""

    def __init__(self, url: str, path: str | Path, log: Log | None = None) -> None:
        super().__init__(log)
        self.url, self.path = url, Path(path)
        self.name = "sqlite kill -9 of a writer"
        self.proc: subprocess.Popen[bytes] | None = None
        self.checks: list[str] = []

    def start(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = "import sys; from agentrooms.reliability.faults import _write_forever; "
            code += "_write_forever(sys.argv[1])"
            cmd = [sys.executable, "-c", code, self.url]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def inject(self) -> None:
        if self.proc is not None:
            kill_process(self.proc)
        self._note("kill -9")

    async def heal(self) -> None:
        result = await asyncio.to_thread(integrity_check, self.path)
        self.checks.append(result)
        self._note(f"heal (integrity_check: {result})")
        if result != "ok":
            raise RuntimeError(f"PRAGMA integrity_check after kill -9 of a writer: {result}")
        self.start()

    def stop(self) -> None:
        """End the writer (:func:`~agentrooms.reliability.servers.stop_process`)."""
        stop_process(self.proc)


def _write_forever(url: str) -> None:
    """The writer :class:`SqliteWriterKill` kills: puts and appends until killed."""
    from agentrooms.store import Append, Put, open_store

    async def run() -> None:
        store = await open_store(url)
        n = 0
        while True:
            n += 1
            writes = [Put(f"w{n % 8}", "x" * (n % 2000))]
            with contextlib.suppress(Exception):
                await store.transact("writer", (), writes, [Append("w", n)])

    asyncio.run(run())


# -------------------------------------------------------------------------------- rig


@dataclass
class Rig:
    """A store a run owns. ``url``: what clients open (through ``proxy`` on Redis and
    PostgreSQL, with the rig's short ``timeout``); ``direct_url``: the same store past
    the proxy; ``faults``: the faults a run may inject (none on ``memory://``), all
    logging into ``log``; ``redis``: the test-owned server on Redis."""

    backend: str
    url: str
    direct_url: str
    faults: list[Fault] = field(default_factory=list)
    log: Log = field(default_factory=list)
    proxy: TcpProxy | None = None
    redis: RedisServer | None = None
    database: str | None = None

    async def heal_all(self) -> None:
        """Heal every fault (each heal is idempotent)."""
        for fault in self.faults:
            await fault.heal()


def _with(url: str, timeout: float) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}timeout={timeout:g}&connect_timeout={timeout:g}"


def proxy_faults(proxy: TcpProxy, log: Log, delay: float) -> list[Fault]:
    """The proxy's five modes as faults."""
    return [
        Delay(proxy, delay, log),
        Drop(proxy, log),
        Reset(proxy, log),
        Blackhole(proxy, log),
        ResetInFlight(proxy, log),
    ]


@contextlib.asynccontextmanager
async def store_under_test(
    backend: str,
    workdir: str | Path | None = None,
    *,
    timeout: float = 1.0,
    aof: bool = True,
    postgres_admin: str = POSTGRES_ADMIN,
) -> AsyncIterator[Rig]:
    """A store for one run, on ``backend`` (``memory``, ``sqlite``, ``redis``,
    ``postgres``), with its faults, stopped or dropped on exit (every fault healed first).

    * ``sqlite``: a file in ``workdir``; :class:`SqliteWriterKill` (its writer runs while
      the rig is open).
    * ``redis``: a :class:`RedisServer` of its own (``aof``: appendfsync always, the
      default; without it :class:`RedisRestart` is left out of ``faults``, since it
      forgets acknowledged writes), behind a :class:`TcpProxy`; the proxy's modes,
      ``CLIENT PAUSE`` WRITE and ALL (:data:`PAUSE_ALL_MS`), and the restart.
    * ``postgres``: a database created for the rig on ``postgres_admin``'s server (dropped
      with ``FORCE`` on exit), behind a proxy; the proxy's modes and :class:`PgTerminate`.

    Every URL carries ``timeout`` and ``connect_timeout`` = ``timeout`` seconds; the
    proxy's delay is a quarter of it. ``RuntimeError`` or ``OSError`` if a service cannot
    be started or reached, ``ValueError`` for an unknown backend.
    """
    if backend == "memory":
        yield Rig(backend, "memory://", "memory://")
        return
    if backend not in ("sqlite", "redis", "postgres"):
        raise ValueError(f"no such backend {backend!r}")
    async with contextlib.AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=workdir)))
        log: Log = []
        if backend == "sqlite":
            rig = _sqlite_rig(stack, tmp, timeout, log)
        elif backend == "redis":
            rig = await _redis_rig(stack, tmp, timeout, aof, log)
        else:
            host, port, dbname = await stack.enter_async_context(_database(postgres_admin))
            proxy = _proxy(stack, (host, port))
            url = _with(f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname}", timeout)
            direct = _with(f"postgresql://postgres@{host}:{port}/{dbname}", timeout)
            faults = proxy_faults(proxy, log, timeout / 4)
            faults.append(PgTerminate(postgres_admin, dbname, log))
            rig = Rig(backend, url, direct, faults, log, proxy, database=dbname)
        try:
            yield rig
        finally:
            await rig.heal_all()
            if rig.proxy is not None:
                rig.proxy.stop()


def _proxy(stack: contextlib.AsyncExitStack, target: tuple[str, int]) -> TcpProxy:
    proxy = TcpProxy(target)
    proxy.start()
    stack.callback(proxy.stop)
    return proxy


def _sqlite_rig(stack: contextlib.AsyncExitStack, tmp: Path, timeout: float, log: Log) -> Rig:
    path = tmp / "store.db"
    url = _with(f"sqlite:///{path}", timeout)
    writer = SqliteWriterKill(_with(f"sqlite:///{path}", 30.0), path, log)
    stack.callback(writer.stop)
    writer.start()
    return Rig("sqlite", url, url, [writer], log)


async def _redis_rig(
    stack: contextlib.AsyncExitStack, tmp: Path, timeout: float, aof: bool, log: Log
) -> Rig:
    server = RedisServer(tmp, aof=aof)
    await server.start()
    stack.callback(server.stop)
    proxy = _proxy(stack, ("127.0.0.1", server.port))
    prefix = f"rig{uuid.uuid4().hex[:8]}"
    url = _with(f"redis://127.0.0.1:{proxy.port}/0?prefix={prefix}", timeout)
    direct = _with(f"{server.url}?prefix={prefix}", timeout)
    faults = proxy_faults(proxy, log, timeout / 4)
    faults += [
        ClientPause(server, "WRITE", log=log),
        ClientPause(server, "ALL", ms=PAUSE_ALL_MS, log=log),
    ]
    if aof:
        faults.append(RedisRestart(server, log))
    return Rig("redis", url, direct, faults, log, proxy, server)


@contextlib.asynccontextmanager
async def _database(admin_url: str) -> AsyncIterator[tuple[str, int, str]]:
    """A database created on ``admin_url``'s server, dropped (``WITH (FORCE)``) after."""
    dbname = f"agentrooms_rig_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{dbname}"')
    finally:
        await conn.close()
    parts = urlsplit(admin_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    try:
        yield host, port, dbname
    finally:
        conn = await asyncpg.connect(admin_url, timeout=10)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        finally:
            await conn.close()
