"""The SQLite backend answers exactly as the in-memory reference does (same clock, same
operations, same results, versions and set pick order included), on random histories."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrooms.errors import AgentroomsError
from agentrooms.store import (
    Absent,
    Append,
    Delete,
    FenceAtMost,
    Present,
    Put,
    SetAdd,
    SetRemove,
    Store,
    VersionIs,
)
from agentrooms.store.memory import MemoryStore
from agentrooms.store.sqlite.backend import SqliteStore

KEYS = ["a", "a/b", "a/c", "ab", "b", "é", "\U0010ffff", "a\U0010ffff"]
ROOMS = ["r1", "r2"]
SETS = ["s", "t"]
MEMBERS = ["a", "b", "c", "é", "\U0010ffff", "a\U0010ffff"]

keys = st.sampled_from(KEYS)
values = st.one_of(
    st.integers(-5, 5),
    st.text(max_size=3),
    st.fixed_dictionaries({"fence": st.integers(0, 4)}),
    st.none(),
)
compares = st.one_of(
    st.builds(VersionIs, keys, st.integers(0, 12)),
    st.builds(Absent, keys),
    st.builds(Present, keys),
    st.builds(FenceAtMost, keys, st.integers(0, 4)),
)
writes = st.one_of(
    st.builds(Put, keys, values, st.one_of(st.none(), st.sampled_from([0.5, 2.0, 30.0]))),
    st.builds(Delete, keys),
)
set_ops = st.one_of(
    st.builds(SetAdd, st.sampled_from(SETS), st.sampled_from(MEMBERS)),
    st.builds(SetRemove, st.sampled_from(SETS), st.sampled_from(MEMBERS)),
)


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple[Any, ...]


ops = st.one_of(
    st.builds(
        lambda room, c, w, s, a: Op(
            "transact", (room, c, [*{x.key: x for x in w}.values(), *s], a)
        ),
        st.sampled_from(ROOMS),
        st.lists(compares, max_size=3),
        st.lists(writes, max_size=3),
        st.lists(set_ops, max_size=4),
        st.lists(st.builds(Append, st.sampled_from(["e", "f"]), values), max_size=2),
    ),
    st.builds(
        lambda r, s, n: Op("set_pick", (r, s, n)),
        st.sampled_from(ROOMS),
        st.sampled_from(SETS),
        st.integers(1, 4),
    ),
    st.builds(lambda r, s: Op("set_size", (r, s)), st.sampled_from(ROOMS), st.sampled_from(SETS)),
    st.builds(lambda r, a: Op("watch", (r, a, 0)), st.sampled_from(ROOMS), st.integers(0, 6)),
    st.builds(lambda r: Op("delete_room", (r,)), st.sampled_from(ROOMS)),
    st.builds(lambda r, k: Op("read", (r, k)), st.sampled_from(ROOMS), st.lists(keys, max_size=4)),
    st.builds(
        lambda r, p, after, n: Op("scan", (r, p, after, n)),
        st.sampled_from(ROOMS),
        st.sampled_from(["", "a", "a/", "\U0010ffff"]),
        st.one_of(st.none(), keys),
        st.integers(1, 4),
    ),
    st.builds(
        lambda r, a, n: Op("read_log", (r, a, n)),
        st.sampled_from(ROOMS),
        st.integers(0, 6),
        st.integers(1, 4),
    ),
    st.builds(lambda r, b: Op("trim_log", (r, b)), st.sampled_from(ROOMS), st.integers(0, 8)),
    st.builds(lambda r: Op("last_seq", (r,)), st.sampled_from(ROOMS)),
    st.builds(lambda dt: Op("tick", (dt,)), st.sampled_from([0.25, 1.0, 10.0])),
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


async def _apply(store: Store, op: Op) -> Any:
    try:
        if op.name == "scan":  # follow every page: pages may end differently on expired keys
            room, prefix, after, limit = op.args
            listing = []
            while True:
                page = await store.scan(room, prefix, after, limit)
                listing += page.records
                if page.next_after is None:
                    return listing
                assert page.next_after == page.records[-1].key
                after = page.next_after
        return await getattr(store, op.name)(*op.args)
    except AgentroomsError as exc:
        return (type(exc).__name__, exc.details())


async def _run(history: list[Op]) -> None:
    clock = Clock()
    memory, sqlite = MemoryStore(clock=clock), SqliteStore("sqlite://", clock=clock)
    try:
        for step, op in enumerate(history):
            if op.name == "tick":
                clock.now += op.args[0]
                continue
            want, got = await _apply(memory, op), await _apply(sqlite, op)
            assert got == want, f"step {step}: {op}"
    finally:
        await sqlite.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=30))
def test_sqlite_matches_memory(history: list[Op]) -> None:
    asyncio.run(_run(history))


set_histories = st.lists(
    st.one_of(
        st.builds(
            lambda s: Op("transact", ("r1", [], s, [])),
            st.lists(
                st.one_of(
                    st.builds(SetAdd, st.sampled_from(SETS), st.sampled_from(MEMBERS[:4])),
                    st.builds(SetRemove, st.sampled_from(SETS), st.sampled_from(MEMBERS[:4])),
                ),
                min_size=1,
                max_size=3,
            ),
        ),
        st.builds(
            lambda s, n: Op("set_pick", ("r1", s, n)), st.sampled_from(SETS), st.integers(1, 4)
        ),
        st.builds(lambda s, n: Op("set_pick", ("r1", s, n)), st.sampled_from(SETS), st.just(1)),
        st.builds(lambda s: Op("set_size", ("r1", s)), st.sampled_from(SETS)),
        st.just(Op("delete_room", ("r1",))),
    ),
    min_size=10,  # pick order shows only after several picks
    max_size=60,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(set_histories)
def test_set_pick_order_matches_memory(history: list[Op]) -> None:
    """Sets only, on one room, so that long runs of adds, removes and picks of one set
    (where pick order shows) are common."""
    asyncio.run(_run(history))
