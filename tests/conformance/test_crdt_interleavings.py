"""Property, per CRDT kind and backend: any interleaving of updates, pushes, syncs,
peer-to-peer merges, loads and compactions from many replicas reads back the serial
merge of everything the replicas wrote.

Each replica runs its own steps concurrently with the others; Hypothesis picks the steps
and the delays before every step and every store call, so compactions run between the
scans, reads, base writes and deletes of each other, of concurrent pushes and of loads.
A replica's local value only grows (every operation moves it up in the kind's merge
order), so the room's value must be exactly the merge of every value a replica pushed;
every load on the way must hold every push that finished before it began, and nothing
that none made. A compaction that deleted a newer push, or a read that missed a record
folded while it ran, would read back less.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrooms import crdt
from agentrooms.crdt import HybridClock, Text, compact, load, push, sync
from agentrooms.crdt.codec import Crdt
from agentrooms.store import Compare, Store
from agentrooms.store.types import ScanPage, Snapshot
from tests.conftest import Backend
from tests.helpers import Interposed

REPLICAS = 4
KEY = "value"

Update = Callable[[Any, str, HybridClock, Any], Any]


def _text(v: Text, node: str, clock: HybridClock, arg: tuple[int, str, bool]) -> Text:
    index, chars, delete = arg
    size = len(v.value)
    index = min(index, size)
    if delete and index < size:
        return v.delete(node, index, 1)
    return v.insert(node, index, chars)


KINDS: dict[str, tuple[type[Any], Update, st.SearchStrategy[Any]]] = {
    "g-counter": (crdt.GCounter, lambda v, n, c, a: v.increment(n, a), st.integers(0, 3)),
    "pn-counter": (crdt.PNCounter, lambda v, n, c, a: v.increment(n, a), st.integers(-3, 3)),
    "lww-register": (crdt.LWWRegister, lambda v, n, c, a: v.set(a, c), st.integers(0, 9)),
    "or-set": (
        crdt.ORSet,
        lambda v, n, c, a: v.add(n, a[1]) if a[0] else v.remove(a[1]),
        st.tuples(st.booleans(), st.sampled_from("abc")),
    ),
    "text": (
        Text,
        _text,
        st.tuples(st.integers(0, 12), st.text("xyé", min_size=1, max_size=2), st.booleans()),
    ),
}


def steps(arg: st.SearchStrategy[Any]) -> st.SearchStrategy[list[tuple[str, Any]]]:
    step = st.one_of(
        st.tuples(st.just("update"), arg),
        st.tuples(st.sampled_from(["push", "sync", "load", "compact"]), st.none()),
        st.tuples(st.just("merge"), st.integers(0, REPLICAS - 1)),
    )
    return st.lists(step, max_size=8)


class Delayed(Interposed):
    """Waits before every read and scan too, not only before transacts."""

    def __init__(self, inner: Store, wait: Callable[[int, list[Compare]], Any]) -> None:
        super().__init__(inner, before=wait)

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        assert self.before is not None
        await self.before(0, [])
        return await super()._read(room, keys)

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        assert self.before is not None
        await self.before(0, [])
        return await super()._scan(room, prefix, after, limit)


def joined(values: list[Crdt]) -> Crdt | None:
    merged: Crdt | None = None
    for value in values:
        merged = value if merged is None else merged.merge(value)
    return merged


async def run_history(
    backend: Backend, kind: str, plans: list[list[tuple[str, Any]]], delays: list[float]
) -> None:
    cls, update, _ = KINDS[kind]
    store = await backend.open()
    room = f"crdt-prop-{uuid.uuid4().hex[:10]}"
    jitter = iter(delays * 200)

    async def wait(n: int, compares: list[Compare]) -> None:
        await asyncio.sleep(next(jitter, 0.0))

    locals_: list[Crdt] = [cls() for _ in range(REPLICAS)]
    written: list[Crdt] = []  # every value a replica pushed (or a sync returned)
    loaded: list[Crdt] = []

    async def replica(i: int, plan: list[tuple[str, Any]]) -> None:
        node, clock, s = f"r{i}", HybridClock(f"r{i}"), Delayed(store, wait)
        for op, arg in plan:
            await asyncio.sleep(next(jitter, 0.0))
            if op == "update":
                locals_[i] = update(locals_[i], node, clock, arg)
            elif op == "merge":
                locals_[i] = locals_[i].merge(locals_[arg])
            elif op == "push":
                await push(s, room, KEY, locals_[i], replica=node)
                written.append(locals_[i])
            elif op == "sync":
                locals_[i] = await sync(s, room, KEY, locals_[i], replica=node, compact_above=1)
                written.append(locals_[i])
            elif op == "load":
                before = joined(written)
                got = await load(s, room, KEY, cls, compact_above=None)
                if before is not None:
                    assert got is not None and got.merge(before) == got  # nothing missed
                if got is not None:
                    loaded.append(got)
            else:
                await compact(s, room, KEY, cls)

    try:
        await asyncio.gather(*(replica(i, plan) for i, plan in enumerate(plans)))
        serial = joined(written)
        assert await load(store, room, KEY, cls, compact_above=None) == serial
        for got in loaded:
            assert serial is not None and serial.merge(got) == serial
        await compact(store, room, KEY, cls)
        assert await load(store, room, KEY, cls, compact_above=None) == serial
        assert (await store.scan(room, "crdt/")).records == []
    finally:
        await store.close()


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_any_interleaving_reads_back_the_serial_merge(
    backend: Backend, kind: str, data: st.DataObject
) -> None:
    plans = data.draw(st.lists(steps(KINDS[kind][2]), min_size=REPLICAS, max_size=REPLICAS))
    delays = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.0005, 0.002]), min_size=1, max_size=8))
    asyncio.run(run_history(backend, kind, plans, delays))
