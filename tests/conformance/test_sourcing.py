"""Event-sourced aggregates and projections on every backend."""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from agentrooms.errors import (
    BadRequest,
    CursorCompacted,
    IdempotencyMismatch,
    InvalidTransition,
    VersionConflict,
)
from agentrooms.metrics import Metrics
from agentrooms.sourcing import (
    Aggregate,
    Aggregates,
    DomainEvent,
    Phase,
    Projection,
    ProjectionMigration,
    Projector,
    ReadModel,
    migrate_projection,
)
from agentrooms.sourcing import keys as skeys
from agentrooms.store import Append, Put, Store
from tests.conformance import sourcing_workers as w
from tests.conformance.sourcing_workers import interleaved
from tests.conftest import Backend
from tests.helpers import Interposed


def _pool(n: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))


def priority(level: int, reason: str) -> DomainEvent:
    return DomainEvent.of("TaskPriorityChanged/v3", {"priority": level, "reason": reason})


async def seed_task(tasks: Aggregates[Any], task_id: str, notes: int) -> None:
    await tasks.append(task_id, [w.created(f"task {task_id}")])
    for i in range(notes):
        events = [w.noted(i)] if i % 3 else [w.noted(i), priority(1 + i % 3, f"r{i}")]
        await tasks.append(task_id, events)


# ---------------------------------------------------------------------- aggregates


