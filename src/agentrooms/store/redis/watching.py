"""The Redis store's blocking reads: ``watch`` and ``follow_log`` that wait.

Each waiting read takes a *watch wire* of its own (an idle one, or one dialled now), so
waiters never hold up the hot path's connection, and a connection left mid-``BLOCK``
never serves anything else: it is closed unless every reply was read. At most
``max_connections`` watch wires at once; waiters beyond that queue, their queueing
counted against their own timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError

from agentrooms.errors import CursorCompacted
from agentrooms.store.base import Store, seen
from agentrooms.store.redis import scripts
from agentrooms.store.redis.keys import room_keys
from agentrooms.store.redis.wire import Arg, Wire, dial, unavailable
from agentrooms.store.types import Event


class WatchReads(Store):
    """The blocking reads of :class:`~agentrooms.store.redis.backend.RedisStore`, over
    its pool of watch wires (the store sets the attributes annotated here)."""

    prefix: str
    timeout: float
    connect_timeout: float
    _closed: bool
    _options: AbstractConnection

    def _init_watchers(self, max_watchers: int) -> None:
        self._max_watchers = max_watchers
        self._watchers = asyncio.Semaphore(max_watchers)
        self._idle_watch: list[Wire] = []
        self._busy_watch: set[Wire] = set()

    @property
    def follow_returns_events(self) -> bool:
        return True  # XREAD BLOCK returns the entries: see _follow_log

    async def _watch(self, room: str, after: int, timeout: float) -> int:
        """One HGET; if the log is not yet past ``after``, a blocking read on a watch
        connection (:func:`~agentrooms.store.redis.scripts.watch_command`) until an append
        or the timeout.

        The HGET first matters: after ``delete_room`` the log may hold no entry above
        ``after`` although the sequence is past it (``trim_log`` always keeps the newest
        entry, so it cannot cause this; either way the answer comes from the meta
        hash, never from the stream). An append that lands between the HGET and the
        XREAD is still seen (XREAD returns at once: its entry is above ``after``), unless
        ``delete_room`` removes it in that instant too; then the wait ends at the
        timeout, with the right answer.

        A watch connection is used by one waiter at a time and only ever holds the
        pending XREAD + HGET; if the wait ends any other way than with both replies
        read (cancellation, deadline, error), the connection is closed before it goes
        back to the pool, which also frees the blocked client on the server.
        """
        seq = await self._last_seq(room)
        if seq > after or timeout <= 0:
            return seq
        keys = room_keys(self.prefix, room)
        replies = await self._blocking(
            keys.meta, partial(scripts.watch_command, keys, after), timeout, 2
        )
        if replies is None:  # no watch connection came free, or no time left
            return await self._last_seq(room)
        return 0 if replies[1] is None else int(replies[1])

    async def _follow_log(self, room: str, after: int, timeout: float, limit: int) -> list[Event]:
        """One round trip (:func:`~agentrooms.store.redis.scripts.follow_command`): the
        blocking read returns the new entries themselves, and the meta hash, read when it
        has returned, says whether any entry after ``after`` was trimmed
        (``CursorCompacted``, as ``read_log``).

        If the sequence is past ``after`` but the stream holds nothing above it (a
        ``delete_room`` removed the entries), the read waits out ``timeout`` and the
        meta hash then reports the compaction: the one case this costs a wait."""
        if timeout <= 0:
            return await super()._follow_log(room, after, timeout, limit)
        keys = room_keys(self.prefix, room)
        replies = await self._blocking(
            keys.meta, partial(scripts.follow_command, keys, after, limit), timeout, 2
        )
        if replies is None:
            return await self._read_log(room, after, limit)
        found, (seq, low) = replies
        if after + 1 < (1 if low is None else int(low)):
            raise CursorCompacted(room, after, int(low))
        entries = scripts.stream_entries(found)
        if not entries and seq is not None and int(seq) > after:
            return await self._read_log(room, after, limit)  # says why, or reads them
        return [scripts.event(eid, fields) for eid, fields in entries]

    async def _blocking(
        self, route: Arg, command: Callable[[int], list[bytes]], timeout: float, replies: int
    ) -> list[Any] | None:
        """Send ``command(block_ms)`` on a watch connection within ``timeout`` seconds
        and read its ``replies``; ``None`` if no watch connection came free in time.
        Waiters beyond the watch pool's bound queue, their wait counted against their
        own timeout; the read is bounded by the rest of it plus ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if not self._watchers.locked():
            await self._watchers.acquire()  # returns at once (no task, unlike wait_for)
        else:
            try:
                await asyncio.wait_for(self._watchers.acquire(), timeout)
            except TimeoutError:  # every watch connection stayed busy for the whole wait
                return None
        try:
            left = deadline - loop.time()
            if left <= 0:
                return None
            async with asyncio.timeout(left + self.timeout):
                return await self._block(command(scripts.block_ms(left)), replies, route)
        except (RedisError, OSError) as exc:  # a timeout is an OSError too
            raise unavailable(exc) from exc
        finally:
            self._watchers.release()

    async def _block(
        self, command: list[bytes], replies: int, route: Arg | None = None
    ) -> list[Any]:
        """Send ``command`` on a watch wire (an idle one, or one dialled now) and read
        its ``replies`` (``route``: the key it reads, for a cluster). The wire is kept
        for the next blocking read only if nothing is pending on it; otherwise
        (cancelled, deadline, error) it is closed, which also frees the blocked client
        on the server."""
        if self._closed:
            raise ConnectionError("the Redis store is closed")
        wire = self._idle_watch.pop() if self._idle_watch else None
        if wire is None or not wire.usable:
            async with asyncio.timeout(self.connect_timeout):
                wire = await dial(self._options)
        self._busy_watch.add(wire)
        futures: list[asyncio.Future[Any]] = []
        try:
            futures = wire.send(command, replies)
            answers = [await future for future in futures]
        except BaseException:
            wire.close()  # fails the replies still to come: seen here, raised once
            for future in futures:
                seen(future)
            raise
        finally:
            self._busy_watch.discard(wire)
        if self._closed:
            wire.close()
        else:
            self._idle_watch.append(wire)
        return answers
