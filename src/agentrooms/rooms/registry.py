"""The registry of rooms, sharded: one ``room/<name>`` record per room, in one of
:data:`SHARDS` store rooms chosen by a hash of the name.

On a Redis Cluster each store room lives in one hash slot, so one registry room would put
every creation and every listing on one primary; the shards spread them over the slots.
Listing merges the shards' scans in name order, so callers see one registry: names in
code point order, each once, continued after any name.

An entry is written before its room's ``_meta`` and deleted after the room, so a
registered name may name a room that does not exist (yet or any more): readers of the
registry describe what they list and leave out what they cannot describe.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque

from agentrooms.rooms import keys
from agentrooms.store.base import Store
from agentrooms.store.types import Delete, Put

SHARDS = 16
"""Store rooms the registry is spread over (a hex digit of the name's hash names one)."""

SHARD_ROOMS = tuple(f"{keys.REGISTRY}.{digit:x}" for digit in range(SHARDS))
"""Every registry shard's store room."""

_PREFIX = "room/"


def shard_of(room: str) -> str:
    """The store room that holds ``room``'s registry entry (stable across processes)."""
    return SHARD_ROOMS[int(hashlib.sha256(room.encode()).hexdigest()[0], 16)]


async def register(store: Store, room: str) -> None:
    """Write ``room``'s entry (idempotent: one ``transact`` on its shard)."""
    entry = keys.registry_entry(room)
    await store.transact(shard_of(room), writes=[Put(entry, {"name": room})])


async def unregister(store: Store, room: str) -> None:
    """Delete ``room``'s entry (idempotent: one ``transact`` on its shard)."""
    await store.transact(shard_of(room), writes=[Delete(keys.registry_entry(room))])


class _Shard:
    """One shard's scan, read ahead by ``batch`` names."""

    def __init__(self, store: Store, room: str, after: str | None, batch: int) -> None:
        self.store, self.room, self.batch = store, room, batch
        self.cursor = None if after is None else keys.registry_entry(after)
        self.names: deque[str] = deque()
        self.done = False

    async def fill(self) -> None:
        page = await self.store.scan(self.room, _PREFIX, self.cursor, self.batch)
        self.names.extend(r.key[len(_PREFIX) :] for r in page.records)
        self.cursor, self.done = page.next_after, page.next_after is None


class Names:
    """The registered names after ``after`` in name order, merged from every shard.

    ``batch`` names are read ahead per shard and scan (all shards that ran dry are
    scanned at once), so reading the first ``n`` names costs one round of scans when no
    shard holds more than ``batch`` of them. Each scan is its own snapshot: a room
    registered or deleted while the names are read may or may not be seen.
    """

    def __init__(self, store: Store, after: str | None, batch: int) -> None:
        size = max(1, min(batch, store.limits.max_page))
        self._shards = [_Shard(store, room, after, size) for room in SHARD_ROOMS]

    def more(self) -> bool:
        """Whether a name may follow the last one read (without reading: conservative)."""
        return any(s.names or not s.done for s in self._shards)

    async def next(self) -> str | None:
        """The next name, ``None`` once every shard is read to its end."""
        dry = [s for s in self._shards if not s.names and not s.done]
        if dry:
            await asyncio.gather(*(s.fill() for s in dry))
        ready = [s for s in self._shards if s.names]
        if not ready:
            return None
        return min(ready, key=lambda s: s.names[0]).names.popleft()


def batch_for(wanted: int) -> int:
    """Names to read ahead per shard when ``wanted`` names are needed in all: twice a
    shard's even share, plus one, so an uneven spread rarely costs a second scan."""
    return 2 * -(-wanted // SHARDS) + 1
