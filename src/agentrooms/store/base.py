"""The store contract: one atomic primitive that every backend implements natively.

Everything above this module (commit loop, plans, leases, locks, cursors, effects) talks
to a :class:`Store` and never to Redis or SQL directly.

A store holds, per **room**, a set of **records** ``key -> (value, version, expires_at)``
and an append-only **event log** numbered by a gapless per-room sequence.

Invariants every backend keeps (and the conformance suite checks):

* A record's ``version`` strictly increases on every write and is never reused, not even
  after a delete and re-create (versions come from a store-wide or room-wide counter, or
  on PostgreSQL from a record's own block of a store-wide counter).
* Expiry is judged by the store's own clock. An expired record is absent to ``read``,
  ``scan`` and every compare.
* ``transact`` is all-or-nothing: on any failed compare nothing is written and nothing is
  appended.
* Event sequence numbers are assigned by the store: per room, starting at 1, gapless and
  strictly increasing in commit order.

Public methods validate and encode their input once, before the backend sees it
(:mod:`agentrooms.store.validation`): bad input raises
:class:`~agentrooms.errors.BadRequest` (or ``PayloadTooLarge``) and nothing is written.
Backends implement the underscored methods. The types are in :mod:`agentrooms.store.types`.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Hashable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from agentrooms.errors import BadRequest, VersionConflict
from agentrooms.store.contention import Contention
from agentrooms.store.types import (
    Append,
    Compare,
    Event,
    Glance,
    KeyPage,
    Limits,
    Prepared,
    ScanPage,
    Snapshot,
    StoreInfo,
    TransactResult,
    Write,
)
from agentrooms.store.validation import (
    check_int,
    check_key,
    check_limit,
    check_room,
    check_timeout,
    prepare_transact,
)

if TYPE_CHECKING:
    from agentrooms.session import Session

# ------------------------------------------------------------ helpers for queued calls


def settle(future: asyncio.Future[Any], outcome: object) -> None:
    """Hand a queued call's caller its outcome, a result or an exception to raise, unless
    it gave up waiting (for backends that send queued calls together)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def seen(future: asyncio.Future[Any]) -> None:
    """Mark a future's or task's failure as seen, for one that nobody may await (every
    caller of a shared task gave up; a reply failed behind another's): asyncio would log
    "exception was never retrieved" otherwise. Usable as a done callback."""
    if future.done() and not future.cancelled():
        future.exception()


# ---------------------------------------------------------------------------- contract


