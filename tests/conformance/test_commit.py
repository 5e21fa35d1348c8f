"""The commit loop (DESIGN.md §3) on every backend."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest
from prometheus_client import CollectorRegistry

from agentrooms.commit import (
    COMMAND_PREFIX,
    Change,
    CommitOptions,
    Intent,
    View,
    Where,
    apply_intent,
    commit,
)
from agentrooms.errors import (
    ContentionExhausted,
    IdempotencyMismatch,
    InvalidTransition,
    StaleFence,
    StoreUnavailable,
)
from agentrooms.metrics import Metrics
from agentrooms.retry import FullJitter, NoBackoff, RetryPolicy
from agentrooms.store import (
    Append,
    Compare,
    FenceAtMost,
    Put,
    Record,
    Snapshot,
    Store,
    TransactResult,
    VersionIs,
)
from tests.conftest import Backend
from tests.helpers import Interposed

FAST = RetryPolicy(max_attempts=50, budget=30.0, backoff=FullJitter(base=0.001, cap=0.02))
QUICK = CommitOptions(policy=FAST)


def increment(view: View, by: int) -> Change:
    value = view.get("counter", 0) + by
    return Change(writes=[Put("counter", value)], appends=[Append("incremented", by)], result=value)


async def test_concurrent_agents_lose_no_update(backend: Backend, room: str) -> None:
    stores = [await backend.open() for _ in range(8)]
    metrics = Metrics(CollectorRegistry())

    async def agent(s: Store) -> list[int]:
        return [
            (
                await commit(
                    s,
                    room,
                    increment,
                    1,
                    keys=["counter"],
                    options=CommitOptions(policy=FAST, metrics=metrics),
                )
            ).result
            for _ in range(5)
        ]

    results = await asyncio.gather(*(agent(s) for s in stores))
    seen = sorted(r for rs in results for r in rs)
    assert seen == list(range(1, 41))  # every increment saw a distinct state
    snap = await stores[0].read(room, ["counter"])
    assert snap.value("counter") == 40
    assert len(await stores[0].read_log(room, 0, 100)) == 40
    assert metrics.snapshot()["commits"]["ok"] == 40
    for s in set(stores):
        await s.close()


async def test_a_guess_saves_the_read_and_a_wrong_one_never_commits(
    store: Store, room: str
) -> None:
    """``guess``: the first attempt computes from the given snapshot instead of a read.
    Right, the commit is one write; wrong, its write fails the compare on the version
    it guessed, and the loop re-reads and recomputes from the store's state."""
    counting = Interposed(store)
    first = await commit(counting, room, increment, 5, keys=["counter"], options=QUICK)
    version = first.versions["counter"]
    right = Snapshot({"counter": Record("counter", 5, version)}, 0.0)
    calls, reads = counting.calls, counting.reads
    done = await commit(counting, room, increment, 1, keys=["counter"], guess=right, options=QUICK)
    assert (done.result, done.attempts, done.transitions) == (6, 1, 1)
    assert (counting.calls - calls, counting.reads - reads) == (1, 0)

    stale = Snapshot({"counter": Record("counter", 5, version)}, 0.0)  # 6 is stored now
    calls, reads = counting.calls, counting.reads
    done = await commit(counting, room, increment, 1, keys=["counter"], guess=stale, options=QUICK)
    assert (done.result, done.attempts, done.transitions) == (7, 2, 2)  # 6 was never written
    assert (counting.calls - calls, counting.reads - reads) == (2, 1)
    # the counter conflicted just now: a guess about it is dropped, and it reads
    calls, reads = counting.calls, counting.reads
    done = await commit(counting, room, increment, 1, keys=["counter"], guess=right, options=QUICK)
    assert (done.result, done.attempts, counting.reads - reads) == (8, 1, 1)
    assert (await store.read(room, ["counter"])).value("counter") == 8
    assert [e.data for e in await store.read_log(room, 0, 100)] == [5, 1, 1, 1]

    other = f"{room}-2"  # a key the guess lacks counts as absent
    await store.transact(other, writes=[Put("counter", 10)])
    absent = Snapshot({}, 0.0)
    done = await commit(
        counting, other, increment, 1, keys=["counter"], guess=absent, options=QUICK
    )
    assert (done.result, done.attempts) == (11, 2)
    await store.delete_room(other)


