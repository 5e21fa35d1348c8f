"""The run's client processes: a fork server that imported the library once, each client
streaming its calls and outcomes to the runner over a socket, and the pool of them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import Any

from agentrooms.reliability.broken import BROKEN, StaleReads
from agentrooms.reliability.recorder import (
    LibrarySurface,
    Surface,
    _workload,
    run_client,
)
from agentrooms.reliability.torture.journal import Journal, Journaled
from agentrooms.reliability.torture.settings import HTTP_TIMEOUT, MCP_TIMEOUT, OPEN_TIMEOUT
from agentrooms.store import Store, open_store
from agentrooms.store.wrap import Forwarding

__all__ = ["PRELOAD", "Pool", "Worker"]


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
    "agentrooms.reliability.torture.clients",
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


async def _open(url: str) -> Store:
    """Open the store, again while it is unavailable (a client process replacing a
    killed one may start during a store fault) for up to :data:`OPEN_TIMEOUT` s."""
    from agentrooms.errors import StoreUnavailable

    deadline = time.monotonic() + OPEN_TIMEOUT
    while True:
        try:
            return await open_store(url)
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _client_process(sock: socket.socket, spec: dict[str, Any]) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=LINE_LIMIT)

    def emit(message: dict[str, Any]) -> None:
        writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    store = await _open(spec["url"]) if spec["surface"] == "library" else None
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
