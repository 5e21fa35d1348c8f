"""Deliberately broken stores, for showing that the recorder and checker catch each bug.

Each wraps a real store (:class:`~agentrooms.store.wrap.Forwarding`) and breaks one
promise of the store contract:

* :class:`IgnoresVersionIs`: ``transact`` drops its ``VersionIs`` compares (a lost update
  for compare-and-set and the commit loop);
* :class:`StaleReads`: ``read`` sometimes returns the record as an earlier read saw it;
* :class:`AppliesTwice`: ``transact`` is applied twice (a retried request that had
  committed), answering with the first application's result;
* :class:`CommitDropsCompares`: a commit loop that writes without its compares (every
  compare of a transact that records a command outcome is dropped: a lost update, and a
  command applied twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from agentrooms.commit import COMMAND_PREFIX
from agentrooms.errors import StaleFence, VersionConflict
from agentrooms.store.base import Store
from agentrooms.store.types import Compare, Prepared, Record, Snapshot, TransactResult, VersionIs
from agentrooms.store.wrap import Forwarding

__all__ = ["BROKEN", "AppliesTwice", "CommitDropsCompares", "IgnoresVersionIs", "StaleReads"]


class IgnoresVersionIs(Forwarding):
    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        kept: list[Compare] = [c for c in ops.compares if not isinstance(c, VersionIs)]
        return await self.inner._transact(
            room, Prepared(kept, ops.writes, ops.appends, ops.set_ops)
        )


class StaleReads(Forwarding):
    """With probability ``p`` (seeded), a key's record is the one the previous read of
    it returned, when that differs from the current one."""

    def __init__(self, inner: Store, seed: int = 0, p: float = 0.5) -> None:
        super().__init__(inner)
        self.rng, self.p = random.Random(seed), p
        self.previous: dict[tuple[str, str], Record | None] = {}

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        snap = await self.inner._read(room, keys)
        records = dict(snap.records)
        for key in keys:
            current = records.get(key)
            seen = self.previous.get((room, key), current)
            self.previous[(room, key)] = current
            if seen != current and self.rng.random() < self.p:
                if seen is None:
                    del records[key]
                else:
                    records[key] = seen
        return Snapshot(records, snap.now)


class AppliesTwice(Forwarding):
    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        first = await self.inner._transact(room, ops)
        await asyncio.sleep(0)
        with contextlib.suppress(VersionConflict, StaleFence):  # then only the first counts
            await self.inner._transact(room, ops)
        return first


class CommitDropsCompares(Forwarding):
    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        snap = await self.inner._read(room, keys)
        if any(k.startswith(COMMAND_PREFIX) for k in keys):
            await asyncio.sleep(0)  # a commit's read: its writes follow later, as over a network
        return snap

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        if any(w.key.startswith(COMMAND_PREFIX) for w in ops.writes):
            ops = Prepared([], ops.writes, ops.appends, ops.set_ops)
            await asyncio.sleep(0)
        return await self.inner._transact(room, ops)


BROKEN: dict[str, type[Forwarding]] = {
    "ignores-version-is": IgnoresVersionIs,
    "stale-reads": StaleReads,
    "applies-twice": AppliesTwice,
    "commit-drops-compares": CommitDropsCompares,
}
"""Each broken store by name."""
