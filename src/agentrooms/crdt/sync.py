"""Keep a local CRDT replica in sync with the room's copy, through the commit loop.

``sync(store, room, key, local)`` reads the room's copy, merges it with ``local``,
writes the merge back if it adds anything, and returns the merge (the caller's new
local replica). The write compares the version it merged with, so nothing written by a
concurrent sync is overwritten; on a conflict the loop re-reads and merges again.

A sync is never rejected for contention: merges commute, so a retry is always valid,
and the default policy (``SYNC_POLICY``) retries with jittered backoff for up to ten
minutes before it would raise ``ContentionExhausted``. The other errors are a record of
another kind under ``key`` (``BadRequest``, nothing written) and a store that stays
unavailable (``StoreUnavailable``; a sync is idempotent, so it is safe to call again).
"""

from __future__ import annotations

from typing import TypeVar

from agentrooms.commit import Change, View, commit
from agentrooms.crdt.codec import Crdt
from agentrooms.metrics import Metrics
from agentrooms.retry import FullJitter, RetryPolicy
from agentrooms.store.base import Store
from agentrooms.store.types import Put

__all__ = ["SYNC_POLICY", "load", "sync"]

C = TypeVar("C", bound=Crdt)

SYNC_POLICY = RetryPolicy(max_attempts=100_000, budget=600.0, backoff=FullJitter(0.001, 0.05))
"""Generous on purpose: a merge is always valid to retry, so a sync keeps trying."""


async def load(store: Store, room: str, key: str, kind: type[C]) -> C | None:
    """The room's copy of ``key`` as a ``kind``, or None if there is none."""
    record = (await store.read(room, [key])).get(key)
    return None if record is None else kind.from_json(record.value)


async def sync(
    store: Store,
    room: str,
    key: str,
    local: C,
    *,
    policy: RetryPolicy | None = None,
    metrics: Metrics | None = None,
) -> C:
    """Merge ``local`` with the room's copy of ``key``, store the merge, return it."""
    merged: list[C] = []

    def merge(view: View, replica: C) -> Change:
        stored = view.get(key)
        if stored is None:
            merged[:] = [replica]
            return Change(writes=[Put(key, replica.to_json())])
        current = type(replica).from_json(stored)
        result = replica.merge(current)
        merged[:] = [result]
        if result == current:
            return Change()  # nothing new for the room: the compare confirms it is current
        return Change(writes=[Put(key, result.to_json())])

    await commit(
        store, room, merge, local, keys=[key], policy=policy or SYNC_POLICY, metrics=metrics
    )
    return merged[0]
