"""Designated-writer processes for the failover test, and what the tests share with them.

A writer process opens the store by URL and runs :meth:`Writer.run` until the parent
sets its stop event or kills it (SIGKILL). memory:// cannot be shared with a process, so
there the writer runs as a task on a :class:`Killable` handle: once killed, every store
call of that handle raises :class:`Killed` (nothing the library catches), so the writer
stops dead, holding its lock until it expires, as a killed process would.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrooms.commit import Intent, Where
from agentrooms.rooms import Rooms
from agentrooms.store import Append, Put, Store, open_store
from agentrooms.store.types import Event, Prepared, ScanPage, Snapshot, TransactResult
from agentrooms.writer import Writer, WriterMetrics
from tests.helpers import Interposed


class Killed(BaseException):
    """The in-process stand-in for SIGKILL."""


class Killable(Interposed):
    """A handle on a shared store that can be killed: afterwards every call raises."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.dead = False

    def kill(self) -> None:
        self.dead = True

    def _alive(self) -> None:
        if self.dead:
            raise Killed

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        self._alive()
        return await super()._read(room, keys)

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        self._alive()
        return await super()._transact(room, ops)

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        self._alive()
        return await super()._scan(room, prefix, after, limit)

    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]:
        self._alive()
        return await super()._read_log(room, after, limit)

    async def _last_seq(self, room: str) -> int:
        self._alive()
        return await super()._last_seq(room)

    async def _set_size(self, room: str, name: str) -> int:
        self._alive()
        return await super()._set_size(room, name)

    async def _watch(self, room: str, after: int, timeout: float) -> int:
        self._alive()
        seq = await super()._watch(room, after, timeout)
        self._alive()
        return seq


def chain_intent(i: int) -> Intent:
    """Intent ``i`` of a chain: applies only while ``counter.n == i``, then moves it to
    ``i + 1`` and logs ``chain {i}``. Applied twice or out of order, a link is rejected."""
    return Intent(
        [Where("counter", "n", "==", i)],
        [Put("counter", {"n": i + 1})],
        [Append("chain", {"i": i})],
    )


async def serve(store: Store, room: str, owner: str, lock_ttl: float, stop: asyncio.Event) -> None:
    writer = Writer(
        Rooms(store).room(room), owner=owner, lock_ttl=lock_ttl, metrics=WriterMetrics()
    )
    await writer.run(stop)


def writer_main(url: str, room: str, owner: str, lock_ttl: float, stop: Any) -> None:
    """Child process entry: serve the room's queue until ``stop`` (a multiprocessing
    event) is set."""

    async def run() -> None:
        store = await open_store(url)
        stopping = asyncio.Event()

        async def watch_stop() -> None:
            while not await asyncio.to_thread(stop.wait, 0.2):
                pass
            stopping.set()

        watcher = asyncio.create_task(watch_stop())
        try:
            await serve(store, room, owner, lock_ttl, stopping)
        finally:
            watcher.cancel()
            await store.close()

    asyncio.run(run())