class Store(abc.ABC):
    """The atomic store primitive. One instance is safe to share between coroutines.

    Open one with :func:`agentrooms.open_store` and close it with ``await store.close()``
    or ``async with``.
    """

    backend: str = "abstract"
    shared_by_url: bool = False  # handles opened with equal URLs reach the same data

    def __init__(self, url: str, limits: Limits | None = None) -> None:
        self.url = url
        self.limits = limits or Limits()
        self.contention = Contention(self)  # the conflicts this handle's transacts met

    @classmethod
    async def open(cls, url: str, limits: Limits | None = None) -> Self:
        """Connect to the store named by ``url``, creating or migrating its schema."""
        return cls(url, limits)

    @property
    def identity(self) -> Hashable:
        """The data this handle reaches: two handles of equal identity read and write
        the same rooms, so one process may serve both with one reader of a room's log
        (:mod:`agentrooms.rooms.follow`). A handle is only equal to itself, unless its
        backend is a server that every handle opened with the same URL reaches
        (:attr:`shared_by_url`)."""
        return (self.backend, self.url) if self.shared_by_url else self

    @property
    def session(self) -> Session:
        """What this process knows about the data this handle reaches, made on first use:
        caches and local turns that save reads and collisions, never a source of truth
        (:mod:`agentrooms.session`)."""
        session: Session | None = self.__dict__.get("_session")
        if session is None:
            from agentrooms.session import Session

            session = self.__dict__["_session"] = Session(self)
        return session

    @property
    def follow_returns_events(self) -> bool:
        """Whether :meth:`follow_log` gets the new events in the round trip that waits
        for them (Redis: ``XREAD BLOCK``). If not, it is :meth:`watch`, then
        :meth:`read_log`, and a reader that already holds every new event (this process
        appended them) can stop after the watch."""
        return False

    # -- public, validated -------------------------------------------------------

    async def read(self, room: str, keys: Sequence[str]) -> Snapshot:
        """Read ``keys`` of ``room`` as one snapshot.

        Atomic: every returned record's value and version are from the same instant,
        and ``now`` is the store's clock at that instant. Absent or expired keys are
        simply missing from ``records``.
        """
        room = check_room(room, self.limits)
        if isinstance(keys, str):
            raise BadRequest("keys must be a sequence of strings, not one string")
        key_list = [check_key(k, self.limits) for k in keys]
        if len(key_list) > self.limits.max_ops:
            raise BadRequest(f"read at most {self.limits.max_ops} keys at once")
        return await self._read(room, list(dict.fromkeys(key_list)))

    async def transact(
        self,
        room: str,
        compares: Iterable[Compare] = (),
        writes: Iterable[Write] = (),
        appends: Iterable[Append] = (),
    ) -> TransactResult:
        """Check every compare, then apply every write and append, all or nothing.

        Returns the new version of each put key, the sequence numbers given to the
        appended events (in order) and the store time of the commit.

        Raises :class:`~agentrooms.errors.StaleFence` if a ``FenceAtMost`` fails, else
        :class:`~agentrooms.errors.VersionConflict` naming *every* failing key with its
        current version (``None`` if absent). In both cases nothing changed. A
        ``VersionConflict`` is counted in :attr:`contention` (memory only, no round trip).
        """
        room = check_room(room, self.limits)
        prepared = prepare_transact(compares, writes, appends, self.limits)
        try:
            return await self._transact(room, prepared)
        except VersionConflict as exc:
            self.contention.note(room, exc.conflicts)
            raise

    async def glance(
        self, rooms: Sequence[str], keys: Sequence[str], sets: Sequence[str] = ()
    ) -> list[Glance]:
        """Records ``keys``, the newest sequence number and the sizes of sets ``sets`` of
        each of ``rooms``, in the order of ``rooms``, as one request (one statement, one
        worker job, one script run on Redis, one write per node on a cluster): what
        describes a page of rooms without a round trip per room.

        Each room's :class:`Glance` is one snapshot (as :meth:`read`); different rooms'
        may be from different instants. A room that holds nothing reads as empty. At most
        ``limits.max_page`` rooms, and ``limits.max_ops`` keys and sets; ``BadRequest``
        otherwise.
        """
        if isinstance(rooms, str) or isinstance(keys, str) or isinstance(sets, str):
            raise BadRequest("rooms, keys and sets must be sequences of strings, not strings")
        room_list = [check_room(r, self.limits) for r in rooms]
        if len(room_list) > self.limits.max_page:
            raise BadRequest(f"glance at most {self.limits.max_page} rooms at once")
        key_list = list(dict.fromkeys(check_key(k, self.limits) for k in keys))
        set_list = list(dict.fromkeys(check_key(n, self.limits) for n in sets))
        if len(key_list) + len(set_list) > self.limits.max_ops:
            raise BadRequest(f"glance at most {self.limits.max_ops} keys and sets at once")
        if not room_list:
            return []
        return await self._glance(room_list, key_list, set_list)

    async def scan(
        self, room: str, prefix: str = "", after: str | None = None, limit: int = 100
    ) -> ScanPage:
        """Records whose key starts with ``prefix`` and sorts after ``after``, in key
        order (Unicode code point order), at most ``limit`` of them.

        ``next_after`` is ``None`` when the listing is complete, otherwise the key to
        pass as ``after`` for the next page. Each page is one snapshot.
        """
        room = check_room(room, self.limits)
        if not isinstance(prefix, str):
            raise BadRequest("prefix must be a string")
        if after is not None:
            check_key(after, self.limits)
        return await self._scan(room, prefix, after, check_limit(limit, self.limits))

    async def scan_rooms(
        self,
        rooms: Sequence[str],
        prefix: str = "",
        limit: int = 100,
        after: str | None = None,
    ) -> list[ScanPage]:
        """The :meth:`scan` page after ``after`` (records under ``prefix``, at most
        ``limit``) of each of ``rooms``, in the order of ``rooms``, as one request: what
        reads one kind of record of a page of rooms without a round trip per room. Each
        room's page is one snapshot (as :meth:`scan`); different rooms' may be from
        different instants; continue a room with :meth:`scan` from its ``next_after``.
        At most ``limits.max_page`` rooms; ``BadRequest`` otherwise.

        One request: one worker job (SQLite), one statement (PostgreSQL), one script run
        over every room (Redis; on a cluster a script per room, in one write to each node
        that owns some of the rooms, the nodes at once).
        """
        room_list, limit = self._check_scan_rooms(rooms, prefix, limit, after)
        if not room_list:
            return []
        return await self._scan_rooms(room_list, prefix, after, limit)

    async def scan_keys(
        self,
        rooms: Sequence[str],
        prefix: str = "",
        limit: int = 100,
        after: str | None = None,
    ) -> list[KeyPage]:
        """:meth:`scan_rooms` without the records: the keys of each room's page and its
        ``next_after``, as one request (the same on every backend), with no value read,
        sent or decoded. What reads an index of names, such as the room registry."""
        room_list, limit = self._check_scan_rooms(rooms, prefix, limit, after)
        if not room_list:
            return []
        return await self._scan_keys(room_list, prefix, after, limit)

    def _check_scan_rooms(
        self, rooms: Sequence[str], prefix: str, limit: int, after: str | None
    ) -> tuple[list[str], int]:
        """:meth:`scan_rooms`' and :meth:`scan_keys`' arguments checked: the rooms and
        the limit, or ``BadRequest``."""
        if isinstance(rooms, str):
            raise BadRequest("rooms must be a sequence of strings, not one string")
        room_list = [check_room(r, self.limits) for r in rooms]
        if len(room_list) > self.limits.max_page:
            raise BadRequest(f"scan at most {self.limits.max_page} rooms at once")
        if not isinstance(prefix, str):
            raise BadRequest("prefix must be a string")
        if after is not None:
            check_key(after, self.limits)
        return room_list, check_limit(limit, self.limits)

    async def read_log(self, room: str, after: int = 0, limit: int = 100) -> list[Event]:
        """Events with ``seq > after`` in order, at most ``limit``.

        Raises :class:`~agentrooms.errors.CursorCompacted` if any event after ``after``
        has been trimmed, never returning a silent gap.
        """
        room = check_room(room, self.limits)
        return await self._read_log(
            room, check_int(after, "after", 0), check_limit(limit, self.limits)
        )

    async def trim_log(self, room: str, before: int) -> int:
        """Drop events with ``seq < before`` (never past the newest event: ``before`` is
        capped at ``last_seq + 1``). Returns the first sequence number still readable,
        which never decreases. Idempotent."""
        room = check_room(room, self.limits)
        return await self._trim_log(room, check_int(before, "before", 0))

    async def last_seq(self, room: str) -> int:
        """The sequence number of the room's newest event (0 if none was ever appended)."""
        return await self._last_seq(check_room(room, self.limits))

    async def set_pick(self, room: str, name: str, count: int = 1) -> list[str]:
        """Up to ``count`` members of set ``name``, least recently picked first (members
        never picked before come first, in member order), and mark them picked now.

        Atomic: concurrent callers are handed different members while the set has enough,
        so agents claiming work from one set do not all race for its head. Picking does
        not remove: the caller removes a member (``SetRemove``) in the transact that
        claims it, so a caller that dies after picking loses nothing. Cost does not grow
        with the size of the set.
        """
        room = check_room(room, self.limits)
        name = check_key(name, self.limits)
        return await self._set_pick(room, name, check_limit(count, self.limits))

    async def set_size(self, room: str, name: str) -> int:
        """How many members set ``name`` has."""
        room = check_room(room, self.limits)
        return await self._set_size(room, check_key(name, self.limits))

    async def watch(self, room: str, after: int, timeout: float) -> int:
        """Wait until the room's log holds an event with ``seq > after`` or ``timeout``
        seconds pass; return the newest sequence number then (``<= after`` on timeout).

        Woken by the store (Redis blocking read, PostgreSQL LISTEN/NOTIFY, in-process
        notification with a slow poll fallback for other processes), not by polling in a
        hot loop.
        """
        room = check_room(room, self.limits)
        after = check_int(after, "after", 0)
        return await self._watch(room, after, check_timeout(timeout))

    async def follow_log(
        self, room: str, after: int, timeout: float, limit: int = 100
    ) -> list[Event]:
        """``watch``, then ``read_log``, as one call: wait until the room's log holds an
        event with ``seq > after`` or ``timeout`` seconds pass, and return the events
        after ``after`` (at most ``limit``, in order; ``[]`` on timeout). Raises
        ``CursorCompacted`` like ``read_log``.

        For a reader that follows a log for many waiters (:mod:`agentrooms.rooms.follow`):
        a backend whose blocking read already returns the entries answers in one round
        trip (Redis: ``XREAD BLOCK``); the others watch, then read.
        """
        room = check_room(room, self.limits)
        after, timeout = check_int(after, "after", 0), check_timeout(timeout)
        return await self._follow_log(room, after, timeout, check_limit(limit, self.limits))

    async def delete_room(self, room: str) -> None:
        """Delete every record, set and event of ``room``, atomically.

        Counters survive: versions are never reused, and the log's sequence continues
        from where it was with everything before it trimmed, so a cursor kept from before
        the delete gets ``CursorCompacted`` instead of silently reading new events.
        """
        await self._delete_room(check_room(room, self.limits))

    async def info(self) -> StoreInfo:
        """Backend, durability settings and warnings about unsafe settings."""
        return await self._info()

    async def close(self) -> None:
        if self.contention.owner is self:
            await self.contention.close()
        await self._close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- backend seam ------------------------------------------------------------

    @abc.abstractmethod
    async def _read(self, room: str, keys: list[str]) -> Snapshot: ...

    @abc.abstractmethod
    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        """Apply ``ops`` (compares, then writes, set ops and appends) atomically."""

    @abc.abstractmethod
    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        """One backend call for every room (see :meth:`glance`)."""

    @abc.abstractmethod
    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage: ...

    async def _scan_rooms(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[ScanPage]:
        """Default: every room's scan at once (one round trip each, concurrently)."""
        return list(await asyncio.gather(*(self._scan(r, prefix, after, limit) for r in rooms)))

    async def _scan_keys(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[KeyPage]:
        """Default: :meth:`_scan_rooms`, values dropped (a backend that can leave them
        unread overrides this)."""
        pages = await self._scan_rooms(rooms, prefix, after, limit)
        return [KeyPage([r.key for r in p.records], p.next_after) for p in pages]

    @abc.abstractmethod
    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]: ...

    @abc.abstractmethod
    async def _trim_log(self, room: str, before: int) -> int: ...

    @abc.abstractmethod
    async def _last_seq(self, room: str) -> int: ...

    @abc.abstractmethod
    async def _set_pick(self, room: str, name: str, count: int) -> list[str]: ...

    @abc.abstractmethod
    async def _set_size(self, room: str, name: str) -> int: ...

    @abc.abstractmethod
    async def _watch(self, room: str, after: int, timeout: float) -> int: ...

    async def _follow_log(self, room: str, after: int, timeout: float, limit: int) -> list[Event]:
        """Default: ``_watch``, then ``_read_log`` if something came."""
        if await self._watch(room, after, timeout) <= after:
            return []
        return await self._read_log(room, after, limit)

    @abc.abstractmethod
    async def _delete_room(self, room: str) -> None: ...

    @abc.abstractmethod
    async def _info(self) -> StoreInfo: ...

    @abc.abstractmethod
    async def _close(self) -> None: ...
