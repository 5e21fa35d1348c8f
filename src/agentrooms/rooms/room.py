"""Rooms: create, list, describe, archive, delete; and one room's parts.

A room exists while its ``_meta`` record does; ``_archived`` makes it read-only. Rooms are
also listed in the registry room (``keys.REGISTRY``) so they can be enumerated. Keys,
events, cursors, sets and locks of one room are invisible to every other room: the store
keeps rooms apart, and every operation here names exactly one room.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrooms.errors import InvalidTransition, NotFound, VersionConflict
from agentrooms.metrics import Metrics
from agentrooms.retry import RetryPolicy
from agentrooms.rooms import keys
from agentrooms.rooms.documents import Documents
from agentrooms.rooms.events import Events
from agentrooms.rooms.locks import Locks, knowledge_of
from agentrooms.rooms.plan import Plan
from agentrooms.rooms.presence import Presence
from agentrooms.rooms.scope import Scope
from agentrooms.store.base import Store
from agentrooms.store.types import JSON, Absent, Append, Delete, Present, Put


@dataclass(frozen=True, slots=True)
class RoomInfo:
    name: str
    description: str
    metadata: JSON
    created_at: float  # store clock
    archived: bool
    last_seq: int = 0
    ready: int = 0


class Room:
    """One room's plan, locks, events and presence."""

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

    async def describe(self) -> RoomInfo:
        snap = await self.scope.read([keys.ARCHIVED])
        meta = snap.value(keys.META)
        return RoomInfo(
            name=self.name,
            description=meta["description"],
            metadata=meta["metadata"],
            created_at=meta["created_at"],
            archived=snap.exists(keys.ARCHIVED),
            last_seq=await self.store.last_seq(self.name),
            ready=await self.store.set_size(self.name, keys.READY),
        )


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

    async def create(self, name: str, description: str = "", metadata: JSON = None) -> Room:
        """Create room ``name``; ``VersionConflict`` if it already exists."""
        room = self.room(name)
        entry = keys.registry_entry(room.name)
        await self.store.transact(keys.REGISTRY, writes=[Put(entry, {"name": room.name})])
        now = (await self.store.read(room.name, [])).now
        meta = {"description": str(description), "metadata": metadata, "created_at": now}
        try:
            await self.store.transact(
                room.name,
                [Absent(keys.META)],
                [Put(keys.META, meta)],
                [Append("room.created", {"room": room.name})],
            )
        except VersionConflict as exc:
            raise VersionConflict(exc.conflicts, f"room {room.name!r} already exists") from exc
        return room

    async def list(self, *, include_archived: bool = False) -> list[RoomInfo]:
        """Rooms by name (each described from its own records)."""
        names: list[str] = []
        after: str | None = None
        while True:
            page = await self.store.scan(keys.REGISTRY, "room/", after, 1000)
            names += [r.value["name"] for r in page.records]
            if page.next_after is None:
                break
            after = page.next_after
        out = []
        for name in names:
            try:
                info = await self.room(name).describe()
            except NotFound:
                continue  # created half-way or being deleted
            if include_archived or not info.archived:
                out.append(info)
        return out

    async def describe(self, name: str) -> RoomInfo:
        return await self.room(name).describe()

    async def archive(self, name: str) -> RoomInfo:
        """Make the room read-only; its state and log stay readable."""
        room = self.room(name)
        try:
            await self.store.transact(
                room.name,
                [Present(keys.META), Absent(keys.ARCHIVED)],
                [Put(keys.ARCHIVED, True)],
                [Append("room.archived", {"room": room.name})],
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
        await self.store.transact(keys.REGISTRY, writes=[Delete(keys.registry_entry(room.name))])
