"""Local turns on hot keys: the commits of one process queue for a key that conflicted.

Once a key has conflicted (the store named it in a ``VersionConflict``), the commits of
this process that read it take turns for it (first come, first served) for ``HOT_FOR``
seconds after its last conflict. Keys that never conflict never queue. Correctness never
depends on it: every write is still conditional. One :class:`Turns` per store handle and
event loop (:meth:`agentrooms.session.Session.turns`); the commit loop uses it
(:mod:`agentrooms.commit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable

__all__ = ["HOT_FOR", "Turns"]

HOT_FOR = 1.0  # seconds a key stays hot after its last conflict


class Turns:
    """The keys that conflicted lately, and a FIFO turn (an ``asyncio.Lock``) for each
    hot key that some commit is using."""

    def __init__(self) -> None:
        self.hot: dict[tuple[str, str], float] = {}
        self.locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}  # lock, users

    def mark(self, room: str, keys: Iterable[str]) -> None:
        now = time.monotonic()
        for key in keys:
            self.hot[(room, key)] = now
        if len(self.hot) > 1024:  # forget the cold ones now and then
            self.hot = {k: t for k, t in self.hot.items() if now - t < HOT_FOR}

    def hot_keys(self, room: str, keys: Iterable[str]) -> list[tuple[str, str]]:
        now = time.monotonic()
        found = ((room, k) for k in keys)
        return sorted(k for k in found if now - self.hot.get(k, -HOT_FOR) < HOT_FOR)

    async def take(self, stack: contextlib.AsyncExitStack, keys: list[tuple[str, str]]) -> None:
        """Queue for each of ``keys`` (sorted) and hold them until ``stack`` closes."""
        for key in keys:
            lock, users = self.locks.get(key) or (asyncio.Lock(), 0)
            self.locks[key] = (lock, users + 1)
            stack.callback(self._leave, key)  # runs after the lock is released
            await stack.enter_async_context(lock)

    def _leave(self, key: tuple[str, str]) -> None:
        lock, users = self.locks[key]
        if users == 1:
            del self.locks[key]
        else:
            self.locks[key] = (lock, users - 1)
