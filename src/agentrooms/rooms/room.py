"""Rooms: create, list, describe, archive, delete; and one room's parts.

A room exists while its ``_meta`` record does; ``_archived`` makes it read-only. Rooms are
also listed in the sharded registry (:mod:`agentrooms.rooms.registry`) so they can be
enumerated. Keys,
events, cursors, sets and locks of one room are invisible to every other room: the store
keeps rooms apart, and every operation here names exactly one room.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from agentrooms.errors import InvalidTransition, VersionConflict
from agentrooms.metrics import Metrics
from agentrooms.retry import RetryPolicy
from agentrooms.rooms import keys, registry
from agentrooms.rooms.documents import Documents
from agentrooms.rooms.events import Events
from agentrooms.rooms.locks import Locks, knowledge_of
from agentrooms.rooms.paths import Paths
from agentrooms.rooms.plan import Plan
from agentrooms.rooms.presence import Presence
from agentrooms.rooms.scope import Scope
from agentrooms.store.base import Store
from agentrooms.store.types import JSON, Absent, Append, Glance, Present, Put
from agentrooms.store.validation import check_limit

REGISTRY_SCAN = 1000
"""Registry entries read per scan while filling a page of rooms."""


@dataclass(frozen=True, slots=True)
class RoomInfo:
    name: str
    description: str
    metadata: JSON
    created_at: float  # store clock
    archived: bool
    last_seq: int = 0
    ready: int = 0

    @classmethod
    def of(cls, glance: Glance) -> RoomInfo | None:
        """The room as :meth:`Room.describe` reads it, from a glance at
        ``[keys.META, keys.ARCHIVED]`` and set ``keys.READY``; ``None`` if it does not
        exist."""
        records = glance.snapshot.records
        meta = records.get(keys.META)
        if meta is None:
            return None
        value = meta.value
        return cls(
            glance.room,
            value["description"],
            value["metadata"],
            value["created_at"],
            keys.ARCHIVED in records,
            glance.last_seq,
            glance.set_sizes[keys.READY],
        )


@dataclass(frozen=True, slots=True)
class RoomList:
    """One page of rooms by name. ``next_after`` is the name to pass as ``after`` for the
    next page, ``None`` when no room follows (a page after it may still come back
    empty, when the rooms that follow are all left out)."""

    rooms: list[RoomInfo]
    next_after: str | None


async def describe_rooms(store: Store, names: list[str]) -> list[RoomInfo | None]:
    """Each of ``names`` described, ``None`` for a room that does not exist: one
    :meth:`~agentrooms.store.base.Store.glance`, each room from one snapshot."""
    glances = await store.glance(names, [keys.META, keys.ARCHIVED], [keys.READY])
    return [RoomInfo.of(g) for g in glances]


class Room:
    """One room's plan, locks, events, presence, documents and path reservations."""

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        policy: RetryPolicy | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.scope = Scope(store, name, policy=policy, metrics=metrics)
        self.name = self.scope.room
        self.store = store
        self.plan = Plan(self.scope)
        self.locks = Locks(self.scope, knowledge_of(store))
        self.events = Events(self.scope)
        self.presence = Presence(self.scope)
        self.docs = Documents(self.scope)
        self.paths = Paths(self.scope)

    async def describe(self) -> RoomInfo:
        """The room's description, log head and ready count from one snapshot (one
        store call); ``NotFound`` if it does not exist."""
        (info,) = await describe_rooms(self.store, [self.name])
        if info is None:
            raise self.scope.missing()
        return info


