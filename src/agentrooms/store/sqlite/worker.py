"""The thread that owns a store's SQLite connection, and the bridge to asyncio.

sqlite3 blocks, so a :class:`Worker` runs every operation on one dedicated thread with
one connection, shared by the stores of a process that opened the same file (see
:mod:`.pool`; SQLite serialises a database's writers anyway, so more connections would
only add lock waits). Coroutines :meth:`~Worker.submit` jobs into a queue and await a
future. The thread takes *everything queued* as one batch: the reads run in one read
transaction and their results go back at once, then the writes run in one write
transaction (see :mod:`.engine`), so concurrent writers share one commit and its WAL
sync. Results reach each event loop with one ``call_soon_threadsafe`` per batch; the
thread per store, not a thread per call, keeps the overhead of a call to a few
microseconds.

The thread also wakes ``watch``: after each write transaction it notifies the
:class:`~.watchers.Watchers` of the rooms it appended to, and while anyone is watching it
polls for commits of other processes (one ``PRAGMA data_version``), waiting on its queue
with a timeout instead of sleeping: every :data:`POLL_INTERVAL` seconds, or every
:data:`BUSY_POLL_INTERVAL` for :data:`BUSY_WINDOW` seconds after a poll found one, so
that processes taking turns (a lock handed from one to the next) wait milliseconds for
each other, not a tenth of a second, while an idle store is polled ten times a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from agentrooms.errors import StoreUnavailable
from agentrooms.store.sqlite.clock import ClockCheck
from agentrooms.store.sqlite.engine import Engine, Job
from agentrooms.store.sqlite.watchers import Watchers

MAX_BATCH = 64
POLL_INTERVAL = 0.1  # seconds between checks for other processes' commits, while watched
BUSY_POLL_INTERVAL = 0.005  # the same, for BUSY_WINDOW seconds after a check found one
BUSY_WINDOW = 1.0


@dataclass(slots=True)
class _Request:
    job: Job
    write: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


@dataclass(slots=True)
class _Stop:
    """Stop after the jobs queued before this; ``future`` (if any) resolves when done."""

    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[Any] | None = None


class Worker:
    def __init__(self, engine: Engine, name: str) -> None:
        self._engine = engine
        self.queue: queue.SimpleQueue[_Request | _Stop] = queue.SimpleQueue()
        self.watchers = Watchers()
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def clock_check(self) -> ClockCheck | None:
        """The check of this process's clock against the database's file system
        (``None``: in memory, or turned off); its ``offset`` is the last measurement."""
        return self._engine.clock_check

    @property
    def closed(self) -> bool:
        """Stopped, stopping, or orphaned by a fork: no new jobs."""
        return self._closed

    def submit(self, job: Job, write: bool) -> asyncio.Future[Any]:
        """Queue ``job``; the future resolves to its result or its error."""
        if self._closed:
            raise StoreUnavailable("the sqlite store is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put(_Request(job, write, loop, future))
        return future

    async def stop(self) -> None:
        """Finish the jobs already queued, close the connection, end the thread."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.queue.put(_Stop(loop, done))
        await done
        self._thread.join()

    def stop_nowait(self) -> None:
        """Stop after the jobs already queued, without waiting (from any thread)."""
        if not self._closed:
            self._closed = True
            self.queue.put(_Stop())

    def orphan(self) -> None:
        """In a forked child: the thread did not survive the fork, so refuse new jobs
        (they would wait forever) instead of queueing them."""
        self._closed = True

    # -- the thread -----------------------------------------------------------------

    def _main(self) -> None:
        failure = self._engine.start()
        stop: _Stop | None = None
        next_poll = 0.0  # monotonic time of the next poll, while someone is watching
        found = -math.inf  # monotonic time a poll last found another process's commit
        try:
            while stop is None:
                timeout = None
                if failure is None and self.watchers.waiting():
                    timeout = max(0.0, next_poll - time.monotonic())
                requests, stop = self._next_batch(timeout)
                self._run(requests, failure)
                if failure is None and time.monotonic() >= next_poll:
                    rooms = self.watchers.rooms()
                    if rooms:
                        now = time.monotonic()
                        if self._poll(rooms):
                            found = now
                        next_poll = now + poll_interval(now - found)
        finally:
            self._closed = True
            self._engine.close()
            self._fail_queued()
            self.watchers.fail("the sqlite store is closed")
            if stop is not None and stop.loop is not None and stop.future is not None:
                _deliver(stop.loop, [(stop.future, None)])

    def _poll(self, rooms: list[str]) -> bool:
        """Wake the watchers of ``rooms`` that another process appended to; ``True`` if
        another process committed anything since the last poll."""
        seqs = self._engine.foreign_seqs(rooms)
        if seqs:
            self.watchers.notify(seqs)
        return seqs is not None

    def _next_batch(self, timeout: float | None) -> tuple[list[_Request], _Stop | None]:
        """Everything queued now (at most ``MAX_BATCH``), waiting up to ``timeout``
        seconds (``None``: as long as it takes) for the first item."""
        requests: list[_Request] = []
        try:
            item = self.queue.get(timeout=timeout)
        except queue.Empty:
            return requests, None
        while isinstance(item, _Request):
            requests.append(item)
            if len(requests) == MAX_BATCH:
                return requests, None
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return requests, None
        return requests, item

    def _run(self, batch: list[_Request], failure: Exception | None) -> None:
        for write in (False, True):
            requests = [r for r in batch if r.write is write]
            if not requests:
                continue
            if failure is None:
                outcomes = self._engine.run([r.job for r in requests], write)
            else:
                outcomes = [_failed_start(failure) for _ in requests]
            _deliver_all(requests, outcomes)
            if write and failure is None:
                self.watchers.notify(self._engine.take_appended())

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Request):
                _deliver_all([item], [_unavailable("the sqlite store is closed", None)])


def poll_interval(since_found: float) -> float:
    """Seconds to the next poll, ``since_found`` seconds after one last found another
    process's commit."""
    return BUSY_POLL_INTERVAL if since_found < BUSY_WINDOW else POLL_INTERVAL


def _failed_start(failure: Exception) -> StoreUnavailable:
    """A fresh error per caller for a store that could not start, with the same cause."""
    if isinstance(failure, StoreUnavailable):
        return _unavailable(str(failure), failure.__cause__)
    return _unavailable(f"the sqlite store could not start: {failure!r}", failure)


def _unavailable(message: str, cause: BaseException | None) -> StoreUnavailable:
    error = StoreUnavailable(message)
    error.__cause__ = cause
    error.__suppress_context__ = True
    return error


def _deliver_all(requests: list[_Request], outcomes: list[Any]) -> None:
    """Hand each outcome to its future, one ``call_soon_threadsafe`` per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for request, outcome in zip(requests, outcomes, strict=True):
        by_loop.setdefault(request.loop, []).append((request.future, outcome))
    for loop, settled in by_loop.items():
        _deliver(loop, settled)


def _deliver(
    loop: asyncio.AbstractEventLoop, settled: list[tuple[asyncio.Future[Any], Any]]
) -> None:
    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is waiting
        loop.call_soon_threadsafe(_settle, settled)


def _settle(settled: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for future, outcome in settled:
        if future.done():  # cancelled while it ran
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
