"""Store CRDT values so that no agent's write can conflict with another's.

Layout of a value ``key`` in a room (why: docs/why-crdt.md):

* one **replica record** per replica, ``crdt/<key>/<replica>`` (``/`` and ``%`` in
  ``key`` escaped as ``%2F`` and ``%25``), written only by that replica;
* one **base record**, ``key`` itself, holding what compaction folded out of replica
  records. It is the record the single-record layout kept the whole value in, in the
  same JSON form, so a value stored that way reads as the base, unconverted.

The room's value is the merge of the base and every replica record.

* ``push`` writes a replica's local value into its own record: one unconditional write,
  so it is never rejected, whatever other agents do. Contract: the value pushed holds
  everything this replica pushed before (continue from what ``sync`` or ``load``
  returned, or use a fresh replica id); a replica id names one sequential writer.
* ``load`` reads the value: a prefix scan of the replica records, then the base. Cost:
  the base plus one record per replica that pushed since the last compaction. A load
  that finds more than ``compact_above`` replica records compacts them: one
  compare-and-swap of the base it read (if another compaction changed the base
  meanwhile, the load leaves the folding to it), then the deletes as below.
* ``sync`` is ``load``, merge with the local value, and ``push`` of the merge if it adds
  anything to the room; it returns the merge. Records of another kind under ``key`` raise
  ``BadRequest`` before anything is written.
* ``compact`` merges the replica records into the base (a compare-and-swap of the base,
  contended only by other compactions), then deletes each replica record it folded
  whose version is still the one it read. Writers never wait for it and are never
  rejected by it: a record pushed meanwhile keeps its newer version and is not deleted.

Every read merges, so reads are monotonic while compaction runs: the base is read after
the replica records, and compaction writes the base before it deletes a replica record.
Store errors (``StoreUnavailable``) propagate; every operation here is idempotent, so it
is safe to call again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from agentrooms.commit import Change, CommitOptions, View, commit
from agentrooms.crdt.codec import Crdt, check_node
from agentrooms.errors import VersionConflict
from agentrooms.metrics import Metrics
from agentrooms.retry import FullJitter, RetryPolicy
from agentrooms.store.base import Store
from agentrooms.store.types import Absent, Compare, Delete, Put, Record, VersionIs, Write

__all__ = ["COMPACT_ABOVE", "SYNC_POLICY", "compact", "load", "push", "replica_key", "sync"]

C = TypeVar("C", bound=Crdt)

SYNC_POLICY = RetryPolicy(max_attempts=100_000, budget=600.0, backoff=FullJitter(0.001, 0.05))
"""Compaction's write of the base: a merge is always valid to retry, so it keeps trying."""

COMPACT_ABOVE = 32
"""A ``load`` that finds more replica records than this compacts them."""

REPLICAS = "crdt/"


def _prefix(key: str) -> str:
    return f"{REPLICAS}{key.replace('%', '%25').replace('/', '%2F')}/"


def replica_key(key: str, replica: str) -> str:
    """The record that replica ``replica`` (a node id) of value ``key`` writes."""
    return _prefix(key) + check_node(replica)


async def _replica_records(store: Store, room: str, key: str) -> list[Record]:
    prefix, after, found = _prefix(key), None, []
    page = min(1000, store.limits.max_page)
    while True:
        got = await store.scan(room, prefix, after, page)
        found += got.records
        if got.next_after is None:
            return found
        after = got.next_after


def _fold(kind: type[C], values: Sequence[object]) -> C | None:
    """The merge of ``values`` (JSON forms of ``kind``), merged pairwise in rounds: a
    merge costs the size of its inputs, so each round costs the size of the state once,
    where merging one by one into a growing value would cost it once per value."""
    level = [kind.from_json(value) for value in values]
    while len(level) > 1:
        pairs = [level[i].merge(level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = pairs + level[len(level) - len(level) % 2 :]
    return level[0] if level else None


async def push(store: Store, room: str, key: str, local: Crdt, *, replica: str) -> int:
    """Write ``local`` as replica ``replica``'s state of ``key``; return the record's
    new version. One unconditional write of a record no other replica writes: never
    rejected. ``local`` must hold everything this replica pushed before."""
    record = replica_key(key, replica)
    result = await store.transact(room, writes=[Put(record, local.to_json())])
    return result.versions[record]


async def load(
    store: Store,
    room: str,
    key: str,
    kind: type[C],
    *,
    compact_above: int | None = COMPACT_ABOVE,
) -> C | None:
    """The room's value of ``key`` as a ``kind`` (the merge of its base and replica
    records), or None if it has none. Compacts when it finds more than ``compact_above``
    replica records (None: never). ``BadRequest`` if a record holds another kind."""
    replicas = await _replica_records(store, room, key)
    base = (await store.read(room, [key])).get(key)
    merged = _fold(kind, [r.value for r in replicas] + ([] if base is None else [base.value]))
    if compact_above is not None and len(replicas) > compact_above and merged is not None:
        compare: Compare = Absent(key) if base is None else VersionIs(key, base.version)
        try:  # one attempt: a base changed meanwhile was written by another compaction
            await store.transact(room, [compare], [Put(key, merged.to_json())])
        except VersionConflict:
            return merged
        await _delete_folded(store, room, replicas)
    return merged


async def compact(
    store: Store, room: str, key: str, kind: type[C], *, metrics: Metrics | None = None
) -> int:
    """Fold the replica records of ``key`` into its base; return how many replica
    records were deleted (those not pushed again meanwhile). Never blocks a writer."""
    replicas = await _replica_records(store, room, key)
    merged = _fold(kind, [r.value for r in replicas])
    if merged is None:
        return 0

    def fold(view: View, value: Crdt) -> Change:
        stored = view.get(key)
        current = None if stored is None else type(value).from_json(stored)
        result = value if current is None else value.merge(current)
        return Change() if result == current else Change(writes=[Put(key, result.to_json())])

    await commit(
        store,
        room,
        fold,
        merged,
        keys=[key],
        options=CommitOptions(policy=SYNC_POLICY, metrics=metrics),
    )
    return await _delete_folded(store, room, replicas)


async def _delete_folded(store: Store, room: str, replicas: list[Record]) -> int:
    """Delete each of ``replicas`` whose version is still the one read (the others were
    pushed again since); their state is in the base already. Returns how many went."""
    pending = {r.key: r.version for r in replicas}
    deleted = 0
    while pending:
        chunk = dict(list(pending.items())[: store.limits.max_ops // 2])
        compares: list[Compare] = [VersionIs(k, v) for k, v in chunk.items()]
        writes: list[Write] = [Delete(k) for k in chunk]
        try:
            await store.transact(room, compares, writes)
        except VersionConflict as conflict:  # pushed again meanwhile: keep those
            if not set(conflict.conflicts) & set(chunk):
                raise
            for k in conflict.conflicts:
                pending.pop(k, None)
            continue
        deleted += len(chunk)
        for k in chunk:
            del pending[k]
    return deleted


async def sync(
    store: Store,
    room: str,
    key: str,
    local: C,
    *,
    replica: str,
    compact_above: int | None = COMPACT_ABOVE,
) -> C:
    """Merge ``local`` with the room's value of ``key``, push the merge as replica
    ``replica`` if it adds anything to the room, and return it. Never rejected."""
    check_node(replica)
    stored = await load(store, room, key, type(local), compact_above=compact_above)
    merged = local if stored is None else local.merge(stored)
    if merged != stored:
        await push(store, room, key, merged, replica=replica)
    return merged