class Rooms:
    """The rooms of one store."""

    def __init__(
        self, store: Store, *, policy: RetryPolicy | None = None, metrics: Metrics | None = None
    ) -> None:
        self.store = store
        self._policy, self._metrics = policy, metrics

    def room(self, name: str) -> Room:
        """A handle on room ``name`` (each operation checks that it exists)."""
        return Room(self.store, name, policy=self._policy, metrics=self._metrics)

    async def get(self, name: str) -> Room:
        """A handle on an existing room; ``NotFound`` otherwise."""
        room = self.room(name)
        await room.scope.read([])
        return room

    async def create(
        self, name: str, description: str = "", metadata: JSON = None, *, author: str | None = None
    ) -> Room:
        """Create room ``name``; ``VersionConflict`` if it already exists. ``author``: the
        agent creating it (the author of its ``room.created`` event)."""
        room = self.room(name)
        if author is not None:
            keys.check_name(author, "author")
        await registry.register(self.store, room.name)
        now = (await self.store.read(room.name, [])).now
        meta = {"description": str(description), "metadata": metadata, "created_at": now}
        try:
            await self.store.transact(
                room.name,
                [Absent(keys.META)],
                [Put(keys.META, meta)],
                [Append("room.created", {"room": room.name}, author)],
            )
        except VersionConflict as exc:
            raise VersionConflict(exc.conflicts, f"room {room.name!r} already exists") from exc
        return room

    async def list(self, *, include_archived: bool = False) -> list[RoomInfo]:
        """Every room by name: :meth:`page` after page (its cost grows with the number of
        rooms; a caller that shows rooms should show pages)."""
        out: list[RoomInfo] = []
        after: str | None = None
        while True:
            page = await self.page(REGISTRY_SCAN, after, include_archived=include_archived)
            out += page.rooms
            if page.next_after is None:
                return out
            after = page.next_after

    async def page(
        self,
        limit: int = 100,
        after: str | None = None,
        *,
        include_archived: bool = False,
        allowed: Callable[[str], bool] | None = None,
        among: Collection[str] | None = None,
    ) -> RoomList:
        """Up to ``limit`` rooms by name after ``after``, each described.

        ``allowed`` is asked about each registered name before anything is described,
        and the rooms it refuses are left out as if absent. The registry's shards are
        scanned at once and merged in name order (:class:`~agentrooms.rooms.registry.Names`,
        reading ahead for ``limit`` names, or :data:`REGISTRY_SCAN` when filtering), and the
        rooms kept are described in one :meth:`~agentrooms.store.base.Store.glance`, so a
        page costs one :meth:`~agentrooms.store.base.Store.scan_keys` of the shards and
        one glance unless archived (when not included), refused or half-created rooms
        leave it short and it reads on. ``among``: only
        these names are candidates, and the registry is not scanned (a token that names
        its rooms). ``BadRequest`` for a ``limit`` outside 1 .. ``limits.max_page``.
        """
        limit = check_limit(limit, self.store.limits)
        if among is not None:
            return await self._page_among(limit, after, include_archived, allowed, among)
        scan_size = limit if allowed is None else REGISTRY_SCAN
        names = registry.Names(self.store, after, registry.batch_for(scan_size))
        out: list[RoomInfo] = []
        last: str | None = None
        ended = False
        while len(out) < limit and not ended:
            chunk: list[str] = []
            while len(chunk) < limit - len(out):
                got = await names.take(limit - len(out) - len(chunk))
                if not got:
                    ended = True
                    break
                chunk += got if allowed is None else [n for n in got if allowed(n)]
            if not chunk:
                break
            last = chunk[-1]
            for info in await describe_rooms(self.store, chunk):
                # None: created half-way or being deleted
                if info is not None and (include_archived or not info.archived):
                    out.append(info)
        more = len(out) == limit and not ended and names.more()
        return RoomList(out, last if more else None)

    async def _page_among(
        self,
        limit: int,
        after: str | None,
        include_archived: bool,
        allowed: Callable[[str], bool] | None,
        among: Collection[str],
    ) -> RoomList:
        """:meth:`page` over the names ``among``, in name order, one glance per
        ``limit`` of them."""
        wanted = sorted(
            n
            for n in set(among)
            if (after is None or n > after) and (allowed is None or allowed(n))
        )
        out: list[RoomInfo] = []
        taken = 0
        while taken < len(wanted) and len(out) < limit:
            chunk = wanted[taken : taken + limit - len(out)]
            taken += len(chunk)
            for info in await describe_rooms(self.store, chunk):
                if info is not None and (include_archived or not info.archived):
                    out.append(info)
        return RoomList(out, wanted[taken - 1] if taken < len(wanted) else None)

    async def describe(self, name: str) -> RoomInfo:
        return await self.room(name).describe()

    async def archive(self, name: str, *, author: str | None = None) -> RoomInfo:
        """Make the room read-only; its state and log stay readable. ``author``: the agent
        archiving it (the author of its ``room.archived`` event)."""
        room = self.room(name)
        if author is not None:
            keys.check_name(author, "author")
        try:
            await self.store.transact(
                room.name,
                [Present(keys.META), Absent(keys.ARCHIVED)],
                [Put(keys.ARCHIVED, True)],
                [Append("room.archived", {"room": room.name}, author)],
            )
        except VersionConflict as exc:
            if keys.META in exc.conflicts:
                raise room.scope.missing() from exc
            raise InvalidTransition(f"room {room.name!r} is already archived") from exc
        return await room.describe()

    async def delete(self, name: str) -> None:
        """Delete the room and everything in it; ``NotFound`` if it does not exist."""
        room = self.room(name)
        await room.scope.read([])
        await self.store.delete_room(room.name)
        await registry.unregister(self.store, room.name)
