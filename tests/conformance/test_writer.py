"""The designated writer on every backend: order, backpressure, poison, outcomes,
fencing, and failover between two writer processes (issue: writer; seed 004).

memory:// cannot be shared with another process; there the two writers are tasks on
killable handles of the same store (see ``writer_workers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import os
import signal
import uuid
from typing import Any

import pytest

from agentrooms.commit import Intent, Where
from agentrooms.errors import (
    BadRequest,
    IdempotencyMismatch,
    PayloadTooLarge,
    RateLimited,
    StaleFence,
)
from agentrooms.rooms import Room, Rooms
from agentrooms.store import Append, Put, SetAdd, Store
from agentrooms.writer import Increment, IntentQueue, QueuedIntent, Writer, WriterMetrics
from tests.conformance import writer_workers as ww
from tests.conftest import Backend
from tests.helpers import Interposed


@pytest.fixture
async def room(store: Store) -> Room:
    r = await Rooms(store).create(f"wq-{uuid.uuid4().hex[:10]}", "writer")
    await r.scope.transact(writes=[Put("counter", {"n": 0})])
    return r


def writer(room: Room, owner: str = "w1", **options: Any) -> Writer:
    """A writer with metrics of its own (so a test can count its writes)."""
    return Writer(room, owner=owner, metrics=WriterMetrics(), **options)


async def chain_log(store: Store, room: Room) -> list[int]:
    log = await store.read_log(room.name, 0, 10_000)
    return [e.data["i"] for e in log if e.type == "chain"]


def settlements(log: list[Any]) -> list[dict[str, Any]]:
    """Every outcome the ``wq.settled`` events of ``log`` tell, in their order, with the
    writer and fence of its event."""
    return [
        {"id": i, "status": status, "seq": seq, "place": place, "reason": reason}
        | {"by": e.data["by"], "fence": e.data["fence"]}
        for e in log
        if e.type == "wq.settled"
        for i, status, seq, place, reason in e.data["outcomes"]
    ]


# ------------------------------------------------------------------------ in order


async def test_intents_apply_in_submission_order(store: Store, room: Room) -> None:
    queue = IntentQueue(room)
    w = writer(room)
    stop = asyncio.Event()
    running = asyncio.create_task(w.run(stop))

    async def submitter(s: int) -> list[str]:
        ids = []
        for k in range(12):
            intent = Intent([], [Put(f"by/{s}", k)], [Append("item", {"s": s, "k": k})])
            ids.append(await queue.submit(intent))
        return ids

    submitted = await asyncio.gather(*(submitter(s) for s in range(3)))
    outcomes = [await queue.wait(i, timeout=20) for ids in submitted for i in ids]
    stop.set()
    await asyncio.wait_for(running, 20)
    assert {o.status for o in outcomes} == {"applied"}
    log = await store.read_log(room.name, 0, 10_000)
    order = [e.data["id"] for e in log if e.type == "wq.submitted"]
    applied = [o["id"] for o in settlements(log) if o["status"] == "applied"]
    assert applied == order  # the writer followed the queue exactly
    items = [(e.data["s"], e.data["k"]) for e in log if e.type == "item"]
    for s in range(3):
        assert [k for who, k in items if who == s] == list(range(12))
    assert all(o.seq is not None for o in outcomes)
    assert await queue.depth() == 0 and await queue.position() == max(o.seq or 0 for o in outcomes)
    assert (await store.read(room.name, ["by/0"])).value("by/0") == 11


async def test_a_settlement_wakes_only_the_submitter_waiting_for_it(
    store: Store, room: Room
) -> None:
    """Sixteen submitters of one process wait at once: each reads its outcome when
    it starts waiting and when the event settling its intent arrives, not after every
    settlement (a herd: 16 + 15 + ... + 1 = 136 reads)."""
    counting = Interposed(store)
    queue = IntentQueue(Rooms(counting).room(room.name))
    ids = [await queue.submit(Intent([], [Put(f"by/{i}", i)], [])) for i in range(16)]
    waiting = [asyncio.create_task(queue.wait(i, timeout=30)) for i in ids]
    await asyncio.sleep(0.2)  # every submitter has read its (queued) outcome
    stop = asyncio.Event()
    running = asyncio.create_task(writer(room).run(stop))
    outcomes = await asyncio.wait_for(asyncio.gather(*waiting), 30)
    stop.set()
    await asyncio.wait_for(running, 20)
    assert [o.status for o in outcomes] == ["applied"] * 16
    assert counting.reads <= 3 * 16


async def test_a_failed_predicate_is_a_recorded_outcome(store: Store, room: Room) -> None:
    queue = IntentQueue(room)
    first = await queue.submit(ww.chain_intent(0))
    stale = await queue.submit(ww.chain_intent(0))  # computed from the same read: now stale
    last = await queue.submit(ww.chain_intent(1))
    lock = await room.locks.try_acquire("writer.main", "w1")
    assert await writer(room).apply_pending(lock) == 3
    outcomes = [await queue.outcome(i) for i in (first, stale, last)]
    assert [o.status for o in outcomes] == ["applied", "rejected", "applied"]
    assert outcomes[1].reason == ["counter.n == 0"]
    assert await chain_log(store, room) == [0, 1]


async def test_submission_is_idempotent_by_id(room: Room) -> None:
    queue = IntentQueue(room)
    assert await queue.submit(ww.chain_intent(0), intent_id="a") == "a"
    assert await queue.submit(ww.chain_intent(0), intent_id="a") == "a"
    assert await queue.depth() == 1
    with pytest.raises(IdempotencyMismatch):
        await queue.submit(ww.chain_intent(5), intent_id="a")
    lock = await room.locks.try_acquire("writer.main", "w1")
    assert await writer(room).apply_pending(lock) == 1
    assert (await queue.outcome("a")).status == "applied"


async def test_intents_the_store_would_refuse_are_refused_at_submission(room: Room) -> None:
    queue = IntentQueue(room)
    for bad in (
        Intent([], [Put("wq/main/cursor", {"seq": 0})]),
        Intent([], [Put("_meta", {})]),
        Intent([], [Put("x", 1), Put("x", 2)]),
        {"when": [], "writes": [{"op": "explode"}], "appends": []},
        {"when": [{"key": "k", "op": "~="}], "writes": [], "appends": []},
    ):
        with pytest.raises(BadRequest):
            await queue.submit(bad)
    assert await queue.depth() == 0


async def test_submissions_made_in_one_step_go_in_one_transact(store: Store, room: Room) -> None:
    """Ten submitters ready at once: one transact carries their ten submissions, in the
    order they were made, and each is queued."""
    counting = Interposed(store)
    queue = IntentQueue(Rooms(counting).room(room.name))
    await queue.submit(Intent([], [Put("warm", 0)]))  # the queue's marker, a depth read
    before = counting.calls
    ids = await asyncio.gather(*(queue.submit(Intent([], [Put(f"by/{i}", i)])) for i in range(10)))
    assert counting.calls - before == 1
    log = await store.read_log(room.name, 0, 1000)
    assert [e.data["id"] for e in log if e.type == "wq.submitted"][1:] == ids
    assert await queue.depth() == 11
    lock = await room.locks.try_acquire("writer.main", "w1")
    assert await writer(room).apply_pending(lock) == 11
    assert {(await queue.outcome(i)).status for i in ids} == {"applied"}


class RefusingPills(Interposed):
    """Refuses, before writing anything, every transact that carries a ``pill`` key."""

    async def _transact(self, room: str, ops: Any) -> Any:
        if any('"pill"' in a.data_json for a in ops.appends):
            self.calls += 1
            raise BadRequest("refused by the store")
        return await super()._transact(room, ops)


async def test_a_submission_the_store_refuses_fails_alone_in_its_group(
    store: Store, room: Room
) -> None:
    """The group is refused before anything is written: each submission is sent again
    alone, so only the one at fault gets the error and the others are queued once."""
    handle = RefusingPills(store)
    queue = IntentQueue(Rooms(handle).room(room.name))
    await queue.submit(Intent([], [Put("warm", 0)]))
    intents = [Intent([], [Put("pill" if i == 2 else f"by/{i}", i)]) for i in range(5)]
    done = await asyncio.gather(*(queue.submit(i) for i in intents), return_exceptions=True)
    assert isinstance(done[2], BadRequest)
    assert all(isinstance(d, str) for k, d in enumerate(done) if k != 2)
    log = await store.read_log(room.name, 0, 1000)
    queued = [e.data["id"] for e in log if e.type == "wq.submitted"][1:]
    assert queued == [d for k, d in enumerate(done) if k != 2]
    assert await queue.depth() == 5


# ---------------------------------------------------------------------- backpressure


async def test_a_full_queue_answers_rate_limited_with_retry_after(store: Store, room: Room) -> None:
    queue = IntentQueue(room, max_depth=3)
    for i in range(3):
        await queue.submit(ww.chain_intent(i))
    with pytest.raises(RateLimited) as unknown_rate:
        await queue.submit(ww.chain_intent(3))
    assert unknown_rate.value.retry_after == 1.0  # no throughput measured yet
    lock = await room.locks.try_acquire("writer.main", "w1")
    assert await writer(room).apply_pending(lock) == 3
    cursor = (await store.read(room.name, ["wq/main/cursor"])).value("wq/main/cursor")
    assert cursor["rate"] > 0
    for i in range(3, 6):
        await queue.submit(ww.chain_intent(i))
    with pytest.raises(RateLimited) as measured:
        await queue.submit(ww.chain_intent(6))
    assert measured.value.retry_after == pytest.approx(min(60.0, max(0.01, 1 / cursor["rate"])))
    assert await queue.depth() == 3


# ----------------------------------------------------------------------------- poison


async def test_poison_goes_to_the_dead_letters_and_the_queue_moves_on(
    store: Store, room: Room
) -> None:
    """An intent that cannot be applied (here: one an incompatible client queued with an
    unknown write op, bypassing validation) fails ``max_failures`` times, then is dead."""
    queue = IntentQueue(room)
    before = await queue.submit(ww.chain_intent(0))
    poison = {"when": [], "writes": [{"op": "explode"}], "appends": []}
    item = {"id": "poison", "status": "queued", "intent": poison, "digest": "-", "failures": 0}
    await room.scope.transact(
        writes=[Put(queue.keys.item("poison"), item), SetAdd(queue.keys.queued, "poison")],
        appends=[Append("wq.submitted", {"queue": "main", "id": "poison", "keys": []})],
    )
    after = await queue.submit(ww.chain_intent(1))
    metrics = WriterMetrics()
    w = Writer(room, owner="w1", metrics=metrics, max_failures=3, retry_delay=0.01)
    lock = await room.locks.try_acquire("writer.main", "w1")
    assert await w.apply_pending(lock) == 3
    assert [(await queue.outcome(i)).status for i in (before, "poison", after)] == [
        "applied",
        "dead",
        "applied",
    ]
    (letter,) = await queue.dead_letters()
    assert (letter.id, letter.failures, letter.intent) == ("poison", 3, poison)
    assert letter.reason == {"type": "BadRequest", "message": "unknown write op 'explode'"}
    log = await store.read_log(room.name, 0, 10_000)
    assert [e.data["failures"] for e in log if e.type == "wq.failed"] == [1, 2, 3]
    assert await chain_log(store, room) == [0, 1]
    snap = metrics.snapshot()
    assert snap["outcomes"] == {"applied": 2, "dead": 1}
    assert snap["depth"] == {(room.name, "main"): 0}


# ------------------------------------------------------------------------ metrics


async def test_depth_and_latency_metrics(room: Room) -> None:
    queue = IntentQueue(room)
    for i in range(4):
        await queue.submit(ww.chain_intent(i))
    metrics = WriterMetrics()
    lock = await room.locks.try_acquire("writer.main", "w1")
    await Writer(room, owner="w1", metrics=metrics).apply_pending(lock)
    sample = metrics.registry.get_sample_value
    assert sample("agentrooms_writer_queue_depth", {"room": room.name, "queue": "main"}) == 0
    assert sample("agentrooms_writer_apply_seconds_count") == 4
    assert sample("agentrooms_writer_queue_wait_seconds_count") == 4
    assert sample("agentrooms_writer_intents_total", {"outcome": "applied"}) == 4
    # the commit loop's: the four intents are settled in one batch write
    assert sample("agentrooms_commits_total", {"outcome": "ok"}) == 1
    assert metrics.snapshot()["apply_p99"] > 0


# -------------------------------------------------------------------------- fencing


async def test_a_deposed_writer_cannot_apply(store: Store, room: Room) -> None:
    queue = IntentQueue(room)
    first = await queue.submit(ww.chain_intent(0))
    old = await room.locks.try_acquire("writer.main", "old", ttl=0.2)
    await asyncio.sleep(0.3)
    new = await room.locks.try_acquire("writer.main", "new", ttl=30)
    assert new.fence == old.fence + 1
    with pytest.raises(StaleFence):
        await writer(room, "old").apply_pending(old)
    assert (await queue.outcome(first)).status == "queued"
    assert await writer(room, "new").apply_pending(new) == 1
    assert await chain_log(store, room) == [0]


# ------------------------------------------------------------------------- failover


class Writers:
    """Two writers, in processes (shared backends) or as tasks on killable handles."""

    def __init__(self, backend: Backend, store: Store, room: Room, lock_ttl: float) -> None:
        self.backend, self.store, self.room, self.ttl = backend, store, room, lock_ttl
        self.procs: dict[str, Any] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.handles: dict[str, ww.Killable] = {}
        self.ctx = multiprocessing.get_context("spawn")
        # one stop event per process: setting an event a killed process was waiting on
        # would block forever (its condition waits for the dead sleeper to wake)
        self.stops: dict[str, Any] = {}
        self.killed: set[str] = set()
        self.stop = asyncio.Event()

    def start(self, owner: str) -> None:
        if self.backend.shared_across_processes:
            self.stops[owner] = self.ctx.Event()
            args = (self.backend.url, self.room.name, owner, self.ttl, self.stops[owner])
            self.procs[owner] = self.ctx.Process(target=ww.writer_main, args=args)
            self.procs[owner].start()
        else:
            self.handles[owner] = ww.Killable(self.store)
            coro = ww.serve(self.handles[owner], self.room.name, owner, self.ttl, self.stop)
            self.tasks[owner] = asyncio.create_task(coro)

    def kill(self, owner: str) -> None:
        self.killed.add(owner)
        if owner in self.procs:
            pid = self.procs[owner].pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            self.procs[owner].join(10)
        else:
            self.handles[owner].kill()

    async def close(self) -> None:
        for owner, stop in self.stops.items():
            if owner not in self.killed:
                stop.set()
        self.stop.set()
        for proc in self.procs.values():
            await asyncio.to_thread(proc.join, 15)
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError, ww.Killed):
                await task


@pytest.mark.slow
async def test_failover_applies_every_intent_once_in_order(
    backend: Backend, store: Store, room: Room
) -> None:
    """Two writers; the active one is killed (SIGKILL) mid-stream; the standby takes the
    lock when it expires and carries on from the cursor: nothing lost, nothing twice."""
    total, kill_after = 60, 20
    queue = IntentQueue(room)
    writers = Writers(backend, store, room, lock_ttl=2.0)
    try:
        writers.start("wa")
        writers.start("wb")
        ids = []
        for i in range(total):
            ids.append(await queue.submit(ww.chain_intent(i)))
            if i == kill_after:
                await queue.wait(ids[kill_after // 2], timeout=30)
                holder = await room.locks.holder("writer.main")
                assert holder is not None
                writers.kill(holder.owner)
                victim = holder.owner
            await asyncio.sleep(0.01)
        outcomes = [await queue.wait(i, timeout=30) for i in ids]
        survivor = await room.locks.holder("writer.main")
    finally:
        await writers.close()
    assert [o.status for o in outcomes] == ["applied"] * total
    assert await chain_log(store, room) == list(range(total))
    assert (await store.read(room.name, ["counter"])).value("counter") == {"n": total}
    seqs = [o.seq or 0 for o in outcomes]
    assert seqs == sorted(seqs)
    assert survivor is not None and survivor.owner != victim
    log = await store.read_log(room.name, 0, 10_000)
    applied = [o for o in settlements(log) if o["status"] == "applied"]
    assert [d["id"] for d in applied] == ids
    by = [d["by"] for d in applied]  # the victim applied a prefix, the survivor the rest
    switch = by.index(survivor.owner)
    assert (
        0 < switch < total and set(by[:switch]) == {victim} and set(by[switch:]) == {survivor.owner}
    )
    assert applied[switch]["fence"] > applied[switch - 1]["fence"]


@pytest.mark.slow
async def test_waiters_learn_a_batch_settled_in_another_process_from_its_one_event(
    backend: Backend, store: Store, room: Room
) -> None:
    """Sixteen submitters of this process wait; a writer in another process (on
    memory://, a task on a handle of its own: nothing told to this process) settles
    their intents in one batch, with one ``wq.settled`` event: read from the log, it
    wakes every waiter with its own outcome."""
    queue = IntentQueue(room)
    bump = QueuedIntent([], increments=[Increment("counter", 1, "n")])
    waiting = [asyncio.create_task(queue.submit_and_wait(bump, timeout=60)) for _ in range(16)]
    while await queue.depth() < 16:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    writers = Writers(backend, store, room, lock_ttl=5.0)
    try:
        writers.start("wa")
        outcomes = await asyncio.wait_for(asyncio.gather(*waiting), 60)
    finally:
        await writers.close()
    assert [o.status for o in outcomes] == ["applied"] * 16
    log = await store.read_log(room.name, 0, 10_000)
    (event,) = [e for e in log if e.type == "wq.settled"]
    assert event.data["by"] == "wa" and len(event.data["outcomes"]) == 16
    told = {o["id"]: (o["seq"], o["place"]) for o in settlements(log)}
    assert {o.id: (o.seq, o.place) for o in outcomes} == told
    assert (await store.read(room.name, ["counter"])).value("counter") == {"n": 16}


# --------------------------------------------------------------------------- batches


def commits(w: Writer) -> float:
    return w.metrics.registry.get_sample_value("agentrooms_commits_total", {"outcome": "ok"}) or 0


def outcome_events(log: list[Any]) -> dict[str, list[str]]:
    """Per intent id, the outcomes the writer's events told for it."""
    found: dict[str, list[str]] = {}
    for o in settlements(log):
        if o["status"] in ("applied", "rejected", "dead"):
            found.setdefault(o["id"], []).append(o["status"])
    return found


async def test_a_batch_evaluates_each_intent_on_the_state_the_earlier_ones_left(
    store: Store, room: Room
) -> None:
    """Ten links of a chain and a stale duplicate in the middle, settled in one write:
    each link sees the counter its predecessor moved; the duplicate, computed from an
    old read, is rejected and the links after it are not affected."""
    queue = IntentQueue(room)
    ids = [await queue.submit(ww.chain_intent(i)) for i in range(5)]
    stale = await queue.submit(ww.chain_intent(2))
    ids += [await queue.submit(ww.chain_intent(i)) for i in range(5, 10)]
    w = writer(room)
    lock = await room.locks.try_acquire("writer.main", "w1")
    assert await w.apply_pending(lock) == 11
    assert commits(w) == 1  # one store write for the eleven
    assert {(await queue.outcome(i)).status for i in ids} == {"applied"}
    rejected = await queue.outcome(stale)
    assert (rejected.status, rejected.reason) == ("rejected", ["counter.n == 2"])
    assert await chain_log(store, room) == list(range(10))
    assert (await store.read(room.name, ["counter"])).value("counter") == {"n": 10}
    log = await store.read_log(room.name, 0, 10_000)
    assert outcome_events(log) == {
        **{i: ["applied"] for i in ids},
        stale: ["rejected"],
    }  # every outcome recorded once
    assert await queue.depth() == 0 and await queue.position() == max(
        e.seq for e in log if e.type == "wq.submitted"
    )


async def test_a_rejected_intent_in_a_batch_writes_nothing_of_its_own(
    store: Store, room: Room
) -> None:
    queue = IntentQueue(room)
    a = await queue.submit(Intent([], [Put("a", 1), SetAdd("s", "a")], [Append("note", "a")]))
    b = await queue.submit(
        Intent([Where("a", None, "==", 2)], [Put("b", 1), SetAdd("s", "b")], [Append("note", "b")])
    )
    c = await queue.submit(Intent([Where("a", None, "==", 1)], [Put("a", 3), Put("c", 1)]))
    lock = await room.locks.try_acquire("writer.main", "w1")
    w = writer(room)
    assert await w.apply_pending(lock) == 3 and commits(w) == 1
    assert [(await queue.outcome(i)).status for i in (a, b, c)] == [
        "applied",
        "rejected",
        "applied",
    ]
    snap = await store.read(room.name, ["a", "b", "c"])
    assert (snap.value("a"), snap.value("b"), snap.value("c")) == (3, None, 1)  # last write wins
    assert await store.set_size(room.name, "s") == 1
    log = await store.read_log(room.name, 0, 10_000)
    assert [e.data for e in log if e.type == "note"] == ["a"]


async def test_batches_are_bounded_by_count_bytes_and_the_stores_operations(
    store: Store, room: Room
) -> None:
    queue = IntentQueue(room)
    ids = [await queue.submit(ww.chain_intent(i)) for i in range(12)]
    lock = await room.locks.try_acquire("writer.main", "w1")
    by_count = writer(room, batch=5)
    assert await by_count.apply_pending(lock) == 12
    assert commits(by_count) == 3  # 5 + 5 + 2
    ids += [await queue.submit(ww.chain_intent(i)) for i in range(12, 16)]
    by_bytes = writer(room, batch_bytes=1)  # one intent per write: the first always fits
    assert await by_bytes.apply_pending(lock) == 4 and commits(by_bytes) == 4
    small = Interposed(store)
    small.limits = dataclasses.replace(store.limits, max_ops=40)
    ids += [await queue.submit(ww.chain_intent(i)) for i in range(16, 40)]
    by_ops = writer(Rooms(small).room(room.name))
    assert await by_ops.apply_pending(lock) == 24
    assert 24 > commits(by_ops) >= 3
    assert all(len(sent) <= 60 for sent in small.sent)
    assert {(await queue.outcome(i)).status for i in ids} == {"applied"}
    assert await chain_log(store, room) == list(range(40))


async def test_a_batch_the_store_refuses_is_retried_in_halves(store: Store, room: Room) -> None:
    """A store that refuses any write of more than three intents' outcomes: the writer
    halves the batch until it fits, and every intent is applied once, in order."""

    async def refuse_big(n: int, compares: Any) -> None:
        if len(compares) > 2 + 3 * 3 + 1:  # room guards, 3 intents' keys, the fence
            raise PayloadTooLarge("too big for this store")

    handle = Interposed(store, before=refuse_big)
    queue = IntentQueue(room)
    ids = [await queue.submit(ww.chain_intent(i)) for i in range(10)]
    lock = await room.locks.try_acquire("writer.main", "w1")
    w = writer(Rooms(handle).room(room.name))
    assert await w.apply_pending(lock) == 10
    assert {(await queue.outcome(i)).status for i in ids} == {"applied"}
    assert await chain_log(store, room) == list(range(10))
    log = await store.read_log(room.name, 0, 10_000)
    assert not [e for e in log if e.type == "wq.failed"]  # too big is not the intent's fault


async def test_dead_letters_in_a_batch(store: Store, room: Room) -> None:
    """A poison intent in the middle of a batch: the intents before it are applied in
    one write, it goes to the dead letters, and those after it are applied."""
    queue = IntentQueue(room)
    before = [await queue.submit(ww.chain_intent(i)) for i in range(3)]
    poison = {"when": [], "writes": [{"op": "explode"}], "appends": []}
    item = {"id": "poison", "status": "queued", "intent": poison, "digest": "-", "failures": 0}
    await room.scope.transact(
        writes=[Put(queue.keys.item("poison"), item), SetAdd(queue.keys.queued, "poison")],
        appends=[Append("wq.submitted", {"queue": "main", "id": "poison", "keys": []})],
    )
    after = [await queue.submit(ww.chain_intent(i)) for i in range(3, 6)]
    w = writer(room, max_failures=2, retry_delay=0.01)
    lock = await room.locks.try_acquire("writer.main", "w1")
    assert await w.apply_pending(lock) == 7
    statuses = [(await queue.outcome(i)).status for i in [*before, "poison", *after]]
    assert statuses == ["applied"] * 3 + ["dead"] + ["applied"] * 3
    (letter,) = await queue.dead_letters()
    assert (letter.id, letter.failures) == ("poison", 2)
    assert await chain_log(store, room) == list(range(6))
    log = await store.read_log(room.name, 0, 10_000)
    assert [e.data["failures"] for e in log if e.type == "wq.failed"] == [1, 2]
    assert outcome_events(log)["poison"] == ["dead"]
    # before: one write; poison: two failures counted and one burial; after: one write
    assert commits(w) == 1 + 2 + 1 + 1


async def test_a_stale_writers_batch_is_fenced_out(store: Store, room: Room) -> None:
    """A writer deposed between reading its batch and writing it: the write is refused
    (``StaleFence``), nothing of the batch is applied, and the new writer applies it."""
    queue = IntentQueue(room)
    ids = [await queue.submit(ww.chain_intent(i)) for i in range(6)]
    old = await room.locks.try_acquire("writer.main", "old", ttl=0.3)
    taken: list[Any] = []

    async def take_over(n: int, compares: Any) -> None:
        if not taken:  # the old writer's batch write: the lock expired meanwhile
            await asyncio.sleep(0.4)
            taken.append(await room.locks.try_acquire("writer.main", "new", ttl=30))

    stale = writer(Rooms(Interposed(store, before=take_over)).room(room.name), "old")
    with pytest.raises(StaleFence):
        await stale.apply_pending(old)
    assert {(await queue.outcome(i)).status for i in ids} == {"queued"}
    assert await chain_log(store, room) == []
    fresh = writer(room, "new")
    assert await fresh.apply_pending(taken[0]) == 6 and commits(fresh) == 1
    assert await chain_log(store, room) == list(range(6))
    log = await store.read_log(room.name, 0, 10_000)
    assert {o["by"] for o in settlements(log) if o["status"] == "applied"} == {"new"}


# ------------------------------------------------------------------------ increments


async def test_increments_from_many_submitters_add_up_exactly(store: Store, room: Room) -> None:
    """N submitters x M increments, no predicate: every one applied, the total exact,
    the counters created at 0 (a bare number, and a field of an object)."""
    n, m = 8, 12
    queue = IntentQueue(room)
    stop = asyncio.Event()
    running = asyncio.create_task(writer(room).run(stop))

    async def submitter(s: int) -> list[str]:
        ids = []
        for _ in range(m):
            bumps = [
                Increment("hits"),
                Increment("tally", 2, f"by.s{s}"),
                Increment("tally", 1, "n"),
            ]
            ids.append(await queue.submit(QueuedIntent([], increments=bumps)))
        return ids

    submitted = await asyncio.gather(*(submitter(s) for s in range(n)))
    outcomes = [await queue.wait(i, timeout=30) for ids in submitted for i in ids]
    stop.set()
    await asyncio.wait_for(running, 20)
    assert {o.status for o in outcomes} == {"applied"}
    snap = await store.read(room.name, ["hits", "tally"])
    assert snap.value("hits") == n * m
    assert snap.value("tally") == {"n": n * m, "by": {f"s{s}": 2 * m for s in range(n)}}


async def test_an_increment_of_something_not_a_number_is_rejected(store: Store, room: Room) -> None:
    queue = IntentQueue(room)
    await room.scope.transact(writes=[Put("name", "x"), Put("doc", {"n": [1]})])
    bad = [
        await queue.submit(QueuedIntent([], [Put("ok", 1)], increments=[Increment("name")])),
        await queue.submit(QueuedIntent([], increments=[Increment("doc", 1, "n")])),
        await queue.submit(QueuedIntent([], increments=[Increment("doc", 1, "n.deep")])),
    ]
    good = await queue.submit(QueuedIntent([], increments=[Increment("doc", 1.5, "m")]))
    lock = await room.locks.try_acquire("writer.main", "w1")
    assert await writer(room).apply_pending(lock) == 4
    outcomes = [await queue.outcome(i) for i in bad]
    assert [o.status for o in outcomes] == ["rejected"] * 3
    assert outcomes[0].reason == ["name is not a number"]
    assert (await queue.outcome(good)).status == "applied"
    snap = await store.read(room.name, ["ok", "doc"])
    assert snap.value("ok") is None and snap.value("doc") == {"n": [1], "m": 1.5}
    with pytest.raises(BadRequest):
        await queue.submit(QueuedIntent([], increments=[Increment("wq/main/cursor")]))
    with pytest.raises(BadRequest):
        Increment("hits", True)


async def test_submit_and_wait_reads_no_outcome(store: Store, room: Room) -> None:
    """Subscribed before it submits, it learns the outcome from the settling event; an
    id submitted before is read back instead (the event may be past)."""
    counting = Interposed(store)
    queue = IntentQueue(Rooms(counting).room(room.name))
    stop = asyncio.Event()
    running = asyncio.create_task(writer(room).run(stop))
    bump = QueuedIntent([], increments=[Increment("hits")])
    outcomes = await asyncio.gather(
        *(queue.submit_and_wait(bump, intent_id=f"b{i}", timeout=30) for i in range(8))
    )
    reads = counting.reads
    again = await queue.submit_and_wait(bump, intent_id="b0", timeout=30)
    stop.set()
    await asyncio.wait_for(running, 20)
    assert [o.status for o in outcomes] == ["applied"] * 8 and all(o.seq for o in outcomes)
    assert reads == 0  # the depth is a set size, the outcome came with the event
    assert (again.status, again.seq) == ("applied", outcomes[0].seq)
    assert (await store.read(room.name, ["hits"])).value("hits") == 8
