"""Appending transacts of one room, queued and sent together as one batch.

A store keeps at most one appending transact per room in flight (``backend.py``); the
ones that arrive meanwhile wait in the room's line and go together, as one call of
``transact()`` (functions/transact.sql), when it returns. Here: which of them make the
next batch, and the parallel arrays ``transact()`` takes for it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from agentrooms.errors import StaleFence, VersionConflict
from agentrooms.store.types import (
    Absent,
    Compare,
    FenceAtMost,
    Prepared,
    PreparedSetOp,
    TransactResult,
    VersionIs,
)

BATCH = 64  # appending transacts of one room sent in one statement, at most
BATCH_BYTES = 8 * 1024 * 1024  # and their encoded values and events, past the first one


@dataclass(frozen=True, slots=True)
class Waiting:
    """An appending transact queued behind the one of its room in flight."""

    ops: Prepared
    future: asyncio.Future[TransactResult]


def next_batch(line: list[Waiting]) -> list[Waiting]:
    """Take the next batch off the front of ``line``: queued transacts whose callers
    still wait, at most ``BATCH`` of them and, past the first, ``BATCH_BYTES`` of
    encoded values and events."""
    batch: list[Waiting] = []
    size = 0
    while line and len(batch) < BATCH:
        w = line[0]
        ops = w.ops
        cost = sum(len(x.value_json or "") for x in ops.writes) + sum(
            len(x.data_json) for x in ops.appends
        )
        if batch and size + cost > BATCH_BYTES:
            break
        del line[0]
        if not w.future.done():
            batch.append(w)
            size += cost
    return batch


def batch_args(batch: list[Prepared]) -> list[list[Any]]:
    """A batch of transacts as the arrays ``transact()`` takes: for each kind of
    operation, a bounds array (item i's are at offsets bounds[i] .. bounds[i + 1] - 1),
    then its parallel arrays, the items' one after the other."""
    cmp: list[list[Any]] = [[0], [], [], []]
    put: list[list[Any]] = [[0], [], [], []]
    dele: list[list[Any]] = [[0], []]
    sets: list[list[Any]] = [[0], [], [], []]
    app: list[list[Any]] = [[0], [], [], [], []]
    for ops in batch:
        keys, kinds, args = compare_args(ops.compares)
        cmp[1] += keys
        cmp[2] += kinds
        cmp[3] += args
        for w in ops.writes:
            if w.value_json is None:
                dele[1].append(w.key)
            else:
                put[1].append(w.key)
                put[2].append(w.value_json)
                put[3].append(w.ttl_ms)
        names, members, effects = set_args(ops.set_ops)
        sets[1] += names
        sets[2] += members
        sets[3] += effects
        app[1] += [a.type for a in ops.appends]
        app[2] += [a.data_json for a in ops.appends]
        app[3] += [a.author for a in ops.appends]
        app[4] += [a.to_json for a in ops.appends]
        for arrays in (cmp, put, dele, sets, app):
            arrays[0].append(len(arrays[1]))
    return [*cmp, *put, *dele, *sets, *app]


def lone_outcome(outcomes: list[TransactResult | VersionConflict | StaleFence]) -> TransactResult:
    """A lone transact's result, or the compare failure it raises."""
    [outcome] = outcomes
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def compare_args(compares: list[Compare]) -> tuple[list[str], list[str], list[int | None]]:
    """Compares as the parallel arrays ``transact()`` takes: keys, kinds, arguments."""
    keys: list[str] = []
    kinds: list[str] = []
    args: list[int | None] = []
    for c in compares:
        keys.append(c.key)
        if isinstance(c, VersionIs):
            kinds.append("version")
            args.append(c.version)
        elif isinstance(c, FenceAtMost):
            kinds.append("fence")
            args.append(c.fence)
        else:
            kinds.append("absent" if isinstance(c, Absent) else "present")
            args.append(None)
    return keys, kinds, args


def set_args(set_ops: list[PreparedSetOp]) -> tuple[list[str], list[str], list[str]]:
    """Set operations as the parallel arrays ``transact()`` takes: set names, members and
    net effects, one per distinct (set, member), sorted (the lock order).

    The net effect of a member's operations, applied in turn: ``remove`` if the last one
    removes; ``add`` (insert if absent, keeping the pick order of a present member) if
    they only add; ``reset`` (delete, then insert afresh) if an add follows a removal.
    """
    net: dict[tuple[str, str], str] = {}
    for op in set_ops:
        key = (op.name, op.member)
        if not op.add:
            net[key] = "remove"
        elif net.get(key, "add") == "add":
            net[key] = "add"
        else:
            net[key] = "reset"
    ordered = sorted(net.items())
    return [k[0] for k, _ in ordered], [k[1] for k, _ in ordered], [v for _, v in ordered]
