"""A store that forwards every backend operation to another store.

The base for instrumenting a store without re-implementing one: count its calls, delay
or fail some of them, as the benchmarks' per-agent views and the tests' fault injectors
do. Subclass it and override the operations to observe. The wrapper does not own the
inner store: closing it leaves the inner one open.

``follow_log`` is forwarded (the backend's own version: one round trip on Redis) unless
the subclass overrides ``_watch`` or ``_read_log``: then it runs as ``watch`` then
``read_log`` through this wrapper, so the override sees it.
"""

from __future__ import annotations

from agentrooms.store.base import Store
from agentrooms.store.types import (
    Event,
    Glance,
    KeyPage,
    Prepared,
    ScanPage,
    Snapshot,
    StoreInfo,
    TransactResult,
)

__all__ = ["Forwarding"]


class Forwarding(Store):
    def __init__(self, inner: Store) -> None:
        super().__init__(inner.url, inner.limits)
        self.backend = inner.backend
        self.inner = inner
        self.contention = inner.contention  # counted once, flushed through the inner store

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        return await self.inner._read(room, keys)

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        return await self.inner._transact(room, ops)

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        return await self.inner._glance(rooms, keys, sets)

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        return await self.inner._scan(room, prefix, after, limit)

    async def _scan_rooms(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[ScanPage]:
        return await self.inner._scan_rooms(rooms, prefix, after, limit)

    async def _scan_keys(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[KeyPage]:
        return await self.inner._scan_keys(rooms, prefix, after, limit)

    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]:
        return await self.inner._read_log(room, after, limit)

    async def _trim_log(self, room: str, before: int) -> int:
        return await self.inner._trim_log(room, before)

    async def _last_seq(self, room: str) -> int:
        return await self.inner._last_seq(room)

    async def _set_pick(self, room: str, name: str, count: int) -> list[str]:
        return await self.inner._set_pick(room, name, count)

    async def _set_size(self, room: str, name: str) -> int:
        return await self.inner._set_size(room, name)

    async def _watch(self, room: str, after: int, timeout: float) -> int:
        return await self.inner._watch(room, after, timeout)

    def _forwards_follow(self) -> bool:
        """The inner store's ``follow_log`` is this one's (no override to route it by)."""
        cls = type(self)
        return cls._watch is Forwarding._watch and cls._read_log is Forwarding._read_log

    @property
    def follow_returns_events(self) -> bool:
        return self._forwards_follow() and self.inner.follow_returns_events

    async def _follow_log(self, room: str, after: int, timeout: float, limit: int) -> list[Event]:
        if self._forwards_follow():
            return await self.inner._follow_log(room, after, timeout, limit)
        return await super()._follow_log(room, after, timeout, limit)

    async def _delete_room(self, room: str) -> None:
        await self.inner._delete_room(room)

    async def _info(self) -> StoreInfo:
        return await self.inner._info()

    async def _close(self) -> None:
        return None  # the inner store is its owner's to close