async def test_writers_of_one_process_take_turns_on_a_hot_key(store: Store, room: str) -> None:
    """Sixteen writers on one store handle: once the counter has conflicted they queue
    for it in the process instead of colliding in the store, so few of their write
    attempts are wasted; with local turns off, most are."""

    async def run(policy: RetryPolicy, where: str) -> tuple[int, int]:
        metrics = Metrics(CollectorRegistry())

        options = CommitOptions(policy=policy, metrics=metrics)

        async def writer() -> int:
            attempts = 0
            for _ in range(5):
                done = await commit(store, where, increment, 1, keys=["counter"], options=options)
                attempts += done.attempts
            return attempts

        attempts = sum(await asyncio.gather(*(writer() for _ in range(16))))
        assert (await store.read(where, ["counter"])).value("counter") == 80
        return attempts, metrics.snapshot()["commits"]["ok"]

    turns = RetryPolicy(max_attempts=500, budget=60.0, backoff=FullJitter(0.001, 0.02))
    alone = dataclasses.replace(turns, local_turns=False)
    with_turns, ok = await run(turns, room)
    without, _ = await run(alone, room + "-alone")
    assert ok == 80
    # a few conflicts before the key is known to be hot (measured: 95 on every shared
    # backend, against 236 to 493 without turns; the memory store never interleaves)
    assert with_turns < 80 + 16 * 3 and with_turns <= without


async def test_conflict_discards_and_recomputes_from_a_fresh_snapshot(
    store: Store, room: str
) -> None:
    """Order: conflict -> discard -> delay -> re-read -> recompute -> conditional write."""
    await store.transact(room, writes=[Put("counter", 0)])
    seen_by_transition: list[int | None] = []

    async def interfere(n: int, compares: list[Compare]) -> None:
        if n <= 2:  # another agent commits between our read and our write, twice
            await store.transact(room, writes=[Put("counter", 100 * n)])

    wrapped = Interposed(store, before=interfere)

    def transition(view: View, by: int) -> Change:
        seen_by_transition.append(view.version("counter"))
        return increment(view, by)

    delays: list[float] = []

    async def fake_sleep(d: float) -> None:
        delays.append(d)

    options = CommitOptions(policy=FAST, sleep=fake_sleep)
    result = await commit(wrapped, room, transition, 1, keys=["counter"], options=options)
    assert result.attempts == 3 and result.transitions == 3
    assert result.result == 201  # computed from the value the second interferer wrote
    assert len(delays) == 2  # one back-off per conflict, before the re-read
    # each attempt compared exactly the version its own transition saw: nothing stale resent
    sent_versions = [[c.version for c in cs if isinstance(c, VersionIs)] for cs in wrapped.sent]
    assert sent_versions == [[v] for v in seen_by_transition]
    assert len(set(seen_by_transition)) == 3
    assert (await store.read(room, ["counter"])).value("counter") == 201


async def test_invalid_transition_is_raised_at_once(store: Store, room: str) -> None:
    calls = 0

    def refuse(view: View, event: str) -> Change:
        nonlocal calls
        calls += 1
        raise InvalidTransition(f"cannot {event} a closed task")

    wrapped = Interposed(store)
    with pytest.raises(InvalidTransition):
        await commit(wrapped, room, refuse, "claim", keys=["task"])
    assert calls == 1 and wrapped.calls == 0


async def test_contention_exhausted_by_attempts(store: Store, room: str) -> None:
    async def always_interfere(n: int, compares: list[Compare]) -> None:
        await store.transact(room, writes=[Put("counter", n)])

    wrapped = Interposed(store, before=always_interfere)
    policy = RetryPolicy(max_attempts=3, budget=30, backoff=NoBackoff())
    with pytest.raises(ContentionExhausted) as info:
        await commit(
            wrapped, room, increment, 1, keys=["counter"], options=CommitOptions(policy=policy)
        )
    assert info.value.attempts == 3 and info.value.keys == ["counter"]
    assert wrapped.calls == 3


async def test_contention_exhausted_by_budget_and_requeue(store: Store, room: str) -> None:
    async def always_interfere(n: int, compares: list[Compare]) -> None:
        await store.transact(room, writes=[Put("counter", n)])

    now = [0.0]

    async def fake_sleep(d: float) -> None:
        now[0] += d

    policy = RetryPolicy(max_attempts=1000, budget=1.0, backoff=FullJitter(base=0.1, cap=0.4))
    wrapped = Interposed(store, before=always_interfere)
    with pytest.raises(ContentionExhausted) as info:
        await commit(
            wrapped,
            room,
            increment,
            1,
            keys=["counter"],
            options=CommitOptions(
                policy=policy, sleep=fake_sleep, clock=lambda: now[0], rng=random.Random(7)
            ),
        )
    assert info.value.elapsed <= 1.0
    assert 2 <= info.value.attempts < 1000

    queue: list[int] = []

    async def requeue(event: int) -> None:
        queue.append(event)

    now[0] = 0.0
    result = await commit(
        wrapped,
        room,
        increment,
        5,
        keys=["counter"],
        requeue=requeue,
        options=CommitOptions(policy=policy, sleep=fake_sleep, clock=lambda: now[0]),
    )
    assert result.requeued and queue == [5]


