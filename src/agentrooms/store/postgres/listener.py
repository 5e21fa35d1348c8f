"""The PostgreSQL backend's ``watch``: one LISTEN connection per store, shared by its waiters.

``transact()`` (functions/transact.sql) notifies the schema's channel with ``room:seq``,
the room and its newest sequence number, when it appends; PostgreSQL delivers it at
commit. The store keeps one dedicated connection, outside its pool and opened on the first
``watch``, that LISTENs to that channel and wakes the waiters of the room whose ``after``
the number passes.

The protocol that makes a wake-up impossible to miss (``PostgresStore._watch``):

1. register a :class:`Waiter` for the room;
2. make sure the connection is listening (:meth:`Listener.listen`, reconnecting if need be);
3. read the room's last sequence number: an append committed before this read is seen
   by it, one committed after it is notified to a registered waiter;
4. wait for the waiter's future (or the timeout): a notification resolves it with the
   sequence number it carries, which is the answer; anything else (a dropped
   connection, the timeout) starts again from 1.

Step 3 needs no query when the connection already knows the answer: while it stays
open, every append to a room is notified to it, in commit order, so the newest number
it has seen for a room (:meth:`Listener.newest`: from a notification, or from a step 3
read made while it listened) stays the room's newest but for appends whose
notifications are still on their way, and those wake the waiter registered in step 1.
A process's follower, which watches again after every batch, then waits on the
notification alone. The record starts empty on every (re)connection.

If the connection drops, notifications sent meanwhile are lost: every waiter is woken so
that it reconnects (step 2) and re-reads (step 3). A payload that is not ours (another
application on the same channel) wakes nobody. Two schemas whose names share their
first 52 bytes share a channel (it is cut to 63 bytes); then a notified number may be
another store's, so it only wakes the waiter to re-read (step 3), at the cost of one
query, instead of being its answer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from agentrooms.errors import StoreUnavailable

_CLOSE_TIMEOUT = 5.0  # seconds the listening connection gets to close before it is cut
ROOMS_KNOWN = 10_000  # rooms whose newest seq the listener remembers


@dataclass(eq=False, slots=True)
class Waiter:
    """One ``watch`` round: its future resolves to the notified sequence number once the
    room's log passes ``after`` (to ``None`` if the connection dropped: re-check), or
    fails with ``StoreUnavailable`` on close."""

    room: str
    after: int
    future: asyncio.Future[int | None] = field(init=False)

    def __post_init__(self) -> None:
        self.future = asyncio.get_running_loop().create_future()


class Listener:
    """The store's LISTEN connection and the waiters it wakes. One event loop."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        channel_query: str,
        schema: str,
    ) -> None:
        self._connect = connect
        self._channel_query = channel_query  # the channel of the schema named by $1
        self._schema = schema
        self._conn: asyncpg.Connection | None = None
        self._exact = False  # the channel is this schema's alone: trust its numbers
        # room -> the newest seq seen while the connection listened (see newest())
        self._newest: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._generation = 0  # connections made: a record from an older one is void
        self._opening = asyncio.Lock()
        self._rooms: dict[str, set[Waiter]] = {}
        self._closed = False

    @property
    def listening(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    def newest(self, room: str) -> int | None:
        """The room's newest sequence number as far as this connection knows, if it
        listens on a channel of its own and has seen one for the room: a lower bound
        such that any append past it is notified (step 3 without a query)."""
        if not self._exact or not self.listening:
            return None
        return self._newest.get(room)

    def learned(self, room: str, seq: int, generation: int) -> None:
        """A step 3 read of ``room`` gave ``seq``, on the connection ``generation``
        (:attr:`generation` when the read began): remember it if still that one."""
        if generation == self._generation and self.listening:
            self._note(room, seq)

    @property
    def generation(self) -> int:
        return self._generation

    def _note(self, room: str, seq: int) -> None:
        newest = self._newest
        newest[room] = max(seq, newest.get(room, seq))
        newest.move_to_end(room)
        while len(newest) > ROOMS_KNOWN:
            newest.popitem(last=False)  # the longest unused: its next watch queries

    def add(self, room: str, after: int) -> Waiter:
        """Register a waiter for ``room`` passing ``after`` (before reading its last seq)."""
        if self._closed:
            raise StoreUnavailable("the PostgreSQL store is closed")
        waiter = Waiter(room, after)
        self._rooms.setdefault(room, set()).add(waiter)
        return waiter

    def discard(self, waiter: Waiter) -> None:
        """Forget ``waiter`` (woken, timed out or cancelled); idempotent."""
        waiters = self._rooms.get(waiter.room)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._rooms[waiter.room]
        if waiter.future.done() and not waiter.future.cancelled():
            waiter.future.exception()  # retrieved: close may have failed it unawaited

    async def listen(self) -> None:
        """Return once the connection LISTENs to the store's channel, (re)connecting if
        it is not open. Driver errors propagate (the backend translates them)."""
        if self.listening:
            return
        async with self._opening:
            if self._closed:
                raise StoreUnavailable("the PostgreSQL store is closed")
            if self.listening:
                return
            conn = await self._connect()
            try:
                row = await conn.fetchrow(self._channel_query, self._schema)
                assert row is not None
                channel: str = row["channel"]
                self._exact = bool(row["exact"])
                await conn.add_listener(channel, self._notified)
                conn.add_termination_listener(self._terminated)
            except BaseException:
                conn.terminate()
                raise
            if self._closed:  # closed while connecting
                await _close_or_cut(conn)
                raise StoreUnavailable("the PostgreSQL store is closed")
            # Appends made while no connection listened: the waiters a drop woke read
            # the last seq after this returns, and later ones register before reading.
            self._newest.clear()
            self._generation += 1
            self._conn = conn

    def _notified(self, conn: object, pid: int, channel: str, payload: object) -> None:
        if not isinstance(payload, str):
            return
        room, sep, seq_text = payload.rpartition(":")
        if not sep or not seq_text.isascii() or not seq_text.isdigit():
            return  # not ours
        seq = int(seq_text)
        if self._exact:
            self._note(room, seq)
        for waiter in list(self._rooms.get(room, ())):
            if seq > waiter.after and not waiter.future.done():
                waiter.future.set_result(seq if self._exact else None)

    def _terminated(self, conn: object) -> None:
        """The connection closed (dropped by the server or the network, or by us)."""
        if conn is self._conn:
            self._conn = None
            self._newest.clear()
            self._generation += 1
        self.wake_all()

    def wake_all(self) -> None:
        """Wake every waiter to re-check (notifications may have been lost)."""
        for waiters in self._rooms.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_result(None)

    async def close(self) -> None:
        """Stop listening and fail every waiter with ``StoreUnavailable``; idempotent."""
        self._closed = True
        for waiters in self._rooms.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(StoreUnavailable("the PostgreSQL store closed"))
        conn, self._conn = self._conn, None
        if conn is not None:
            await _close_or_cut(conn)


async def _close_or_cut(conn: asyncpg.Connection) -> None:
    if conn.is_closed():
        return
    try:
        await asyncio.wait_for(conn.close(), _CLOSE_TIMEOUT)
    except Exception:
        with contextlib.suppress(Exception):
            conn.terminate()
