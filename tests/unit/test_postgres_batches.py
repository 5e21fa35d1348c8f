"""The PostgreSQL backend sends a room's appending transacts that wait for one in flight
together, as one batch in one statement (``functions/transact.sql``):

* a batch answers as the in-memory reference applying its transacts one after the
  other (random batches, outcomes and final state compared);
* concurrent appending transacts on one handle are sent in fewer statements, each gets
  its own outcome, and their events are numbered without gaps;
* one transact's bad input fails only that transact;
* a caller that gives up before its batch is sent has nothing applied; queued transacts
  of a store that closes fail with ``StoreUnavailable`` and are not applied; the callers
  of a batch cut off in flight get ``StoreUnavailable`` (outcome unknown), never a hang;
* batches of two handles whose transacts lock keys and set members in opposite orders
  never deadlock.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrooms.errors import BadRequest, StaleFence, StoreUnavailable, VersionConflict
from agentrooms.store import (
    Absent,
    Append,
    Compare,
    Delete,
    FenceAtMost,
    Present,
    Put,
    SetAdd,
    SetRemove,
    Store,
    VersionIs,
    Write,
    open_store,
)
from agentrooms.store.memory import MemoryStore
from agentrooms.store.postgres.backend import PostgresStore
from agentrooms.store.types import TransactResult
from agentrooms.store.validation import prepare_transact

KEYS = ["a", "a/b", "b", "é", "\U0010ffff"]
MEMBERS = ["a", "b", "é", "\U0010ffff"]
SCHEMA = f"t_batch_{uuid.uuid4().hex[:10]}"


def _url(postgres_url: str) -> str:
    return f"{postgres_url}?schema={SCHEMA}"


@contextlib.asynccontextmanager
async def _pg(postgres_url: str) -> AsyncIterator[PostgresStore]:
    store = await open_store(_url(postgres_url))
    assert isinstance(store, PostgresStore)
    try:
        yield store
    finally:
        await store.close()


# ------------------------------------------------------------ batches vs the reference


@dataclass(frozen=True)
class Version:
    """A VersionIs compare to make against each store's own versions: the key's version
    when the batch starts (``right``), or one it never had."""

    key: str
    right: bool


keys = st.sampled_from(KEYS)
values = st.one_of(st.integers(-3, 3), st.fixed_dictionaries({"fence": st.integers(0, 3)}))
compares = st.one_of(
    st.builds(Version, keys, st.booleans()),
    st.builds(Absent, keys),
    st.builds(Present, keys),
    st.builds(FenceAtMost, keys, st.integers(0, 3)),
)
writes = st.one_of(st.builds(Put, keys, values), st.builds(Delete, keys))
set_ops = st.one_of(
    st.builds(SetAdd, st.just("s"), st.sampled_from(MEMBERS)),
    st.builds(SetRemove, st.just("s"), st.sampled_from(MEMBERS)),
)
transacts = st.tuples(
    st.lists(compares, max_size=3),
    st.lists(writes, max_size=3, unique_by=lambda w: w.key),
    st.lists(set_ops, max_size=3),
    st.lists(st.builds(Append, st.sampled_from(["e", "f"]), values), max_size=2),
)
histories = st.lists(st.lists(transacts, min_size=1, max_size=6), min_size=1, max_size=4)


def _outcome(outcome: TransactResult | Exception) -> Any:
    """What must agree between the stores: versions differ (each store numbers its own)."""
    if isinstance(outcome, VersionConflict):
        return ("conflict", sorted(outcome.conflicts))
    if isinstance(outcome, StaleFence):
        return ("stale", outcome.details())
    assert isinstance(outcome, TransactResult)
    return ("ok", sorted(outcome.versions), outcome.seqs)


async def _state(store: Store, room: str) -> Any:
    snap = await store.read(room, KEYS)
    members = await store.set_pick(room, "s", 10)
    events = [(e.seq, e.type, e.data) for e in await store.read_log(room, 0, 1000)]
    return {k: r.value for k, r in snap.records.items()}, sorted(members), events


async def _batches_match_memory(postgres_url: str, history: list[list[Any]]) -> None:
    room = f"r{uuid.uuid4().hex[:8]}"
    memory = MemoryStore()
    async with _pg(postgres_url) as pg:
        for batch in history:
            want: list[Any] = []
            prepared = []
            for store in (memory, pg):
                snap = await store.read(room, KEYS)

                def resolve(c: Compare | Version, snap: Any = snap) -> Compare:
                    if not isinstance(c, Version):
                        return c
                    record = snap.get(c.key)
                    right = record.version if record is not None else 0
                    return VersionIs(c.key, right if c.right else right + 10**9)

                items = [([resolve(c) for c in cmp], [*w, *s], a) for cmp, w, s, a in batch]
                if store is memory:
                    for cmp, w, a in items:
                        try:
                            want.append(_outcome(await memory.transact(room, cmp, w, a)))
                        except (VersionConflict, StaleFence) as exc:
                            want.append(_outcome(exc))
                else:
                    prepared = [prepare_transact(c, w, a, pg.limits) for c, w, a in items]
            got = [_outcome(o) for o in await pg._transact_batch(room, prepared)]
            assert got == want, batch
            assert await _state(pg, room) == await _state(memory, room), batch


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories)
def test_a_batch_answers_as_its_transacts_one_after_the_other(
    postgres_url: str, history: list[list[Any]]
) -> None:
    asyncio.run(_batches_match_memory(postgres_url, history))


# ------------------------------------------------------------------- through the line


def _count_batches(pg: PostgresStore) -> list[int]:
    """Record the size of each batch ``pg`` sends (observing, not replacing, the call)."""
    sizes: list[int] = []
    send = pg._transact_batch

    async def counted(room: str, batch: list[Any]) -> Any:
        sizes.append(len(batch))
        return await send(room, batch)

    pg._transact_batch = counted  # type: ignore[method-assign]
    return sizes


async def test_concurrent_appending_transacts_share_statements_and_number_gaplessly(
    postgres_url: str,
) -> None:
    async with _pg(postgres_url) as pg:
        sizes = _count_batches(pg)
        room = f"r{uuid.uuid4().hex[:8]}"
        results = await asyncio.gather(
            *(
                pg.transact(room, [Absent(f"k{i}")], [Put(f"k{i}", i)], [Append("e", i)])
                for i in range(30)
            )
        )
        assert sum(sizes) == 30 and len(sizes) < 30 and sizes[0] == 1, sizes
        assert sorted(s for r in results for s in r.seqs) == list(range(1, 31))
        events = await pg.read_log(room, 0, 100)
        by_seq = {e.seq: e.data for e in events}
        for i, r in enumerate(results):  # each got its own event's number
            assert by_seq[r.seqs[0]] == i
        snap = await pg.read(room, [f"k{i}" for i in range(30)])
        assert [snap.version(f"k{i}") for i in range(30)] == [
            r.versions[f"k{i}"] for i, r in enumerate(results)
        ]
        # The same again: every one now conflicts, each on its own key.
        again = await asyncio.gather(
            *(
                pg.transact(room, [Absent(f"k{i}")], [Put(f"k{i}", -1)], [Append("e")])
                for i in range(30)
            ),
            return_exceptions=True,
        )
        for i, outcome in enumerate(again):
            assert isinstance(outcome, VersionConflict)
            assert outcome.conflicts == {f"k{i}": results[i].versions[f"k{i}"]}
        assert await pg.last_seq(room) == 30


async def test_one_transacts_bad_input_fails_only_it(postgres_url: str) -> None:
    async with _pg(postgres_url) as pg:
        sizes = _count_batches(pg)
        room = f"r{uuid.uuid4().hex[:8]}"
        bad = 3  # a lone surrogate: the driver cannot encode it
        outcomes = await asyncio.gather(
            *(
                pg.transact(room, [], [Put(f"k{i}", "\ud800" if i == bad else i)], [Append("e")])
                for i in range(8)
            ),
            return_exceptions=True,
        )
        assert any(size > 1 for size in sizes), sizes  # the bad one was in a batch
        assert isinstance(outcomes[bad], BadRequest)
        assert all(isinstance(o, TransactResult) for i, o in enumerate(outcomes) if i != bad)
        snap = await pg.read(room, [f"k{i}" for i in range(8)])
        assert sorted(snap.records) == sorted(f"k{i}" for i in range(8) if i != bad)
        assert await pg.last_seq(room) == 7


@contextlib.asynccontextmanager
async def _append_lock_held(postgres_url: str, room: str) -> AsyncIterator[None]:
    """Hold the room's append lock from another session, so that an appending transact
    of the room waits in flight and the ones after it queue."""
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": SCHEMA})
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(append_lock($1))", room)
            yield
    finally:
        await conn.close()


async def _queued(pg: PostgresStore, room: str, count: int) -> None:
    for _ in range(200):
        if len(pg._lines.get(room, ())) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the transacts did not queue")


async def test_a_caller_that_gives_up_before_its_batch_is_sent_has_nothing_applied(
    postgres_url: str,
) -> None:
    async with _pg(postgres_url) as pg:
        room = f"r{uuid.uuid4().hex[:8]}"
        async with _append_lock_held(postgres_url, room):
            first = asyncio.create_task(pg.transact(room, [], [Put("first", 1)], [Append("e")]))
            await asyncio.sleep(0.2)  # in flight, waiting for the lock
            queued = [
                asyncio.create_task(pg.transact(room, [], [Put(f"q{i}", i)], [Append("e")]))
                for i in range(3)
            ]
            await _queued(pg, room, 3)
            queued[1].cancel()
        await first
        await asyncio.gather(queued[0], queued[2])
        assert queued[1].cancelled()
        snap = await pg.read(room, ["first", "q0", "q1", "q2"])
        assert sorted(snap.records) == ["first", "q0", "q2"]
        assert await pg.last_seq(room) == 3


async def test_transacts_queued_when_the_store_closes_fail_and_are_not_applied(
    postgres_url: str,
) -> None:
    room = f"r{uuid.uuid4().hex[:8]}"
    async with _pg(postgres_url) as pg:
        async with _append_lock_held(postgres_url, room):
            first = asyncio.create_task(pg.transact(room, [], [Put("first", 1)], [Append("e")]))
            await asyncio.sleep(0.2)
            queued = [
                asyncio.create_task(pg.transact(room, [], [Put(f"q{i}", i)], [Append("e")]))
                for i in range(3)
            ]
            await _queued(pg, room, 3)
            closing = asyncio.create_task(pg.close())
            await asyncio.sleep(0.1)
        await first  # in flight before the close: it completes
        for task in queued:
            with pytest.raises(StoreUnavailable):
                await task
        await closing
    async with _pg(postgres_url) as again:
        snap = await again.read(room, ["first", "q0", "q1", "q2"])
        assert sorted(snap.records) == ["first"]


async def test_batches_locking_in_opposite_orders_never_deadlock(postgres_url: str) -> None:
    """Each transact writes two keys and two set members, listed in a random order; two
    handles' batches then hold opposite orders. A deadlock would stall a batch for
    PostgreSQL's deadlock_timeout (1 s) and then fail it."""
    room = f"r{uuid.uuid4().hex[:8]}"
    async with _pg(postgres_url) as one, _pg(postgres_url) as two:
        rng = random.Random(7)

        async def writer(store: Store, n: int) -> None:
            for _ in range(25):
                pair = rng.sample(["x", "y", "z"], 2)
                ops: list[Write] = [Put(k, n) for k in pair]
                ops += [SetAdd("s", m) if rng.random() < 0.5 else SetRemove("s", m) for m in pair]
                await asyncio.wait_for(store.transact(room, [], ops, [Append("e", n)]), 0.9)

        await asyncio.gather(*(writer(store, n) for n in range(8) for store in (one, two)))
        assert await one.last_seq(room) == 2 * 8 * 25