async def test_reading_an_undeclared_key_adds_it_to_the_compares(store: Store, room: str) -> None:
    await store.transact(room, writes=[Put("dep", "done")])
    wrapped = Interposed(store)

    def needs_dep(view: View, _: None) -> Change:
        return Change(writes=[Put("out", view.get("dep"))])

    result = await commit(wrapped, room, needs_dep, None)
    assert result.transitions == 2 and result.attempts == 1
    assert [type(c).__name__ for c in wrapped.sent[0]] == ["VersionIs"]


async def test_keys_a_transition_needs_are_read_together(store: Store, room: str) -> None:
    """``view.need(keys)``: the undeclared ones come in one re-read, not one each, and
    all are compared in the write."""
    await store.transact(room, writes=[Put("a", 1), Put("b", 2)])
    wrapped = Interposed(store)

    def total(view: View, _: None) -> Change:
        view.need(["a", "b", "c"])
        return Change(writes=[Put("sum", sum(view.get(k, 0) for k in ("a", "b", "c")))])

    result = await commit(wrapped, room, total, None)
    assert (result.transitions, result.attempts, wrapped.reads) == (2, 1, 2)
    assert wrapped.read_keys[1] == ["a", "b", "c"]
    assert sorted(type(c).__name__ for c in wrapped.sent[0]) == ["Absent", "VersionIs", "VersionIs"]
    assert (await store.read(room, ["sum"])).value("sum") == 3


async def test_stale_fence_is_not_retried(store: Store, room: str) -> None:
    await store.transact(room, writes=[Put("task", {"fence": 9})])
    wrapped = Interposed(store)

    def late(view: View, fence: int) -> Change:
        return Change(writes=[Put("result", "late")], requires=[FenceAtMost("task", fence)])

    with pytest.raises(StaleFence):
        await commit(wrapped, room, late, 8)
    assert wrapped.calls == 1


# ---------------------------------------------------------------------- idempotency


async def test_lost_response_retry_applies_nothing_twice(store: Store, room: str) -> None:
    async def lose_first_response(n: int, result: TransactResult) -> None:
        if n == 1:
            raise StoreUnavailable("connection reset after commit")

    wrapped = Interposed(store, after=lose_first_response)
    result = await commit(
        wrapped, room, increment, 1, keys=["counter"], command_id="cmd-1", options=QUICK
    )
    assert result.replayed and result.result == 1
    assert wrapped.calls == 1  # the retry re-read and found the outcome; nothing re-sent
    assert (await store.read(room, ["counter"])).value("counter") == 1
    assert [e.data for e in await store.read_log(room)] == [1]
    again = await commit(store, room, increment, 1, keys=["counter"], command_id="cmd-1")
    assert again.replayed and again.result == 1


async def test_lost_response_without_command_id_is_reported(store: Store, room: str) -> None:
    async def lose(n: int, result: TransactResult) -> None:
        raise StoreUnavailable("connection reset after commit")

    with pytest.raises(StoreUnavailable):
        await commit(Interposed(store, after=lose), room, increment, 1, keys=["counter"])


async def test_concurrent_senders_of_one_command_apply_it_once(backend: Backend, room: str) -> None:
    stores = [await backend.open() for _ in range(8)]
    barrier = asyncio.Barrier(8)

    async def send(s: Store) -> object:
        await barrier.wait()
        r = await commit(s, room, increment, 7, keys=["counter"], command_id="once", options=QUICK)
        return r.result

    outcomes = await asyncio.gather(*(send(s) for s in stores))
    assert outcomes == [7] * 8
    assert (await stores[0].read(room, ["counter"])).value("counter") == 7
    assert [e.data for e in await stores[0].read_log(room)] == [7]
    for s in set(stores):
        await s.close()


