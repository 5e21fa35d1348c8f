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
import bisect
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
    """One shard's names read but not yet merged (in name order), and where it goes on."""

    __slots__ = ("cursor", "done", "names", "room")

    def __init__(self, room: str, cursor: str | None) -> None:
        self.room, self.cursor = room, cursor  # the registry key to read on after
        self.names: list[str] = []
        self.done = False


class Names:
    """The registered names after ``after`` in name order, merged from every shard.

    Shards are read ahead by ``batch`` names, all that have run dry at once in one
    :meth:`~agentrooms.store.base.Store.scan_keys` (the first read: all of them), so
    reading the first ``n`` names costs one store call when no shard holds more than
    ``batch`` of them. A name is handed out once no shard still to be read could hold a
    smaller one. Each shard's scan is its own snapshot: a room registered or deleted
    while the names are read may or may not be seen.
    """

    def __init__(self, store: Store, after: str | None, batch: int) -> None:
        self._store = store
        self._size = max(1, min(batch, store.limits.max_page))
        cursor = None if after is None else keys.registry_entry(after)
        self._shards = [_Shard(room, cursor) for room in SHARD_ROOMS]
        self._ready: deque[str] = deque()  # merged: no unread name can come before these

    def more(self) -> bool:
        """Whether a name may follow the last one read (without reading: conservative)."""
        return bool(self._ready) or any(s.names or not s.done for s in self._shards)

    async def next(self) -> str | None:
        """The next name, ``None`` once every shard is read to its end."""
        if not self._ready:
            await self._merge()
        return self._ready.popleft() if self._ready else None

    async def take(self, count: int) -> list[str]:
        """The next ``count`` names (fewer at the end; ``[]`` once every shard is read)."""
        out: list[str] = []
        while len(out) < count:
            if not self._ready:
                await self._merge()
                if not self._ready:
                    break
            ready = self._ready
            while ready and len(out) < count:
                out.append(ready.popleft())
        return out

    async def _merge(self) -> None:
        """Read every dry shard (one ``scan_keys`` per cursor they share: one, but for
        shards read from different points), then hand out every name that no unread
        one can precede: those up to the least last-read name of the shards not done."""
        while dry := [s for s in self._shards if not s.names and not s.done]:
            by_cursor: dict[str | None, list[_Shard]] = {}
            for shard in dry:
                by_cursor.setdefault(shard.cursor, []).append(shard)
            await asyncio.gather(*(self._fill(at, group) for at, group in by_cursor.items()))
        bounds = [s.names[-1] for s in self._shards if not s.done]
        bound = min(bounds) if bounds else None
        merged: list[str] = []
        for shard in self._shards:
            if bound is None:
                merged += shard.names
                shard.names = []
            else:
                cut = bisect.bisect_right(shard.names, bound)
                merged += shard.names[:cut]
                del shard.names[:cut]
        merged.sort()
        self._ready.extend(merged)

    async def _fill(self, cursor: str | None, shards: list[_Shard]) -> None:
        """Read ``shards`` on after ``cursor``: one ``scan_keys`` (one per
        ``limits.max_page`` shards, should a store allow fewer rooms per call): the
        entries' keys are the names, their values are not read."""
        most = self._store.limits.max_page
        groups = [shards[i : i + most] for i in range(0, len(shards), most)]
        pages = await asyncio.gather(
            *(
                self._store.scan_keys([s.room for s in group], _PREFIX, self._size, cursor)
                for group in groups
            )
        )
        skip = len(_PREFIX)
        for shard, page in zip(shards, (p for group in pages for p in group), strict=True):
            shard.names = [key[skip:] for key in page.keys]
            shard.cursor, shard.done = page.next_after, page.next_after is None


def batch_for(wanted: int) -> int:
    """Names to read ahead per shard when ``wanted`` names are needed in all: twice a
    shard's even share, plus one, so an uneven spread rarely costs a second scan."""
    return 2 * -(-wanted // SHARDS) + 1
