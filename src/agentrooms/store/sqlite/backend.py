"""The embedded default store: SQLite in WAL mode, stdlib ``sqlite3`` only.

Open one with ``await open_store("sqlite:///agentrooms.db")`` (URL options in
:mod:`.config`). Any number of processes may open the same file; SQLite serialises their
writes (``BEGIN IMMEDIATE``) and the engine retries a busy database for up to the URL's
``timeout`` seconds before raising :class:`~agentrooms.errors.StoreUnavailable`. Every
process checks its clock, by which it judges expiry, against the file system holding the
database, and is refused with :class:`~agentrooms.errors.ClockSkew` while it disagrees
(:mod:`.clock`).

Operations run on a thread that owns the connection (:mod:`.worker`), one per database
file per process (:mod:`.pool`); the SQL is in ``queries.sql``, run by
:mod:`.operations` in transactions opened by :mod:`.engine`.

``watch`` waits on a future that the worker's thread resolves (on the waiter's own event
loop) when a commit of this process appends to the room, or when its slow poll (see
:mod:`.worker`) finds that another process did; it never polls in a hot loop.

Durability: with WAL and ``synchronous=FULL`` (the default) a commit is acknowledged only
after the WAL is synced, so it survives a process crash and a power loss. With
``synchronous=NORMAL`` it survives a process crash, but the last commits may be lost on
power loss or an OS crash; :meth:`info` warns about that.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import sqlite3
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Self, TypeVar, cast

from agentrooms.errors import StoreUnavailable
from agentrooms.store.base import Store
from agentrooms.store.sqlite.clock import ClockCheck, describe
from agentrooms.store.sqlite.config import SqliteConfig, parse_url
from agentrooms.store.sqlite.engine import Engine
from agentrooms.store.sqlite.operations import Operations
from agentrooms.store.sqlite.pool import POOL
from agentrooms.store.sqlite.watchers import Waiter
from agentrooms.store.sqlite.worker import Worker
from agentrooms.store.types import (
    Event,
    Glance,
    KeyPage,
    Limits,
    Prepared,
    ScanPage,
    Snapshot,
    StoreInfo,
    TransactResult,
)

T = TypeVar("T")
_ids = itertools.count(1)


class SqliteStore(Store):
    backend = "sqlite"

    def __init__(
        self,
        url: str = "sqlite://",
        limits: Limits | None = None,
        *,
        clock: Callable[[], float] = time.time,
        retry_for: float | None = None,
    ) -> None:
        """Start the store's thread, which connects and migrates before anything else;
        :meth:`open` also waits for that and raises if it failed. ``retry_for``
        (default: the URL's ``timeout``) bounds a call's retries of a locked database."""
        super().__init__(url, limits)
        self.config = config = parse_url(url)
        if retry_for is None:
            retry_for = config.timeout
        key = _pool_key(config, clock, retry_for)

        def start() -> Worker:
            return Worker(Engine(config, clock, retry_for), f"agentrooms-sqlite-{next(_ids)}")

        self._closed = False
        self._waiters: set[Waiter] = set()  # this store's watch calls, failed on close
        self._worker = POOL.acquire(key, start)
        self._release = weakref.finalize(self, POOL.release_nowait, key, self._worker)
        self._key = key

    @property
    def identity(self) -> Hashable:
        """Handles that share a worker (one database file, opened with the same
        options) reach the same data, and the worker wakes all their watches at once:
        one reader of a room's log serves the waiters of all of them. Handles of one file
        with other options have workers of their own, which see each other's commits
        only by polling, so each keeps its own reader. In-memory: only this handle."""
        return self if self._key is None else (self.backend, self._key)

    @classmethod
    async def open(cls, url: str, limits: Limits | None = None) -> Self:
        store = cls(url, limits)
        try:
            await store._call(lambda ops: None, write=False)
        except BaseException:
            await store.close()
            raise
        return store

    async def _call(self, job: Callable[[Operations], T], write: bool) -> T:
        if self._closed:
            raise StoreUnavailable("the sqlite store is closed")
        return cast(T, await self._worker.submit(job, write))

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        return await self._call(lambda ops: ops.read(room, keys), write=False)

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        return await self._call(lambda ops: ops.glance(rooms, keys, sets), write=False)

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        return await self._call(lambda o: o.transact(room, ops), write=True)

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        return await self._call(lambda ops: ops.scan(room, prefix, after, limit), write=False)

    async def _scan_rooms(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[ScanPage]:
        return await self._call(
            lambda ops: [ops.scan(room, prefix, after, limit) for room in rooms], write=False
        )

    async def _scan_keys(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[KeyPage]:
        return await self._call(lambda ops: ops.scan_keys(rooms, prefix, after, limit), write=False)

    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]:
        return await self._call(lambda ops: ops.read_log(room, after, limit), write=False)

    async def _trim_log(self, room: str, before: int) -> int:
        return await self._call(lambda ops: ops.trim_log(room, before), write=True)

    async def _last_seq(self, room: str) -> int:
        return await self._call(lambda ops: ops.last_seq(room), write=False)

    async def _set_pick(self, room: str, name: str, count: int) -> list[str]:
        return await self._call(lambda ops: ops.set_pick(room, name, count), write=True)

    async def _set_size(self, room: str, name: str) -> int:
        return await self._call(lambda ops: ops.set_size(room, name), write=False)

    async def _delete_room(self, room: str) -> None:
        await self._call(lambda ops: ops.delete_room(room), write=True)

    async def _watch(self, room: str, after: int, timeout: float) -> int:
        if self._closed or self._worker.closed:
            raise StoreUnavailable("the sqlite store is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # registered before reading: an append committed after the read wakes it
        waiter = self._worker.watchers.add(room, after)
        self._waiters.add(waiter)
        try:
            seq = await self._last_seq(room)
            remaining = deadline - loop.time()
            if seq > after or remaining <= 0:
                return seq
            try:
                return await asyncio.wait_for(waiter.future, remaining)
            except TimeoutError:
                pass
        finally:
            self._waiters.discard(waiter)
            self._worker.watchers.discard(waiter)
            if waiter.future.done() and not waiter.future.cancelled():
                waiter.future.exception()  # retrieved: a close may have failed it unawaited
        return await self._last_seq(room)  # timed out: the newest now (maybe <= after)

    async def _info(self) -> StoreInfo:
        settings = await self._call(lambda ops: ops.settings(), write=False)
        journal, sync = str(settings["journal_mode"]), str(settings["synchronous"])
        durability, warnings = describe_durability(self.config.in_memory, journal, sync)
        details = {"path": self.config.path, "sqlite_version": sqlite3.sqlite_version, **settings}
        check = self._worker.clock_check
        details["clock"] = describe_clock(check, self.config)
        if check is not None:
            details["clock_offset"] = check.offset
        details["timeout"] = self.config.timeout
        details["connect_timeout"] = self.config.connect_timeout
        return StoreInfo(self.backend, self.url, durability, warnings, details)

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._worker.watchers.fail("the sqlite store is closed", self._waiters.copy())
        self._release.detach()
        if POOL.release(self._key, self._worker):
            await self._worker.stop()


def _pool_key(
    config: SqliteConfig, clock: Callable[[], float], retry_for: float
) -> Hashable | None:
    """Stores with the same key share one worker (:mod:`.pool`); in-memory: never."""
    if config.in_memory:
        return None
    return (dataclasses.replace(config, path=os.path.realpath(config.path)), clock, retry_for)


def describe_clock(check: ClockCheck | None, config: SqliteConfig) -> str:
    """What the store judges expiry by, for ``info`` (and ``agentrooms doctor``)."""
    if config.in_memory:
        return "this process's clock (an in-memory database has no other process)"
    if check is None or check.offset is None:
        return "each process's own clock: max_clock_skew=off, so nothing checks it"
    return (
        f"this process's clock, {describe(check.offset)} the file system's "
        f"(at most {check.max_skew:g} s allowed; checked at open, then every second)"
    )


def describe_durability(in_memory: bool, journal: str, sync: str) -> tuple[str, list[str]]:
    """What an acknowledged commit survives, and warnings about unsafe settings."""
    if in_memory:
        return "none: an in-memory SQLite database is lost when the store closes", [
            "sqlite:// without a path keeps nothing: use it for tests, not for agents"
        ]
    setting = f"journal_mode={journal}, synchronous={sync}"
    if journal.lower() != "wal":
        return setting, [
            f"journal mode is {journal}, not WAL: readers and writers block each other"
        ]
    if sync in ("FULL", "EXTRA"):
        return f"{setting}: an acknowledged commit survives a process crash and power loss", []
    return (
        f"{setting}: an acknowledged commit survives a process crash, but the last ones "
        "may be lost on power loss or an OS crash",
        [
            f"synchronous={sync}: the last acknowledged commits may be lost on power loss "
            "or an OS crash (not on a process crash); use synchronous=FULL to keep them"
        ],
    )
