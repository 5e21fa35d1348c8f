"""The designated writer's fairness on every backend: conditional intents on one hot
record serve every submitter (a retry keeps its place), and a batch decided on the
records the writer remembers is still decided on what the store holds; a submission,
which compares nothing of the queue's, still fails at once on an archived room."""

from __future__ import annotations

import asyncio
import collections
import random
import uuid
from typing import Any

import pytest

from agentrooms.commit import Intent, Where
from agentrooms.errors import InvalidTransition
from agentrooms.rooms import Room, Rooms
from agentrooms.store import Append, Put, Store
from agentrooms.writer import IntentQueue, Writer, WriterMetrics


@pytest.fixture
async def room(store: Store) -> Room:
    r = await Rooms(store).create(f"wq-{uuid.uuid4().hex[:10]}", "writer")
    await r.scope.transact(writes=[Put("counter", {"n": 0})])
    return r


def writer(room: Room, owner: str = "w1", **options: Any) -> Writer:
    return Writer(room, owner=owner, metrics=WriterMetrics(), **options)


# -------------------------------------------------------------------------- fairness


async def test_every_submitter_of_conditional_intents_is_served(store: Store, room: Room) -> None:
    """Sixteen submitters, each read-decide-submit on one counter, resubmitting what is
    rejected: each predicate is evaluated on the batch's running state, so no
    submitter starves; every one gets its three updates applied."""
    n, each = 16, 3
    queue = IntentQueue(room)
    stop = asyncio.Event()
    running = asyncio.create_task(writer(room).run(stop))
    rejected = [0]

    async def submitter(s: int) -> None:
        applied = 0
        while applied < each:
            seen = (await store.read(room.name, ["counter"])).value("counter")["n"]
            intent = Intent(
                [Where("counter", "n", "==", seen)],
                [Put("counter", {"n": seen + 1})],
                [Append("by", {"s": s})],
            )
            outcome = await queue.wait(await queue.submit(intent), timeout=30)
            if outcome.status == "applied":
                applied += 1
            else:
                rejected[0] += 1
                await asyncio.sleep(random.uniform(0, 0.02))

    await asyncio.wait_for(asyncio.gather(*(submitter(s) for s in range(n))), 120)
    stop.set()
    await asyncio.wait_for(running, 20)
    log = await store.read_log(room.name, 0, 10_000)
    by = collections.Counter(e.data["s"] for e in log if e.type == "by")
    assert by == {s: each for s in range(n)}
    assert (await store.read(room.name, ["counter"])).value("counter") == {"n": n * each}
    assert rejected[0] > 0  # the stale reads still show


async def test_a_write_behind_the_writers_back_is_seen(store: Store, room: Room) -> None:
    """The writer takes the records it wrote last for its next batch's snapshot instead
    of reading them; a record written meanwhile by someone else makes that guess wrong,
    and the batch's compare catches it: the intents are decided on what the store
    holds, not on what the writer remembers."""
    queue = IntentQueue(room)
    stop = asyncio.Event()
    running = asyncio.create_task(writer(room).run(stop))

    def bump(seen: int) -> Intent:
        return Intent([Where("counter", "n", "==", seen)], [Put("counter", {"n": seen + 1})])

    assert (await queue.submit_and_wait(bump(0), timeout=30)).status == "applied"
    await store.transact(room.name, writes=[Put("counter", {"n": 10})])  # not queued
    stale = await queue.submit_and_wait(bump(1), timeout=30)  # true on the writer's memory
    fresh = await queue.submit_and_wait(bump(10), timeout=30)
    stop.set()
    await asyncio.wait_for(running, 20)
    assert (stale.status, stale.reason) == ("rejected", ["counter.n == 1"])
    assert fresh.status == "applied"
    assert (await store.read(room.name, ["counter"])).value("counter") == {"n": 11}


async def test_no_submitter_of_conditional_intents_starves(store: Store, room: Room) -> None:
    """Sixteen submitters read one counter and submit ``n == read`` in a shuffled order
    each round, then the writer applies the round in one batch: one intent applies, the
    rest are rejected (the stale reads show). A loser resubmits with ``retry_of``; a
    winner submits afresh. Each retry is evaluated at its first submission's place, so
    the winners rotate: all sixteen are applied in sixteen rounds, in the order of the
    first round's submissions. (In submission order alone, a shuffle decides each round
    and some would still wait.)"""
    n = 16
    queue = IntentQueue(room)
    lock = await room.locks.try_acquire("writer.main", "w1")
    batcher = writer(room, batch=100)
    last: dict[int, Any] = {}
    winners: list[int] = []
    first_round: list[int] = []
    rng = random.Random(4)
    for _ in range(n):
        seen = (await store.read(room.name, ["counter"])).value("counter")["n"]
        order = list(range(n))
        rng.shuffle(order)
        first_round = first_round or order
        ids = {}
        for s in order:
            intent = Intent([Where("counter", "n", "==", seen)], [Put("counter", {"n": seen + 1})])
            ids[s] = await queue.submit(intent, author=f"a{s}", retry_of=last.get(s))
        assert await batcher.apply_pending(lock) == n
        outcomes = {s: await queue.outcome(i) for s, i in ids.items()}
        applied = [s for s, o in outcomes.items() if o.status == "applied"]
        assert len(applied) == 1
        assert all(
            o.reason == [f"counter.n == {seen}"] for o in outcomes.values() if o.status != "applied"
        )
        winners.append(applied[0])
        last = {s: o for s, o in outcomes.items() if o.status == "rejected"}
        for o in last.values():  # a retry keeps the place of the first submission
            assert o.place is not None and o.place <= (o.seq or 0)
    assert sorted(winners) == list(range(n))  # everyone, once
    assert winners == first_round  # round robin, oldest waiter first
    assert (await store.read(room.name, ["counter"])).value("counter") == {"n": n}


# ------------------------------------------------------------------------ submitting


async def test_a_submission_to_a_room_archived_since_fails_at_once(
    store: Store, room: Room
) -> None:
    """The queue's first submission and every later one are guarded by the room's
    archive state: after the room is archived, a submission raises instead of queueing an
    intent that no writer will apply."""
    queue = IntentQueue(room)
    await queue.submit(Intent([], [Put("counter", {"n": 1})]))
    await Rooms(store).archive(room.name)
    with pytest.raises(InvalidTransition, match="archived"):
        await queue.submit(Intent([], [Put("counter", {"n": 2})]))
    with pytest.raises(InvalidTransition, match="archived"):
        await queue.submit_and_wait(Intent([], [Put("counter", {"n": 3})]), timeout=5)