async def test_append_and_load(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    first = await tasks.append("t1", [w.created("write docs")])
    assert (first.version, first.first, first.count) == (1, 1, 1)
    second = await tasks.append("t1", [priority(3, "urgent"), w.noted("a")], expected_version=1)
    assert (second.version, second.first, second.count) == (3, 2, 2)
    assert second.state == {
        "title": "write docs",
        "priority": 3,
        "reason": "urgent",
        "notes": ["a"],
        "events": 3,
    }
    loaded = await tasks.load("t1")
    assert (loaded.version, loaded.state) == (3, second.state)
    assert [r.n for r in await tasks.history("t1")] == [1, 2, 3]
    empty = await tasks.load("nobody")
    assert (empty.version, empty.state) == (0, {})


async def test_an_append_does_not_replay_the_stream(store: Store, room: str) -> None:
    """After its own append an Aggregates appends again with one write and no read
    while nobody else appends; after another process appended, its write fails its
    compare, and it folds what the other appended from one read."""
    counting = Interposed(store)
    tasks = Aggregates(counting, room, w.TASK)
    await seed_task(tasks, "t1", 40)

    def spent(before: tuple[int, int, int]) -> tuple[int, int, int]:
        now = counting.calls, counting.reads, counting.scans
        return now[0] - before[0], now[1] - before[1], now[2] - before[2]

    before = counting.calls, counting.reads, counting.scans
    done = await tasks.append("t1", [w.noted("x")])
    assert spent(before) == (1, 0, 0)
    other = Aggregates(store, room, w.TASK)  # another process
    await other.append("t1", [w.noted("y"), priority(2, "theirs")])
    before = counting.calls, counting.reads, counting.scans
    after = await tasks.append("t1", [w.noted("z")])
    # the guess's write failed; a read, and one more for the two events the other
    # appended (read together, so their versions are compared too); the write
    assert spent(before) == (2, 2, 0)
    assert after.version == done.version + 3
    assert after.state == (await tasks.load("t1", snapshots=False)).state
    assert after.state["notes"][-3:] == ["x", "y", "z"]

    await other.append("t1", [w.noted("w")])
    # expecting another version than it remembers: it reads (and the event it missed),
    # it does not guess
    before = counting.calls, counting.reads, counting.scans
    last = await tasks.append("t1", [w.noted("v")], expected_version=after.version + 1)
    assert spent(before) == (1, 2, 0)
    assert last.state is not None and last.state["notes"][-2:] == ["w", "v"]
    # expecting the version it remembers after someone appended: a conflict, no write
    await other.append("t1", [w.noted("u")])
    with pytest.raises(VersionConflict):
        await tasks.append("t1", [w.noted("late")], expected_version=last.version)
    loaded = await tasks.load("t1", snapshots=False)
    assert loaded.version == last.version + 1 and loaded.state["notes"][-1] == "u"


async def test_what_an_aggregates_remembers_is_not_the_callers_nor_a_deleted_rooms(
    store: Store, room: str
) -> None:
    tasks = Aggregates(store, room, w.TASK)
    first = await tasks.append("t1", [w.created("one"), w.noted("a")])
    assert first.state is not None
    first.state["notes"].append("changed by the caller")
    second = await tasks.append("t1", [w.noted("b")])
    assert second.state is not None and second.state["notes"] == ["a", "b"]
    await store.delete_room(room)
    other = Aggregates(store, room, w.TASK)
    await other.append("t1", [w.created("two"), w.noted("c"), w.noted("d"), w.noted("e")])
    third = await tasks.append("t1", [w.noted("f")], expected_version=4)
    assert third.state == (await other.load("t1", snapshots=False)).state
    assert third.state is not None and third.state["notes"] == ["c", "d", "e", "f"]


async def test_events_go_to_the_room_log_too(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    await store.transact(room, appends=[Append("room.note", "not a domain event")])
    done = await tasks.append("t1", [w.created("x"), w.noted("n")])
    assert done.seqs == [2, 3]
    log = await store.read_log(room, 1)
    assert [e.type for e in log] == ["TaskCreated/v1", "TaskNoted/v1"]
    assert log[1].data == {"aggregate": "task", "id": "t1", "n": 2, "data": "n"}


async def test_expected_version_conflicts_and_changes_nothing(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    await tasks.append("t1", [w.created("x")])
    await tasks.append("t1", [w.noted(1)], expected_version=1)
    with pytest.raises(VersionConflict) as info:
        await tasks.append("t1", [w.noted("stale")], expected_version=1)
    assert skeys.head("task", "t1") in info.value.conflicts
    assert (await tasks.load("t1")).version == 2
    assert await store.last_seq(room) == 2


async def test_execute_recomputes_from_the_new_state(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    await tasks.append("t1", [w.created("x")])

    def assign(state: dict[str, Any], agent: str) -> list[DomainEvent]:
        if state.get("assignee"):
            raise InvalidTransition(f"already assigned to {state['assignee']}")
        return [DomainEvent.of("TaskAssigned/v1", {"agent": agent})]

    done = await tasks.execute("t1", assign, "ada")
    assert done.state is not None and done.state["assignee"] == "ada"
    with pytest.raises(InvalidTransition, match="already assigned"):
        await tasks.execute("t1", assign, "bob")
    assert (await tasks.load("t1")).version == 2


async def test_command_id_applies_a_command_once(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    await tasks.append("t1", [w.created("x")])
    first = await tasks.append("t1", [w.noted("once")], command_id="note-1")
    again = await tasks.append("t1", [w.noted("once")], command_id="note-1")
    assert again.replayed and again.version == first.version == 2
    with pytest.raises(IdempotencyMismatch):
        await tasks.append("t1", [w.noted("other")], command_id="note-1")
    assert (await tasks.load("t1")).state["notes"] == ["once"]


async def test_bad_events_are_refused_and_change_nothing(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    await tasks.append("t1", [w.created("x")])
    bad: list[Any] = [
        [DomainEvent.of("TaskPriorityChanged/v1", {"priority": "high"})],  # old version
        [DomainEvent.of("Unknown/v1", {})],
        ["TaskNoted/v1"],
        [w.noted(float("nan"))],
    ]
    for events in bad:
        with pytest.raises(BadRequest):
            await tasks.append("t1", events)
    with pytest.raises(BadRequest):
        await tasks.append("no/slash", [w.noted(1)])
    with pytest.raises(BadRequest):
        await tasks.append("t1", [w.noted(1)], expected_version=-1)
    assert (await tasks.load("t1")).version == 1
    assert await store.last_seq(room) == 1


async def test_a_fold_that_rejects_an_event_stores_nothing(store: Store, room: str) -> None:
    def strict(state: int, event: DomainEvent) -> int:
        if event.data < 0:
            raise InvalidTransition("negative")
        return state + int(event.data)

    counter = Aggregates(store, room, Aggregate("counter", int, strict, {"Added": 1}))
    await counter.append("c", [DomainEvent.of("Added/v1", 2)])
    with pytest.raises(InvalidTransition):
        await counter.append("c", [DomainEvent.of("Added/v1", 1), DomainEvent.of("Added/v1", -1)])
    assert (await counter.load("c")).state == 2
    assert await store.last_seq(room) == 1


# ------------------------------------------------------------------ schema evolution


async def test_an_old_log_reads_through_upcasters(store: Store, room: str) -> None:
    old = Aggregates(store, room, w.TASK_V1)
    await old.append("t1", [w.created("legacy")])
    await old.append("t1", [DomainEvent.of("TaskPriorityChanged/v1", {"priority": "high"})])
    await old.append("t1", [w.noted("a"), w.noted("b")])  # old code snapshots at 2 and 4
    assert (await old.load("t1")).state["priority_word"] == "high"

    new = Aggregates(store, room, w.TASK)
    loaded = await new.load("t1")
    assert loaded.snapshot == 0  # the schema-1 snapshot is ignored: full replay
    assert loaded.state["priority"] == 3 and loaded.state["reason"] == "unknown"
    history = await new.history("t1")
    assert [str(r.event.type) for r in history][1] == "TaskPriorityChanged/v3"
    # new code continues the same stream with current events
    done = await new.append("t1", [priority(1, "calm")], expected_version=4)
    assert done.state is not None and done.state["priority"] == 1
    assert (await new.load("t1")).state == (await new.load("t1", snapshots=False)).state
    # and the old code refuses an event it cannot read instead of folding it wrongly
    with pytest.raises(InvalidTransition, match="newer"):
        await old.load("t1")


async def test_snapshots_bound_the_replay(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)  # snapshot every 5 events
    await seed_task(tasks, "t1", 12)  # 1 + 12 + 4 = 17 events
    loaded = await tasks.load("t1")
    full = await tasks.load("t1", snapshots=False)
    assert loaded.version == full.version == 17
    assert loaded.snapshot == 15 and full.snapshot == 0
    assert loaded.state == full.state
    assert await tasks.snapshot("t1") == 17
    assert (await tasks.load("t1")).snapshot == 17


async def test_aggregates_survive_log_trimming(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    await seed_task(tasks, "t1", 6)
    before = await tasks.load("t1", snapshots=False)
    await store.trim_log(room, await store.last_seq(room) + 1)
    assert (await tasks.load("t1", snapshots=False)).state == before.state


# ------------------------------------------------------------------------ concurrency


async def test_concurrent_appenders_never_interleave(backend: Backend, room: str) -> None:
    writers, count, size = 8, 6, 3
    stores = [await backend.open() for _ in range(writers)]
    await Aggregates(stores[0], room, w.TASK).append("t1", [w.created("hot")])
    metrics = Metrics(CollectorRegistry())

    async def writer(i: int, s: Store) -> list[int]:
        # yield between read and write, so writers interleave even on memory://
        tasks = Aggregates(interleaved(s), room, w.TASK, policy=w.POLICY, metrics=metrics)
        acked = []
        for j in range(count):
            batch = [w.noted({"w": i, "i": j, "k": k}) for k in range(size)]
            acked.append((await tasks.append("t1", batch)).first)
        return acked

    acked = await asyncio.gather(*(writer(i, s) for i, s in enumerate(stores)))
    await check_stream(stores[0], room, acked, writers, count, size)
    assert metrics.snapshot()["errors"]["conflict"] > 0  # appends did collide, and retried
    for s in set(stores):
        await s.close()


async def test_concurrent_expected_version_appends_one_wins(backend: Backend, room: str) -> None:
    stores = [await backend.open() for _ in range(6)]
    await Aggregates(stores[0], room, w.TASK).append("t1", [w.created("x")])
    barrier = asyncio.Barrier(len(stores))

    async def attempt(i: int, s: Store) -> bool:
        await barrier.wait()
        try:
            await Aggregates(s, room, w.TASK).append("t1", [w.noted(i)], expected_version=1)
        except VersionConflict:
            return False
        return True

    wins = await asyncio.gather(*(attempt(i, s) for i, s in enumerate(stores)))
    assert sum(wins) == 1
    assert (await Aggregates(stores[0], room, w.TASK).load("t1")).version == 2
    for s in set(stores):
        await s.close()


@pytest.mark.slow
async def test_appenders_in_separate_processes(backend: Backend, room: str) -> None:
    if not backend.shared_across_processes:
        pytest.skip("memory:// is private to one process; covered in-process above")
    writers, count, size = 4, 8, 3
    store = await backend.open()
    await Aggregates(store, room, w.TASK).append("t1", [w.created("hot")])
    loop = asyncio.get_running_loop()
    with _pool(writers) as pool:
        acked = await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, w.append_batches, backend.url, room, "t1", i, count, size
                )
                for i in range(writers)
            )
        )
    await check_stream(store, room, list(acked), writers, count, size)
    await store.close()


async def check_stream(
    store: Store, room: str, acked: list[list[int]], writers: int, count: int, size: int
) -> None:
    """Every acknowledged batch is in the stream exactly once, contiguous, in order."""
    history = await Aggregates(store, room, w.TASK).history("t1")
    assert [r.n for r in history] == list(range(1, 2 + writers * count * size))
    by_n = {r.n: r.event.data for r in history}
    notes = [by_n[n] for n in range(2, len(history) + 1)]
    assert len({(d["w"], d["i"], d["k"]) for d in notes}) == len(notes)  # nothing twice
    for i, firsts in enumerate(acked):
        assert len(firsts) == count and firsts == sorted(firsts)
        for j, first in enumerate(firsts):
            batch = [by_n[first + k] for k in range(size)]
            assert batch == [{"w": i, "i": j, "k": k} for k in range(size)]
    log = [e for e in await store.read_log(room, 0, 10_000) if e.type == "TaskNoted/v1"]
    assert [e.data["n"] for e in log] == list(range(2, len(history) + 1))


# ----------------------------------------------------- two processes, the same fold


@pytest.mark.slow
async def test_the_same_log_folds_to_the_same_state_in_two_processes(
    backend: Backend, room: str
) -> None:
    if not backend.shared_across_processes:
        pytest.skip("memory:// is private to one process")
    store = await backend.open()
    tasks = Aggregates(store, room, w.TASK)
    await Aggregates(store, room, w.TASK_V1).append(  # written by old code, read through upcasters
        "a", [w.created("old"), DomainEvent.of("TaskPriorityChanged/v1", {"priority": "low"})]
    )
    for t in ("a", "b"):
        await seed_task(tasks, t, 9)
    here = await tasks.load("a")
    mine = Projector(store, room, w.COUNTS_V1)
    await mine.catch_up()
    loop = asyncio.get_running_loop()
    with _pool(2) as pool:
        there = await loop.run_in_executor(pool, w.load_task, backend.url, room, "a")
        rows = await loop.run_in_executor(pool, w.project_counts, backend.url, room)
    version, snapshot, state, full = there
    assert (version, state) == (here.version, here.state)
    assert full == state and snapshot > 0
    assert rows == (await mine.rows(limit=1000))[0]
    assert rows["total"] == await store.last_seq(room)
    await store.close()


# ------------------------------------------------------------------------ projections


async def test_projection_folds_each_event_once(backend: Backend, room: str) -> None:
    stores = [await backend.open() for _ in range(4)]
    tasks = Aggregates(stores[0], room, w.TASK)
    for t in ("a", "b", "c"):
        await seed_task(tasks, t, 7)
    await stores[0].transact(room, appends=[Append("room.note", None)])  # skipped
    # four projectors catch up at once: every event is counted exactly once
    await asyncio.gather(
        *(Projector(s, room, w.COUNTS_V1, policy=w.POLICY).catch_up() for s in stores)
    )
    projector = Projector(stores[0], room, w.COUNTS_V1)
    rows, _ = await projector.rows()
    history = {t: await tasks.history(t) for t in ("a", "b", "c")}
    assert rows == {
        **{f"task:{t}": len(h) for t, h in history.items()},
        "total": sum(len(h) for h in history.values()),
    }
    status = await projector.status()
    assert status.position == status.head and status.lag == 0
    assert await ReadModel(stores[0], room, "tasks").get("total") == rows["total"]
    for s in set(stores):
        await s.close()


async def test_rebuild_replays_from_the_start(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    await seed_task(tasks, "a", 5)
    projector = Projector(store, room, w.COUNTS_V1)
    await projector.catch_up()
    before = await projector.rows()
    await store.transact(room, writes=[Put(skeys.row("tasks", 1, "junk"), 1)])
    assert await projector.rebuild() == await store.last_seq(room)
    assert await projector.rows() == before


async def test_rebuild_of_a_trimmed_log_raises_and_changes_nothing(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    await seed_task(tasks, "a", 5)
    projector = Projector(store, room, w.COUNTS_V1)
    await projector.catch_up()
    before = await projector.rows()
    await store.trim_log(room, 3)
    with pytest.raises(CursorCompacted):
        await projector.rebuild()
    assert await projector.rows() == before
    late = Projector(store, room, Projection("late", w.count_events))
    with pytest.raises(CursorCompacted):
        await late.catch_up()


async def test_projection_reads_old_events_through_upcasters(store: Store, room: str) -> None:
    old = Aggregates(store, room, w.TASK_V1)
    await old.append("a", [w.created("a")])
    await old.append("a", [DomainEvent.of("TaskPriorityChanged/v1", {"priority": "low"})])
    new = Aggregates(store, room, w.TASK)
    await new.append("b", [w.created("b"), priority(3, "now")])
    projector = Projector(store, room, w.PRIORITIES_V2)
    await projector.catch_up()
    assert (await projector.rows())[0] == {"level:1": ["a"], "level:3": ["b"]}


# -------------------------------------------------------------------------- migration


async def test_expand_migrate_contract(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    await seed_task(tasks, "a", 4)
    old = Projector(store, room, w.COUNTS_V1)
    await old.catch_up()
    reader = ReadModel(store, room, "tasks")
    assert await reader.version() == 1
    migration = ProjectionMigration(store, room, w.COUNTS_V1, w.PRIORITIES_V2)

    with pytest.raises(InvalidTransition, match="not started"):
        await migration.contract()
    expanded = await migration.expand()
    assert expanded.phase == Phase.EXPANDING and expanded.active == 1
    assert await reader.get("total") is not None  # readers still on v1
    await seed_task(tasks, "b", 4)  # events keep arriving during the migration

    migrated = await migration.migrate()
    assert migrated.phase == Phase.MIGRATED and migrated.active == 2
    assert migrated.new_position >= migrated.old_position
    assert await reader.get("total") is None
    levels = (await reader.rows("level:"))[0]
    assert sorted(task for members in levels.values() for task in members) == ["a", "b"]
    assert (await migration.migrate()).phase == Phase.MIGRATED  # idempotent

    contracted = await migration.contract()
    assert contracted.phase == Phase.CONTRACTED
    assert (await old.rows())[0] == {}
    with pytest.raises(InvalidTransition, match="retired"):
        await old.catch_up()  # an old process still running v1 stops
    again = await migrate_projection(store, room, w.COUNTS_V1, w.PRIORITIES_V2)
    assert again.phase == Phase.CONTRACTED


async def test_rollback_points_readers_back(store: Store, room: str) -> None:
    tasks = Aggregates(store, room, w.TASK)
    await seed_task(tasks, "a", 3)
    await Projector(store, room, w.COUNTS_V1).catch_up()
    migration = ProjectionMigration(store, room, w.COUNTS_V1, w.PRIORITIES_V2)
    await migration.expand()
    await migration.migrate()
    rolled = await migration.rollback()
    assert rolled.phase == Phase.ROLLED_BACK and rolled.active == 1
    assert await ReadModel(store, room, "tasks").get("total") == await store.last_seq(room)
    assert (await Projector(store, room, w.PRIORITIES_V2).rows())[0] == {}
    with pytest.raises(InvalidTransition, match="rolled back"):
        await migration.contract()
    with pytest.raises(InvalidTransition):
        await migration.expand()


async def test_migrate_projection_by_reference(store: Store, room: str) -> None:
    await seed_task(Aggregates(store, room, w.TASK), "a", 2)
    module = "tests.conformance.sourcing_workers"
    status = await migrate_projection(
        store, room, f"{module}:COUNTS_V1", f"{module}:PRIORITIES_V2", step="expand"
    )
    assert status.phase == Phase.EXPANDING
    status = await migrate_projection(store, room, f"{module}:COUNTS_V1", f"{module}:PRIORITIES_V2")
    assert status.phase == Phase.CONTRACTED and status.active == 2
    for bad in ("nope", f"{module}:missing", f"{module}:TASK"):
        with pytest.raises(BadRequest):
            await migrate_projection(store, room, bad, w.PRIORITIES_V2)


async def test_a_second_migration_waits_for_the_first(store: Store, room: str) -> None:
    await seed_task(Aggregates(store, room, w.TASK), "a", 2)
    await ProjectionMigration(store, room, w.COUNTS_V1, w.PRIORITIES_V2).expand()
    v3 = Projection("tasks", w.count_events, version=3)
    with pytest.raises(InvalidTransition, match="v1 -> v2 is expanding"):
        await ProjectionMigration(store, room, w.PRIORITIES_V2, v3).expand()


# --------------------------------------------------------------- property: snapshots

event_lists = st.lists(
    st.one_of(
        st.builds(w.noted, st.integers(-5, 5)),
        st.builds(priority, st.integers(1, 3), st.sampled_from(["a", "b"])),
        st.builds(
            lambda a: DomainEvent.of("TaskAssigned/v1", {"agent": a}), st.text("ab", max_size=2)
        ),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(events=event_lists, every=st.integers(1, 6), cuts=st.lists(st.integers(1, 4), max_size=25))
def test_snapshot_plus_tail_equals_full_replay(
    backend: Backend, events: list[DomainEvent], every: int, cuts: list[int]
) -> None:
    async def run() -> None:
        store = await backend.open()
        room = f"prop-{uuid.uuid4().hex[:10]}"
        try:
            agg = Aggregate("task", dict, w.fold_task, w.TASK.events, snapshot_every=every)
            tasks = Aggregates(store, room, agg)
            await tasks.append("t", [w.created("p")])
            rest, sizes = list(events), iter(cuts)
            expected_snapshot = 1 if every == 1 else 0
            while rest:
                size = next(sizes, 1)
                done = await tasks.append("t", rest[:size])
                if done.version // every > (done.first - 1) // every:
                    expected_snapshot = done.version
                assert done.snapshot == (expected_snapshot == done.version)
                rest = rest[size:]
            loaded = await tasks.load("t")
            full = await tasks.load("t", snapshots=False)
            assert loaded.version == full.version == len(events) + 1
            assert loaded.snapshot == expected_snapshot and full.snapshot == 0
            assert loaded.state == full.state == agg.replay([w.created("p"), *events])
        finally:
            await store.close()

    asyncio.run(run())
