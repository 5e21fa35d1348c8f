"""Test-only store wrappers: real backends underneath, with hooks around ``transact``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agentrooms.store.base import (
    Compare,
    Event,
    Prepared,
    ScanPage,
    Snapshot,
    Store,
    StoreInfo,
    TransactResult,
)

Hook = Callable[[int, list[Compare]], Awaitable[None]]


class Interposed(Store):
    """Delegates to ``inner``; ``before(n, compares)`` runs before the n-th transact
    (e.g. an interfering writer) and ``after(n, result)`` after it commits (e.g. to
    lose the response by raising)."""

    def __init__(
        self,
        inner: Store,
        before: Hook | None = None,
        after: Callable[[int, TransactResult], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(inner.url, inner.limits)
        self.backend = inner.backend
        self.inner = inner
        self.before, self.after = before, after
        self.calls = 0
        self.reads = 0
        self.sent: list[list[Compare]] = []

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        self.reads += 1
        return await self.inner._read(room, keys)

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        self.calls += 1
        self.sent.append(list(ops.compares))
        if self.before is not None:
            await self.before(self.calls, ops.compares)
        result = await self.inner._transact(room, ops)
        if self.after is not None:
            await self.after(self.calls, result)
        return result

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        return await self.inner._scan(room, prefix, after, limit)

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

    async def _delete_room(self, room: str) -> None:
        await self.inner._delete_room(room)

    async def _info(self) -> StoreInfo:
        return await self.inner._info()

    async def _close(self) -> None:
        return None