async def test_a_batch_cut_off_in_flight_fails_its_callers_with_unknown_outcome(
    postgres_url: str,
) -> None:
    """If the task sending a batch is cancelled (the event loop is closing) while the
    batch is in flight, its callers get ``StoreUnavailable`` rather than wait forever."""
    room = f"r{uuid.uuid4().hex[:8]}"
    async with _pg(postgres_url) as pg:
        await pg.transact(room, writes=[Put("q0", 0)])
        blocker = await asyncpg.connect(postgres_url, server_settings={"search_path": SCHEMA})
        try:
            row_lock = blocker.transaction()
            await row_lock.start()  # hold q0's row: the batch waits for it
            await blocker.execute(
                "SELECT FROM records WHERE room = $1 AND key = 'q0' FOR UPDATE", room
            )
            async with _append_lock_held(postgres_url, room):
                first = asyncio.create_task(pg.transact(room, [], [Put("a", 1)], [Append("e")]))
                await asyncio.sleep(0.2)
                queued = [
                    asyncio.create_task(pg.transact(room, [], [Put(f"q{i}", i)], [Append("e")]))
                    for i in range(3)
                ]
                await _queued(pg, room, 3)
            await first
            await asyncio.sleep(0.3)  # the batch is in flight, waiting for q0's row
            assert not any(task.done() for task in queued)
            for flusher in list(pg._flushers):
                flusher.cancel()
            for task in queued:
                with pytest.raises(StoreUnavailable):
                    await asyncio.wait_for(task, 5)
            await row_lock.rollback()
        finally:
            await blocker.close()
