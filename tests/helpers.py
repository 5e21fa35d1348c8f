"""Test-only store wrappers: real backends underneath, with hooks around ``transact``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agentrooms.store.base import (
    Compare,
    Event,
    PreparedAppend,
    PreparedWrite,
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
        self.sent: list[list[Compare]] = []

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        return await self.inner._read(room, keys)

    async def _transact(
        self,
        room: str,
        compares: list[Compare],
        writes: list[PreparedWrite],
        appends: list[PreparedAppend],
    ) -> TransactResult:
        self.calls += 1
        self.sent.append(list(compares))
        if self.before is not None:
            await self.before(self.calls, compares)
        result = await self.inner._transact(room, compares, writes, appends)
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

    async def _info(self) -> StoreInfo:
        return await self.inner._info()

    async def _close(self) -> None:
        return None