@pytest.mark.slow
async def test_committers_in_separate_processes(backend: Backend, room: str) -> None:
    """Three processes of four writers commit increments of one counter: local turns
    order the writers of a process, the store the processes. Every commit saw a
    distinct state and the log holds them in that order; one command sent by all twelve
    writers applied once, and all twelve got its outcome."""
    if not backend.shared_across_processes:
        pytest.skip("memory:// is private to one process (covered in-process above)")
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tests.conformance import workers

    procs, writers, count = 3, 4, 10
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(procs, mp_context=spawn) as pool:
        done = await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, workers.commit_increments, backend.url, room, p, writers, count
                )
                for p in range(procs)
            )
        )
    total = procs * writers * count + 1  # every writer's own commits, and "shared" once
    shared = {n for _, outcomes in done for n in outcomes}
    assert len(shared) == 1, f"the shared command's deliveries disagree: {shared}"
    own = sorted(n for values, _ in done for n in values)
    assert sorted([*own, *shared]) == list(range(1, total + 1))
    store = await backend.open()
    assert (await store.read(room, ["counter"])).value("counter") == total
    log = await store.read_log(room, 0, 1000)
    assert [e.data["n"] for e in log] == list(range(1, total + 1))
    await store.close()


async def test_same_id_with_another_payload_is_rejected(store: Store, room: str) -> None:
    await commit(store, room, increment, 1, keys=["counter"], command_id="c")
    with pytest.raises(IdempotencyMismatch):
        await commit(store, room, increment, 2, keys=["counter"], command_id="c")
    assert (await store.read(room, ["counter"])).value("counter") == 1


async def test_outcome_record_expires_after_retention(store: Store, room: str) -> None:
    await commit(
        store,
        room,
        increment,
        1,
        keys=["counter"],
        command_id="short",
        options=CommitOptions(retention=60),
    )
    page = await store.scan(room, COMMAND_PREFIX)
    assert [r.key for r in page.records] == [COMMAND_PREFIX + "short"]
    record = page.records[0]
    assert record.expires_at is not None
    assert 55 <= record.expires_at - page.now <= 61


# ---------------------------------------------------------------- conditional intents


async def test_conditional_intent_applies_only_while_predicates_hold(
    store: Store, room: str
) -> None:
    await store.transact(room, writes=[Put("task/tax", {"status": "done"})])
    intent = Intent(
        when=[Where("task/tax", "status", "==", "done")],
        writes=[Put("report", {"uri": "s3://tax.md"})],
    )
    await apply_intent(store, room, intent)
    assert (await store.read(room, ["report"])).value("report") == {"uri": "s3://tax.md"}


async def test_conditional_intent_decided_on_a_stale_read_cannot_commit(
    store: Store, room: str
) -> None:
    """The task is reopened after the intent read it and before it writes."""
    await store.transact(room, writes=[Put("task/tax", {"status": "done"})])

    async def reopen(n: int, compares: list[Compare]) -> None:
        if n == 1:
            await store.transact(room, writes=[Put("task/tax", {"status": "ready"})])

    intent = Intent([Where("task/tax", "status", "==", "done")], [Put("report", "stale")])
    with pytest.raises(InvalidTransition, match=r"task/tax\.status == 'done'"):
        await apply_intent(Interposed(store, before=reopen), room, intent, options=QUICK)
    assert (await store.read(room, ["report"])).get("report") is None


async def test_where_operators(store: Store, room: str) -> None:
    await store.transact(room, writes=[Put("t", {"n": 3, "tags": ["a"], "sub": {"x": 1}})])
    snap = await store.read(room, ["t", "missing"])
    view = View(snap, ["t", "missing"])
    holds = [
        (Where("t", "n", ">=", 3), True),
        (Where("t", "n", "<", 3), False),
        (Where("t", "sub.x", "==", 1), True),
        (Where("t", "sub.y", "absent"), True),
        (Where("t", "n", "in", [1, 2, 3]), True),
        (Where("t", "n", "==", "3"), False),
        (Where("t", "tags", "<", 5), False),  # incomparable types never hold
        (Where("missing"), False),
        (Where("missing", op="absent"), True),
    ]
    assert [(str(w), w.holds(view)) for w, _ in holds] == [(str(w), v) for w, v in holds]


async def test_metrics_count_conflicts_by_prefix(store: Store, room: str) -> None:
    metrics = Metrics(CollectorRegistry())

    async def interfere(n: int, compares: list[Compare]) -> None:
        if n == 1:
            await store.transact(room, writes=[Put("doc/a", n)])

    def write(view: View, _: None) -> Change:
        return Change(writes=[Put("doc/a", (view.get("doc/a") or 0) + 1)])

    await commit(
        Interposed(store, before=interfere),
        room,
        write,
        None,
        keys=["doc/a"],
        options=CommitOptions(policy=FAST, metrics=metrics),
    )
    snap = metrics.snapshot()
    assert snap["errors"]["conflict"] == 1
    assert snap["conflicts_by_prefix"] == {"doc/": 1}
    assert snap["attempts_max"] == 2
    assert metrics.registry.get_sample_value("agentrooms_errors_total", {"kind": "conflict"}) == 1.0
