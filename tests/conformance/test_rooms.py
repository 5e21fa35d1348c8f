"""Rooms, the plan with leases and fencing, locks, events with cursors, presence —
every backend (issue: rooms)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable

import pytest

from agentrooms.errors import (
    BadRequest,
    CursorCompacted,
    IdempotencyMismatch,
    InvalidTransition,
    LeaseHeld,
    LockHeld,
    NotFound,
    PayloadTooLarge,
    StaleFence,
    StoreUnavailable,
    VersionConflict,
)
from agentrooms.rooms import Lock, Locks, Room, Rooms, TaskSpec
from agentrooms.store import Delete, Event, Put, Snapshot, Store
from agentrooms.store.wrap import Forwarding
from tests.conftest import Backend
from tests.helpers import Interposed, in_line


@pytest.fixture
async def room(store: Store) -> Room:
    return await Rooms(store).create(f"r-{uuid.uuid4().hex[:10]}", "test room")


async def state_digest(store: Store, room: Room) -> tuple[object, ...]:
    page = await store.scan(room.name, limit=10_000)
    records = [(r.key, r.version) for r in page.records]
    return (records, await store.last_seq(room.name), await store.set_size(room.name, "ready"))


# ----------------------------------------------------------------------------- rooms


async def test_rooms_lifecycle(store: Store) -> None:
    rooms = Rooms(store)
    name = f"life-{uuid.uuid4().hex[:8]}"
    room = await rooms.create(name, "a room", {"team": "legal"})
    info = await rooms.describe(name)
    assert (info.name, info.description, info.metadata, info.archived) == (
        name,
        "a room",
        {"team": "legal"},
        False,
    )
    with pytest.raises(VersionConflict, match="already exists"):
        await rooms.create(name)
    assert name in [r.name for r in await rooms.list()]
    await room.plan.add([TaskSpec("t1")])
    archived = await rooms.archive(name)
    assert archived.archived
    assert name not in [r.name for r in await rooms.list()]
    assert name in [r.name for r in await rooms.list(include_archived=True)]
    with pytest.raises(InvalidTransition, match="archived"):
        await room.plan.add([TaskSpec("t2")])
    with pytest.raises(InvalidTransition, match="archived"):
        await room.events.post("note")
    assert [t.id for t in await room.plan.tasks()] == ["t1"]  # still readable
    await rooms.delete(name)
    with pytest.raises(NotFound):
        await rooms.describe(name)
    with pytest.raises(NotFound):
        await rooms.delete(name)
    assert name not in [r.name for r in await rooms.list(include_archived=True)]


async def test_unknown_room_is_not_found_and_nothing_is_written(store: Store) -> None:
    ghost = Rooms(store).room(f"ghost-{uuid.uuid4().hex[:8]}")
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: ghost.plan.add([TaskSpec("a")]),
        lambda: ghost.plan.claim_next("agent"),
        ghost.plan.tasks,
        lambda: ghost.events.post("x"),
        lambda: ghost.events.read_new("agent"),
        lambda: ghost.presence.heartbeat("agent"),
        ghost.presence.who_is_online,
        lambda: ghost.locks.try_acquire("plan", "agent"),
        ghost.describe,
    ]
    for call in calls:
        with pytest.raises(NotFound):
            await call()
    assert (await store.scan(ghost.name)).records == []
    assert await store.last_seq(ghost.name) == 0


async def test_rooms_are_isolated(store: Store) -> None:
    rooms = Rooms(store)
    a = await rooms.create(f"iso-a-{uuid.uuid4().hex[:8]}")
    b = await rooms.create(f"iso-b-{uuid.uuid4().hex[:8]}")
    await a.plan.add([TaskSpec("t")])
    await a.events.post("only-in-a")
    await a.locks.try_acquire("plan", "x")
    await a.presence.heartbeat("x")
    assert await b.plan.tasks() == []
    assert await b.plan.claim_next("y") is None
    assert [e.type for e in await b.events.read_new("y")] == ["room.created"]
    assert await b.presence.who_is_online() == []
    assert (await b.locks.try_acquire("plan", "y")).fence == 1


@pytest.mark.parametrize("bad", ["", "has space", "-leading", "x" * 200, "a/b", "é"])
async def test_bad_room_names(store: Store, bad: str) -> None:
    with pytest.raises(BadRequest):
        await Rooms(store).create(bad)


# ------------------------------------------------------------------------------ plan


async def test_add_claim_complete_and_dependents(room: Room) -> None:
    plan = room.plan
    ready = await plan.add(
        [
            TaskSpec("fetch", "fetch the contract"),
            TaskSpec("tax", deps=["fetch"]),
            TaskSpec("risk", deps=["fetch"]),
            TaskSpec("report", deps=["tax", "risk"], payload={"fmt": "md"}),
        ]
    )
    assert ready == ["fetch"]
    assert {t.id: t.status for t in await plan.tasks()} == {
        "fetch": "ready",
        "tax": "pending",
        "risk": "pending",
        "report": "pending",
    }
    lease = await plan.claim_next("agent-a", ttl=30)
    assert lease is not None and lease.task_id == "fetch" and lease.fence == 1
    assert await plan.claim_next("agent-b") is None  # nothing else is ready
    done = await plan.complete(lease, {"uri": "s3://contract"})
    assert done.status == "done" and done.result == {"uri": "s3://contract"}
    assert {t.id for t in await plan.tasks("ready")} == {"tax", "risk"}
    leases = [await plan.claim_next(a) for a in ("a", "b")]
    assert sorted(le.task_id for le in leases if le) == ["risk", "tax"]
    for le in leases:
        assert le is not None
        await plan.complete(le, le.task_id)
    report = await plan.get("report")
    assert report.status == "ready" and report.waiting_on == []
    types = [e.type for e in await room.events.read(0, 100)]
    assert types.count("lease.granted") == 3 and types.count("task.completed") == 3
    assert "task.ready" in types


async def test_adding_validates_the_graph_and_adds_nothing_on_error(
    store: Store, room: Room
) -> None:
    await room.plan.add([TaskSpec("a")])
    before = await state_digest(store, room)
    with pytest.raises(BadRequest, match=r"cycle: x -> y -> z -> x|cycle: y -> z -> x -> y"):
        await room.plan.add(
            [TaskSpec("x", deps=["y"]), TaskSpec("y", deps=["z"]), TaskSpec("z", deps=["x"])]
        )
    with pytest.raises(BadRequest, match="cycle"):
        await room.plan.add([TaskSpec("self", deps=["self"])])
    with pytest.raises(BadRequest, match=r"b -> missing"):
        await room.plan.add([TaskSpec("b", deps=["a", "missing"])])
    with pytest.raises(InvalidTransition, match="already exists"):
        await room.plan.add([TaskSpec("c"), TaskSpec("a")])
    with pytest.raises(BadRequest, match="twice"):
        await room.plan.add([TaskSpec("d"), TaskSpec("d")])
    with pytest.raises(BadRequest):
        await room.plan.add([TaskSpec("bad id")])
    with pytest.raises(PayloadTooLarge):
        await room.plan.add([TaskSpec("big", payload="x" * (5 * 1024 * 1024))])
    assert await state_digest(store, room) == before


async def test_bad_plan_calls_are_typed_and_change_nothing(store: Store, room: Room) -> None:
    await room.plan.add([TaskSpec("a")])
    before = await state_digest(store, room)
    with pytest.raises(NotFound):
        await room.plan.get("nope")
    with pytest.raises(NotFound):
        await room.plan.claim("nope", "agent")
    with pytest.raises(NotFound):
        await room.plan.cancel("nope")
    for ttl in (-1, 0, float("nan"), 10**9):
        with pytest.raises(BadRequest):
            await room.plan.claim_next("agent", ttl=ttl)
        with pytest.raises(BadRequest):
            await room.locks.try_acquire("l", "agent", ttl=ttl)
        with pytest.raises(BadRequest):
            await room.presence.heartbeat("agent", ttl=ttl)
    assert await state_digest(store, room) == before


async def test_fail_retries_until_the_attempt_limit(room: Room) -> None:
    await room.plan.add([TaskSpec("flaky", max_attempts=2)])
    first = await room.plan.claim_next("a")
    assert first is not None
    after = await room.plan.fail(first, "boom")
    assert after.status == "ready" and after.attempts == 1
    second = await room.plan.claim_next("b")
    assert second is not None and second.fence == 2
    final = await room.plan.fail(second, "boom again")
    assert final.status == "failed" and final.error == "boom again"
    assert await room.plan.claim_next("c") is None


async def test_named_claim_and_lease_held(room: Room) -> None:
    await room.plan.add([TaskSpec("t")])
    lease = await room.plan.claim("t", "a")
    with pytest.raises(LeaseHeld) as info:
        await room.plan.claim("t", "b")
    assert info.value.holder == "a"
    await room.plan.complete(lease)
    with pytest.raises(InvalidTransition):
        await room.plan.claim("t", "b")


async def test_expired_lease_is_reclaimed_and_the_late_holder_is_fenced(room: Room) -> None:
    await room.plan.add([TaskSpec("t")])
    old = await room.plan.claim_next("slow", ttl=0.3)
    assert old is not None
    assert await room.plan.claim_next("fast") is None  # still held
    await asyncio.sleep(0.5)
    new = await room.plan.claim_next("fast", ttl=30)
    assert new is not None and new.task_id == "t" and new.fence == old.fence + 1
    await room.plan.complete(new, "fast's result")
    with pytest.raises(StaleFence):
        await room.plan.complete(old, "slow's late result")
    with pytest.raises(StaleFence):
        await room.plan.renew(old)
    task = await room.plan.get("t")
    assert task.result == "fast's result" and task.owner == "fast"
    types = [e.type for e in await room.events.read(0, 100)]
    for kind in ("lease.granted", "lease.expired", "lease.reclaimed", "lease.lost"):
        assert kind in types


async def test_claim_by_id_after_the_last_attempt_expired_is_invalid_transition(
    room: Room,
) -> None:
    """A named claim of a task whose lease ran out on its last attempt fails the task
    (as claim_next would) and raises InvalidTransition, also on a retried command."""
    await room.plan.add([TaskSpec("t", max_attempts=1), TaskSpec("u", max_attempts=1)])
    await room.plan.claim("t", "a", ttl=0.2)
    await room.plan.claim("u", "a", ttl=0.2)
    await asyncio.sleep(0.4)
    with pytest.raises(InvalidTransition, match="expired on the last attempt"):
        await room.plan.claim("t", "b")
    task = await room.plan.get("t")
    assert (task.status, task.owner, task.attempts) == ("failed", None, 1)
    with pytest.raises(InvalidTransition, match="is failed, not ready"):
        await room.plan.claim("t", "b")
    for _ in range(2):  # the first delivery and its retry
        with pytest.raises(InvalidTransition, match="expired on the last attempt"):
            await room.plan.claim("u", "b", command_id="claim-u")
    assert (await room.plan.get("u")).status == "failed"
    failed = [e.data for e in await room.events.read(0, 100) if e.type == "task.failed"]
    assert failed == [{"task": "t", "terminal": True}, {"task": "u", "terminal": True}]


async def test_any_write_can_be_fenced_by_a_lease(store: Store, room: Room) -> None:
    await room.plan.add([TaskSpec("t")])
    old = await room.plan.claim("t", "a", ttl=0.2)
    await store.transact(room.name, [old.guard()], [Put("doc/out", "a, in time")])
    await asyncio.sleep(0.4)
    await room.plan.claim("t", "b")
    with pytest.raises(StaleFence):
        await store.transact(room.name, [old.guard()], [Put("doc/out", "a, late")])
    assert (await store.read(room.name, ["doc/out"])).value("doc/out") == "a, in time"


async def test_renew_and_keep_alive(room: Room) -> None:
    await room.plan.add([TaskSpec("long")])
    lease = await room.plan.claim("long", "a", ttl=0.6)
    renewed = await room.plan.renew(lease, 0.6)
    assert renewed.expires_at >= lease.expires_at
    async with room.plan.keep_alive(renewed, every=0.15) as keeper:
        await asyncio.sleep(1.2)  # twice the ttl: only the background renewals keep it
        assert keeper.lost is None
    assert await room.plan.claim_next("b") is None
    await room.plan.complete(keeper.lease, "done while kept alive")
    types = [e.type for e in await room.events.read(0, 100)]
    assert types.count("lease.renewed") >= 4


async def test_keep_alive_tells_the_agent_when_the_lease_is_lost(room: Room) -> None:
    await room.plan.add([TaskSpec("t")])
    lease = await room.plan.claim("t", "a", ttl=5)
    await room.plan.cancel("t", "plan changed")
    reached_the_end = False
    with pytest.raises(StaleFence):
        async with room.plan.keep_alive(lease, every=0.05) as keeper:
            await asyncio.sleep(5)
            reached_the_end = True
    assert not reached_the_end
    assert keeper.lost is not None and keeper.lost_event.is_set()


async def test_many_agents_claim_each_task_exactly_once(backend: Backend) -> None:
    store = await backend.open()
    rooms = Rooms(store)
    room = await rooms.create(f"crowd-{uuid.uuid4().hex[:8]}")
    await room.plan.add([TaskSpec(f"t{i:03}") for i in range(60)])
    handles = [await backend.open() for _ in range(8)]
    done_by: dict[str, list[str]] = {}

    async def agent(i: int, s: Store) -> None:
        plan = Rooms(s).room(room.name).plan
        while (lease := await plan.claim_next(f"agent-{i}")) is not None:
            done_by.setdefault(lease.task_id, []).append(f"agent-{i}")
            await plan.complete(lease, i)

    await asyncio.gather(*(agent(i, s) for i, s in enumerate(handles)))
    assert sorted(done_by) == [f"t{i:03}" for i in range(60)]
    assert all(len(agents) == 1 for agents in done_by.values())
    assert {t.status for t in await room.plan.tasks()} == {"done"}
    for s in {store, *handles}:
        await s.close()


# ----------------------------------------------------------------------------- locks


async def test_ten_agents_acquire_at_once_exactly_one_holds(backend: Backend) -> None:
    store = await backend.open()
    room = await Rooms(store).create(f"lock-{uuid.uuid4().hex[:8]}")
    handles = [await backend.open() for _ in range(10)]
    barrier = asyncio.Barrier(10)

    async def contender(i: int, s: Store) -> object:
        await barrier.wait()
        try:
            return await Rooms(s).room(room.name).locks.try_acquire("plan", f"agent-{i}", ttl=30)
        except LockHeld as exc:
            return exc

    outcomes = await asyncio.gather(*(contender(i, s) for i, s in enumerate(handles)))
    held = [o for o in outcomes if not isinstance(o, LockHeld)]
    assert len(held) == 1
    holder = await room.locks.holder("plan")
    assert holder is not None and holder.owner == held[0].owner  # type: ignore[attr-defined]
    assert all(o.holder == holder.owner for o in outcomes if isinstance(o, LockHeld))
    for s in {store, *handles}:
        await s.close()


async def test_held_lists_the_held_locks_by_name_not_the_expired(room: Room) -> None:
    assert await room.locks.held() == []
    b = await room.locks.try_acquire("b", "B", ttl=30)
    await room.locks.try_acquire("gone", "G", ttl=0.2)
    a = await room.locks.try_acquire("a", "A", ttl=30)
    await asyncio.sleep(0.4)
    held = await room.locks.held()
    assert [(i.name, i.owner, i.fence) for i in held] == [("a", "A", a.fence), ("b", "B", b.fence)]
    assert held == [await room.locks.holder("a"), await room.locks.holder("b")]
    await room.locks.release(a)
    assert [i.name for i in await room.locks.held()] == ["b"]


async def test_late_release_or_extend_does_not_touch_the_new_holders_lock(room: Room) -> None:
    a = await room.locks.try_acquire("plan", "A", ttl=0.2)
    await asyncio.sleep(0.4)
    b = await room.locks.try_acquire("plan", "B", ttl=30)
    assert b.fence == a.fence + 1
    assert await room.locks.release(a) is False
    with pytest.raises(StaleFence):
        await room.locks.extend(a, 30)
    holder = await room.locks.holder("plan")
    assert holder is not None and (holder.owner, holder.fence) == ("B", b.fence)
    assert await room.locks.release(b) is True
    assert await room.locks.holder("plan") is None
    c = await room.locks.try_acquire("plan", "C")
    assert c.fence == b.fence + 1  # tokens keep growing after release


async def test_only_the_grants_holder_releases_or_hands_on_the_lock(
    store: Store, room: Room
) -> None:
    """A release is checked by the grant's secret token, not by the fencing token it
    names: a grant of another room's lock of the same name (a larger fence), a made-up
    lock with the holder's public owner and fence, and a higher fence than the holder's
    all leave the holder's lock untouched, with or without writes, freeing or handing
    over; the real grant then releases it."""
    other = await Rooms(store).create("other-" + uuid.uuid4().hex[:8])
    for _ in range(3):  # the other room's lock of the same name is at a larger fence
        await other.locks.release(await other.locks.try_acquire("plan", "X", ttl=30))
    foreign = await other.locks.try_acquire("plan", "X", ttl=30)
    a = await room.locks.try_acquire("plan", "A", ttl=30)
    assert foreign.fence > a.fence
    forged = [
        dataclasses.replace(foreign, room=room.name),  # another room's grant, brought here
        dataclasses.replace(a, token=uuid.uuid4().hex),  # the holder's owner and fence
        dataclasses.replace(a, token=uuid.uuid4().hex, fence=a.fence + 100),
    ]
    waiter = asyncio.create_task(room.locks.wait_acquire("plan", "C", ttl=30, timeout=20))
    for attempt in range(2):  # freeing, then with C in line (a handoff)
        if attempt:
            while not (await room.store.scan(room.name, "lockq/")).records:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        for lock in forged:
            assert await room.locks.release(lock) is False
            with pytest.raises(StaleFence):
                await room.locks.release(lock, writes=[Put("report", {"by": "forger"})])
            with pytest.raises(StaleFence):
                await room.locks.extend(lock, 30)
            holder = await room.locks.holder("plan")
            assert holder is not None and (holder.owner, holder.fence) == ("A", a.fence)
    assert (await room.store.read(room.name, ["report"])).value("report") is None
    assert not waiter.done()
    assert await room.locks.release(a, writes=[Put("report", {"by": "A"})]) is True
    c = await asyncio.wait_for(waiter, 10)
    assert (c.owner, c.fence) == ("C", a.fence + 1)
    assert await room.locks.release(a) is False  # the old grant, once handed on
    assert await room.locks.release(dataclasses.replace(c, token=a.token)) is False
    holder = await room.locks.holder("plan")
    assert holder is not None and holder.owner == "C"
    assert await room.locks.release(c) is True
    assert await room.locks.holder("plan") is None
    assert not (await room.store.scan(room.name, "lockgrant/")).records  # none left behind
    assert await other.locks.release(foreign) is True


async def test_an_extended_grant_releases_after_its_first_ttl(room: Room) -> None:
    """An extend carries the grant's own record along: the grant still releases (and
    hands over) once the TTL it was first granted with has passed."""
    a = await room.locks.try_acquire("plan", "A", ttl=0.3)
    a = await room.locks.extend(a, 30)
    await asyncio.sleep(0.5)
    assert await room.locks.release(a, writes=[Put("report", {"by": "A"})]) is True
    assert (await room.store.read(room.name, ["report"])).value("report") == {"by": "A"}
    assert await room.locks.holder("plan") is None


async def test_release_commits_the_holders_last_writes_with_it(room: Room) -> None:
    """``release(lock, writes=...)``: the holder's last write and its release are one
    atomic write, fenced by the grant; a stale grant writes nothing and raises."""
    a = await room.locks.try_acquire("plan", "A", ttl=30)
    assert await room.locks.release(a, writes=[Put("report", {"by": "A"})]) is True
    assert (await room.store.read(room.name, ["report"])).value("report") == {"by": "A"}
    assert await room.locks.holder("plan") is None

    b = await room.locks.try_acquire("plan", "B", ttl=30)
    waiter = asyncio.create_task(room.locks.wait_acquire("plan", "C", ttl=30, timeout=20))
    while not (await room.store.scan(room.name, "lockq/")).records:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    assert await room.locks.release(b, writes=[Put("report", {"by": "B"}), Delete("gone")])
    c = await asyncio.wait_for(waiter, 10)  # handed over in the same write
    assert (c.owner, c.fence) == ("C", b.fence + 1)
    assert (await room.store.read(room.name, ["report"])).value("report") == {"by": "B"}

    with pytest.raises(StaleFence):  # B's grant is gone: its late write must not land
        await room.locks.release(b, writes=[Put("report", {"by": "late B"})])
    assert (await room.store.read(room.name, ["report"])).value("report") == {"by": "B"}
    holder = await room.locks.holder("plan")
    assert holder is not None and (holder.owner, holder.fence) == ("C", c.fence)
    assert await room.locks.release(b) is False  # without writes: False, as before
    assert await room.locks.release(c) is True


async def handed(task: asyncio.Task[Lock], owner: str, fence: int) -> Lock:
    """The grant ``task`` gets (within 10 s): ``owner``'s, with fencing token ``fence``."""
    lock = await asyncio.wait_for(task, 10)
    assert (lock.owner, lock.fence) == (owner, fence)
    return lock


async def test_requeue_passes_the_lock_on_and_gets_back_in_line(store: Store) -> None:
    """``requeue``: one write hands the lock to the head of the line, commits the
    holder's last writes, and puts the holder at the back of the line, where it is
    handed the lock again when its turn comes, under a new grant."""
    room = await Rooms(store).create(f"requeue-{uuid.uuid4().hex[:8]}")
    a = await room.locks.try_acquire("plan", "A", ttl=30)
    waiters = []
    for name in ("B", "C"):
        waiters.append(asyncio.create_task(room.locks.wait_acquire("plan", name, timeout=20)))
        await in_line(store, room.name, len(waiters))  # in line before the next one comes
    a_again = asyncio.create_task(
        room.locks.requeue(a, writes=[Put("report", {"by": "A"})], timeout=20)
    )
    b = await handed(waiters[0], "B", a.fence + 1)
    assert (await store.read(room.name, ["report"])).value("report") == {"by": "A"}
    await in_line(store, room.name, 2)  # C, then A
    assert not a_again.done()

    # B's grant came from the line: its requeue hands the lock to C and puts B in line
    # behind A (its round trips: ``python3 dev.py bench locks trips``)
    b_again = asyncio.create_task(room.locks.requeue(b, timeout=20))
    c = await handed(waiters[1], "C", a.fence + 2)
    await in_line(store, room.name, 2)  # A, then B

    assert await room.locks.release(c)
    a2 = await handed(a_again, "A", a.fence + 3)  # A's turn: it went in line before B
    assert a2.token != a.token
    assert not b_again.done()
    assert await room.locks.release(a2)
    b2 = await handed(b_again, "B", a.fence + 4)
    assert await room.locks.release(b2)
    assert await room.locks.holder("plan") is None
    assert (await store.scan(room.name, "lockq/")).records == []
    assert await room.locks.release(a) is False  # the first grant is long gone


async def test_requeue_with_nobody_in_line_takes_the_lock_again(store: Store) -> None:
    """Nobody waits: ``requeue`` releases and takes the lock again at once, under a new
    grant, as ``release`` then ``wait_acquire``."""
    room = await Rooms(store).create(f"requeue1-{uuid.uuid4().hex[:8]}")
    a = await room.locks.try_acquire("plan", "A", ttl=30)
    a2 = await room.locks.requeue(a, writes=[Put("report", 1)], timeout=5)
    assert (a2.owner, a2.fence) == ("A", a.fence + 1) and a2.token != a.token
    types = [e.type for e in await room.events.read(0, 100) if e.type.startswith("lock.")]
    assert types == ["lock.released"]  # freed, not handed to anyone
    assert (await store.read(room.name, ["report"])).value("report") == 1
    holder = await room.locks.holder("plan")
    assert holder is not None and (holder.owner, holder.fence) == ("A", a2.fence)
    with pytest.raises(StaleFence):
        await room.locks.extend(a)
    assert await room.locks.release(a) is False
    assert await room.locks.extend(a2)  # the new grant is the holder's

    # someone joins the line: the new grant's requeue hands the lock over, A waits
    waiter = asyncio.create_task(room.locks.wait_acquire("plan", "B", timeout=20))
    await in_line(store, room.name, 1)
    a_again = asyncio.create_task(room.locks.requeue(a2, timeout=20))
    b = await handed(waiter, "B", a2.fence + 1)
    assert await room.locks.release(b)
    a3 = await handed(a_again, "A", a2.fence + 2)
    assert await room.locks.release(a3)
    assert (await store.scan(room.name, "lockq/")).records == []


async def test_a_requeuer_alone_in_its_process_hands_over_then_subscribes(
    store: Store,
) -> None:
    """With no reader of the room's log running in its process (here: its handle has an
    identity of its own), ``requeue`` writes first and subscribes after, so the lock
    does not wait for the reader to start. What happens in between is not lost: here the
    new holder releases the lock back to it before it has subscribed, and it finds the
    lock its own by the one read it makes after subscribing."""
    handed: list[Lock] = []
    requeue_write = [0]  # the number of the requeue's write, once it is known

    async def give_back(n: int, result: object) -> None:
        if n == requeue_write[0]:  # the requeue's write has committed: B holds the lock
            b = await asyncio.wait_for(waiter_b, 10)
            handed.append(b)
            assert await other.locks.release(b)  # hands it back to A, who is not told

    mine = Interposed(store, after=give_back)
    room = await Rooms(mine).create(f"alone-{uuid.uuid4().hex[:8]}")
    other = Rooms(Interposed(store)).room(room.name)  # another identity: another reader
    b0 = await other.locks.try_acquire("plan", "B", ttl=30)
    a_waits = asyncio.create_task(room.locks.wait_acquire("plan", "A", ttl=30, timeout=20))
    await in_line(store, room.name, 1)
    assert await other.locks.release(b0)
    a = await asyncio.wait_for(a_waits, 10)  # from the line: requeue will hand over
    waiter_b = asyncio.create_task(other.locks.wait_acquire("plan", "B", ttl=30, timeout=20))
    await in_line(store, room.name, 1)
    requeue_write[0] = mine.calls + 1
    t0 = time.monotonic()
    a2 = await asyncio.wait_for(room.locks.requeue(a, timeout=20), 10)
    assert time.monotonic() - t0 < 5  # found by its read, not by its expiry look
    (b,) = handed
    assert (b.owner, b.fence) == ("B", a.fence + 1)
    assert (a2.owner, a2.fence) == ("A", a.fence + 2)
    assert await room.locks.release(a2)
    assert (await store.scan(room.name, "lockq/")).records == []


async def test_requeue_of_a_stale_grant(store: Store, room: Room) -> None:
    """A grant that expired and changed hands: with writes, ``requeue`` writes nothing,
    joins no line and raises ``StaleFence``; without, it queues like ``wait_acquire``."""
    a = await room.locks.try_acquire("plan", "A", ttl=0.2)
    await asyncio.sleep(0.3)
    b = await room.locks.try_acquire("plan", "B", ttl=30)
    with pytest.raises(StaleFence):
        await room.locks.requeue(a, writes=[Put("report", "late A")], timeout=5)
    assert (await store.read(room.name, ["report"])).get("report") is None
    assert (await store.scan(room.name, "lockq/")).records == []
    # queued again with a longer ttl than the stale grant's (the grant it gets in turn
    # has the ttl it queued with, and must still be held when it is released below)
    a_again = asyncio.create_task(room.locks.requeue(dataclasses.replace(a, ttl=30), timeout=20))
    await in_line(store, room.name, 1)
    assert await room.locks.release(b)
    a2 = await handed(a_again, "A", b.fence + 1)
    assert await room.locks.release(a2)


async def test_requeue_serves_agents_turn_by_turn(backend: Backend) -> None:
    """Agents that take one lock turn after turn by ``requeue`` (on several handles)
    hold it one at a time, in a fixed order (FIFO, each back at the end of the line),
    with one fencing token after another, and the counter they write with their
    requeues loses nothing."""
    store = await backend.open()
    room = await Rooms(store).create(f"turns-{uuid.uuid4().hex[:8]}")
    handles = [await backend.open() for _ in range(3)]
    n, rounds = 6, 4
    inside = 0
    held: list[tuple[str, int]] = []

    async def agent(i: int, lock: Lock | None = None) -> None:
        nonlocal inside
        s = handles[i % len(handles)]
        locks = Rooms(s).room(room.name).locks
        if lock is None:
            lock = await locks.wait_acquire("plan", f"a{i}", ttl=30, timeout=60)
        for turn in range(rounds):
            inside += 1
            assert inside == 1
            held.append((lock.owner, lock.fence))
            count = (await s.read(room.name, ["counter"])).value("counter", 0)
            await asyncio.sleep(0.002)
            inside -= 1
            bump = [Put("counter", count + 1)]
            if turn == rounds - 1:
                assert await locks.release(lock, writes=bump)
            else:
                lock = await locks.requeue(lock, writes=bump, timeout=60)

    first = await Rooms(handles[0]).room(room.name).locks.try_acquire("plan", "a0", ttl=30)
    agents = [asyncio.create_task(agent(i)) for i in range(1, n)]
    await in_line(store, room.name, n - 1)  # everyone in line before the first turn ends
    agents.append(asyncio.create_task(agent(0, first)))
    await asyncio.wait_for(asyncio.gather(*agents), 60)
    owners = [owner for owner, _ in held]
    assert owners == owners[:n] * rounds and len(set(owners)) == n
    assert [fence for _, fence in held] == list(range(first.fence, first.fence + n * rounds))
    assert (await store.read(room.name, ["counter"])).value("counter") == n * rounds
    for s in {store, *handles}:
        await s.close()


async def test_a_grant_comes_with_the_records_it_asked_for(store: Store) -> None:
    """``read=``: the grant comes with those records' values as of the grant. Those the
    previous holder wrote in the release that handed the lock over come in the handoff,
    unread; the rest are read once the lock is held; absent ones are left out."""
    counting = Interposed(store)
    room = await Rooms(counting).create(f"values-{uuid.uuid4().hex[:8]}")
    await store.transact(room.name, writes=[Put("report", {"v": 1}), Put("notes", "n1")])

    def reads_of(key: str) -> int:
        return sum(key in ks for ks in counting.read_keys)

    a = await room.locks.try_acquire("plan", "A", read=["report", "nothing"])
    assert a.values == {"report": {"v": 1}}  # taken free: read; an absent record left out
    b_waits = asyncio.create_task(
        room.locks.wait_acquire("plan", "B", timeout=20, read=["report", "notes"])
    )
    await in_line(store, room.name, 1)
    before = reads_of("report"), reads_of("notes")
    assert await room.locks.release(a, writes=[Put("report", {"v": 2}), Put("other", 1)])
    b = await handed(b_waits, "B", a.fence + 1)
    assert b.values == {"report": {"v": 2}, "notes": "n1"}
    # report came with the handoff; notes, which the release did not write, was read
    assert (reads_of("report"), reads_of("notes")) == (before[0], before[1] + 1)

    # nobody in line: B's requeue takes the lock back, free, and reads the report
    b2 = await asyncio.wait_for(room.locks.requeue(b, timeout=20, read=["report"]), 10)
    assert b2.values == {"report": {"v": 2}} and b2.fence == b.fence + 1
    c_waits = asyncio.create_task(room.locks.wait_acquire("plan", "C", timeout=20, read=["report"]))
    await in_line(store, room.name, 1)
    reported = reads_of("report")
    b_again = asyncio.create_task(
        room.locks.requeue(b2, writes=[Put("report", {"v": 3})], timeout=20, read=["report"])
    )
    c = await handed(c_waits, "C", b2.fence + 1)
    assert c.values == {"report": {"v": 3}}
    await in_line(store, room.name, 1)  # B, back in line (else it could take it free)
    assert await room.locks.release(c, writes=[Put("report", {"v": 4}), Delete("notes")])
    b3 = await handed(b_again, "B", c.fence + 1)  # B asked again with its requeue
    assert b3.values == {"report": {"v": 4}}
    assert reads_of("report") == reported  # both came with their handoffs
    d_waits = asyncio.create_task(
        room.locks.wait_acquire("plan", "D", timeout=20, read=["report", "notes"])
    )
    await in_line(store, room.name, 1)
    assert await room.locks.release(b3, writes=[Delete("report"), Put("notes", "n3", ttl=60)])
    d = await handed(d_waits, "D", b3.fence + 1)
    assert d.values == {"notes": "n3"}  # read: the release deleted one, put one to expire
    assert await room.locks.release(d)

    # the handoff event carries the values asked for (only those), in the room's log
    handoffs = [e for e in await room.events.read(0, 100) if e.type == "lock.handoff"]
    assert [e.data.get("handed") for e in handoffs] == [
        {"report": {"v": 2}},
        {"report": {"v": 3}},
        {"report": {"v": 4}},
        None,
    ]
    with pytest.raises(BadRequest):
        await room.locks.wait_acquire("plan", "E", read="report")
    with pytest.raises(BadRequest):
        await room.locks.try_acquire("plan", "E", read=[""])
    assert await room.locks.holder("plan") is None


async def test_handed_values_reach_a_waiter_through_the_log(store: Store) -> None:
    """A waiter on another handle (another reader of the log, as in another process)
    gets the values its handoff passed on from the log, decoded, with no read."""
    room = await Rooms(store).create(f"handlog-{uuid.uuid4().hex[:8]}")
    counting = Interposed(store)  # an identity of its own
    other = Rooms(counting).room(room.name)
    a = await room.locks.try_acquire("plan", "A")
    b_waits = asyncio.create_task(
        other.locks.wait_acquire("plan", "B", timeout=20, read=["report"])
    )
    await in_line(store, room.name, 1)
    assert await room.locks.release(a, writes=[Put("report", {"rows": [1, 2], "n": None})])
    b = await handed(b_waits, "B", a.fence + 1)
    assert b.values == {"report": {"rows": [1, 2], "n": None}}
    assert not any("report" in keys for keys in counting.read_keys)
    assert await other.locks.release(b)


async def test_a_grant_whose_read_fails_is_released(store: Store) -> None:
    """If reading the records a grant should come with fails, the caller gets the error
    and the lock is released, not left held by nobody who knows it."""

    class FailingReads(Forwarding):
        async def _read(self, room: str, keys: list[str]) -> Snapshot:
            if "report" in keys:
                raise StoreUnavailable("connection reset")
            return await self.inner._read(room, keys)

    room = await Rooms(FailingReads(store)).create(f"readfail-{uuid.uuid4().hex[:8]}")
    with pytest.raises(StoreUnavailable):
        await room.locks.try_acquire("plan", "A", read=["report"])
    assert await room.locks.holder("plan") is None
    b = await room.locks.try_acquire("plan", "B")  # free at once, not after a ttl
    assert b.owner == "B"
    assert await room.locks.release(b)


async def test_handed_values_belong_to_the_new_holder(room: Room) -> None:
    """The values a handoff passes on in this process are the new holder's own: the
    releaser changing its written value afterwards does not change them."""
    a = await room.locks.try_acquire("plan", "A")
    b_waits = asyncio.create_task(room.locks.wait_acquire("plan", "B", timeout=20, read=["report"]))
    await in_line(room.scope.store, room.name, 1)
    report = {"items": [1]}
    assert await room.locks.release(a, writes=[Put("report", report)])
    report["items"].append(2)
    b = await asyncio.wait_for(b_waits, 10)
    assert b.values == {"report": {"items": [1]}}
    assert await room.locks.release(b)


async def test_acquire_backs_off_then_gives_up(room: Room) -> None:
    await room.locks.try_acquire("plan", "A", ttl=30)
    t0 = time.monotonic()
    with pytest.raises(LockHeld):
        await room.locks.acquire("plan", "B", tries=3, step=0.05)
    assert time.monotonic() - t0 >= 0.05 + 0.10


async def test_acquire_waits_for_an_expiring_lock(room: Room) -> None:
    await room.locks.try_acquire("plan", "A", ttl=0.2)
    lock = await room.locks.acquire("plan", "B", tries=5, step=0.1)
    assert lock.owner == "B"


async def test_hold_releases_even_when_the_body_raises(room: Room) -> None:
    with pytest.raises(RuntimeError):
        async with room.locks.hold("plan", "A") as lock:
            assert (await room.locks.holder("plan")).owner == "A"  # type: ignore[union-attr]
            raise RuntimeError("body failed")
    assert lock.fence == 1
    assert await room.locks.holder("plan") is None


# ---------------------------------------------------------------------------- events


async def test_two_agents_each_receive_every_event_once(room: Room) -> None:
    received: dict[str, list[int]] = {"a": [], "b": []}

    async def reader(agent: str) -> None:
        for _ in range(40):
            received[agent] += [e.seq for e in await room.events.read_new(agent, limit=7)]
            await asyncio.sleep(0.005)

    async def writer() -> None:
        for i in range(60):
            await room.events.post("note", i)
            await asyncio.sleep(0.001)

    await asyncio.gather(reader("a"), reader("b"), writer())
    for agent in ("a", "b"):
        received[agent] += [e.seq for e in await room.events.read_new(agent, limit=1000)]
    head = await room.store.last_seq(room.name)
    assert received["a"] == received["b"] == list(range(1, head + 1))


async def test_five_hundred_events_between_two_reads(room: Room) -> None:
    first = await room.events.read_new("agent")
    start = first[-1].seq
    for i in range(500):
        await room.events.post("burst", i)
    got = []
    while batch := await room.events.read_new("agent", limit=128):
        got += batch
    assert [e.data for e in got] == list(range(500))
    assert [e.seq for e in got] == list(range(start + 1, start + 501))


async def test_one_agent_name_read_by_two_readers_never_duplicates(backend: Backend) -> None:
    store = await backend.open()
    room = await Rooms(store).create(f"dup-{uuid.uuid4().hex[:8]}")
    for i in range(100):
        await room.events.post("e", i)
    handles = [await backend.open() for _ in range(4)]

    async def reader(s: Store) -> list[int]:
        events = Rooms(s).room(room.name).events
        got: list[int] = []
        while batch := await events.read_new("shared-agent", limit=5):
            got += [e.seq for e in batch]
        return got

    results = await asyncio.gather(*(reader(s) for s in handles))
    everything = sorted(seq for r in results for seq in r)
    assert everything == list(range(1, 102))
    for s in {store, *handles}:
        await s.close()


async def test_explicit_ack_is_at_least_once(room: Room) -> None:
    await room.events.post("job", 1)
    await room.events.post("job", 2)
    first = await room.events.read_new("w", ack="explicit")
    again = await room.events.read_new("w", ack="explicit")  # crashed before acking
    assert [e.seq for e in first] == [e.seq for e in again] == [1, 2, 3]
    assert await room.events.ack("w", 2) == 2
    assert await room.events.ack("w", 1) == 2  # never backwards
    assert [e.seq for e in await room.events.read_new("w", ack="explicit")] == [3]
    with pytest.raises(BadRequest):
        await room.events.ack("w", 999)


async def test_subscribe_is_woken_by_new_events(room: Room) -> None:
    got: list[object] = []

    async def consume() -> None:
        async for event in room.events.subscribe("sub", wait=20):
            got.append(event.data)
            if len(got) == 4:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    for i in range(3):
        await room.events.post("push", i)
    await asyncio.wait_for(task, 10)
    assert got == [{"room": room.name}, 0, 1, 2]
    assert time.monotonic() - t0 < 5  # woken by the store, not by the 20 s wait


async def test_compacted_cursor_resyncs(store: Store, room: Room) -> None:
    for i in range(10):
        await room.events.post("e", i)
    await room.events.read_new("agent", limit=2)
    await store.trim_log(room.name, 8)
    with pytest.raises(CursorCompacted):
        await room.events.read_new("agent")
    head = await room.events.resync("agent")
    await room.events.post("after", "resync")
    assert [e.data for e in await room.events.read_new("agent")] == ["resync"]
    assert head == 11


# -------------------------------------------------------------------------- presence


async def test_presence_by_heartbeat_and_store_clock(room: Room) -> None:
    member = await room.presence.heartbeat("a", "working", {"task": "tax"}, ttl=0.4)
    await room.presence.heartbeat("b", ttl=30)
    online = await room.presence.who_is_online()
    assert [(m.agent, m.status) for m in online] == [("a", "working"), ("b", "online")]
    assert abs(online[0].last_seen - member.last_seen) < 0.01
    assert online[0].metadata == {"task": "tax"}
    await asyncio.sleep(0.6)
    assert [m.agent for m in await room.presence.who_is_online()] == ["b"]
    await room.presence.leave("b")
    assert await room.presence.who_is_online() == []


async def test_a_client_clock_an_hour_off_changes_nothing(
    room: Room, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Expiry is the store's judgement: skew the client's clocks and nothing moves."""
    await room.plan.add([TaskSpec("t")])
    await room.presence.heartbeat("a", ttl=30)
    lease = await room.plan.claim("t", "a", ttl=30)
    real_time, real_monotonic = time.time, time.monotonic
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)
    assert [m.agent for m in await room.presence.who_is_online()] == ["a"]
    assert await room.plan.claim_next("b") is None  # the lease has not "expired"
    renewed = await room.plan.renew(lease, 30)
    assert abs(renewed.expires_at - real_time() - 30) < 5
    monkeypatch.setattr(time, "time", lambda: real_time() - 3600)
    assert [m.agent for m in await room.presence.who_is_online()] == ["a"]
    assert real_monotonic() > 0


@pytest.mark.slow
async def test_paused_lease_holder_is_fenced_out(backend: Backend) -> None:
    """SIGSTOP the holder past its TTL; another agent claims and completes; the holder
    resumes and tries to complete: StaleFence, and the recorded result is the second's."""
    if not backend.shared_across_processes:
        pytest.skip("memory:// is private to one process (the in-process version is above)")
    import multiprocessing
    import os
    import signal

    from tests.conformance import workers

    store = await backend.open()
    room = await Rooms(store).create(f"pause-{uuid.uuid4().hex[:8]}")
    await room.plan.add([TaskSpec("t")])
    ctx = multiprocessing.get_context("spawn")
    claimed = ctx.Queue()
    holder = ctx.Process(
        target=workers.claim_pause_complete, args=(backend.url, room.name, 1.0, claimed)
    )
    holder.start()
    try:
        fence = await asyncio.to_thread(claimed.get, True, 60)
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGSTOP)
        await asyncio.sleep(1.5)
        lease = await room.plan.claim_next("second-agent", ttl=30)
        assert lease is not None and lease.fence == fence + 1
        await room.plan.complete(lease, "second agent's result")
        os.kill(holder.pid, signal.SIGCONT)
        await asyncio.to_thread(holder.join, 60)
        assert holder.exitcode == workers.STALE_FENCE_EXIT
    finally:
        if holder.is_alive():
            holder.kill()
    task = await room.plan.get("t")
    assert (task.status, task.result, task.owner) == (
        "done",
        "second agent's result",
        "second-agent",
    )
    await store.close()


# ------------------------------------------------------------------- queued locks


async def test_queued_waiters_are_served_in_order(room: Room) -> None:
    a = await room.locks.try_acquire("plan", "A", ttl=30)
    order: list[str] = []

    async def waiter(name: str) -> None:
        lock = await room.locks.wait_acquire("plan", name, ttl=30, timeout=20)
        order.append(name)
        await asyncio.sleep(0.05)
        assert await room.locks.release(lock)

    b = asyncio.create_task(waiter("B"))
    await asyncio.sleep(0.1)
    c = asyncio.create_task(waiter("C"))
    await asyncio.sleep(0.1)
    assert await room.locks.release(a)
    await asyncio.wait_for(asyncio.gather(b, c), 20)
    assert order == ["B", "C"]
    types = [e.type for e in await room.events.read(0, 100)]
    assert types.count("lock.handoff") == 2 and types.count("lock.released") == 1
    assert await room.locks.holder("plan") is None


async def test_queued_waiter_times_out_and_leaves_the_queue(store: Store, room: Room) -> None:
    await room.locks.try_acquire("plan", "A", ttl=30)
    t0 = time.monotonic()
    with pytest.raises(LockHeld):
        await room.locks.wait_acquire("plan", "B", timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < 5
    assert (await store.scan(room.name, "lockq/")).records == []


async def test_queued_waiter_takes_an_expired_lock(room: Room) -> None:
    await room.locks.try_acquire("plan", "dead-holder", ttl=0.3)
    t0 = time.monotonic()
    lock = await room.locks.wait_acquire("plan", "B", timeout=10)
    assert lock.owner == "B" and time.monotonic() - t0 < 5


async def test_queued_lock_mutual_exclusion_under_contention(backend: Backend) -> None:
    store = await backend.open()
    room = await Rooms(store).create(f"qlock-{uuid.uuid4().hex[:8]}")
    handles = [await backend.open() for _ in range(8)]
    inside = 0
    acquisitions: dict[str, int] = {}

    async def agent(i: int, s: Store) -> None:
        nonlocal inside
        locks = Rooms(s).room(room.name).locks
        for _ in range(3):
            async with locks.hold("plan", f"a{i}", ttl=30, queue_timeout=60) as lock:
                inside += 1
                assert inside == 1
                acquisitions[lock.owner] = acquisitions.get(lock.owner, 0) + 1
                await asyncio.sleep(0.005)
                inside -= 1

    await asyncio.wait_for(asyncio.gather(*(agent(i, s) for i, s in enumerate(handles))), 120)
    assert acquisitions == {f"a{i}": 3 for i in range(8)}
    for s in {store, *handles}:
        await s.close()


@pytest.mark.slow
@pytest.mark.parametrize("requeue", [False, True], ids=["release", "requeue"])
async def test_queued_lock_mutual_exclusion_across_processes(
    backend: Backend, requeue: bool
) -> None:
    """Agents in three processes queue for one lock: no two holds overlap in time, the
    fencing tokens grow with them, every agent gets its turns, and the counter written
    under the lock loses no increment. Handoffs between processes go through each
    process's reader of the log, not the in-process shortcut the test above exercises.
    With ``requeue``, each agent's write and its release go with its return to the
    line."""
    if not backend.shared_across_processes:
        pytest.skip("memory:// is private to one process (the in-process version is above)")
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tests.conformance import workers

    procs, agents, rounds = 3, 3, 4
    store = await backend.open()
    room = await Rooms(store).create(f"xlock-{uuid.uuid4().hex[:8]}")
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(procs, mp_context=spawn) as pool:
        done = await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool,
                    workers.contend_for_lock,
                    backend.url,
                    room.name,
                    p,
                    agents,
                    rounds,
                    0.01,
                    requeue,
                )
                for p in range(procs)
            )
        )
    held = sorted((h for batch in done for h in batch), key=lambda h: h[1])
    total = procs * agents * rounds
    assert len(held) == total and len({fence for _, fence, _, _ in held}) == total
    for (_, _, _, end), (owner, _, start, _) in itertools.pairwise(held):
        assert start >= end, f"{owner} held the lock before its predecessor let go"
    if requeue:  # FIFO, each agent back at the end of the line: nobody overtakes it twice
        assert_turn_by_turn([owner for owner, _, _, _ in held])
    owners = [owner for owner, _, _, _ in held]
    assert all(owners.count(f"p{p}a{i}") == rounds for p in range(procs) for i in range(agents))
    crossings = sum(a[:2] != b[:2] for a, b in itertools.pairwise(owners))
    assert crossings >= procs - 1  # the lock did pass between processes
    assert (await store.read(room.name, ["counter"])).value("counter") == total
    await store.close()


def assert_turn_by_turn(owners: list[str]) -> None:
    """Between two turns of one agent, no other agent had two."""
    last: dict[str, int] = {}
    for i, owner in enumerate(owners):
        between = owners[last[owner] + 1 : i] if owner in last else []
        assert len(between) == len(set(between)), (owner, between)
        last[owner] = i


@pytest.mark.slow
async def test_a_killed_holders_lock_passes_to_a_waiter_of_another_process(
    backend: Backend,
) -> None:
    """The holder's process is killed (no release, no event): a waiter queued in another
    process takes the lock once its TTL has run out, not before, with the next fence."""
    if not backend.shared_across_processes:
        pytest.skip("memory:// is private to one process (the in-process version is above)")
    import multiprocessing
    import os
    import signal

    from tests.conformance import workers

    ttl = 1.5
    store = await backend.open()
    room = await Rooms(store).create(f"killed-{uuid.uuid4().hex[:8]}")
    ctx = multiprocessing.get_context("spawn")
    taken = ctx.Queue()
    holder = ctx.Process(
        target=workers.take_lock_and_hang, args=(backend.url, room.name, ttl, taken)
    )
    holder.start()
    try:
        fence, granted_at = await asyncio.to_thread(taken.get, True, 60)
        waiting = asyncio.create_task(room.locks.wait_acquire("one", "survivor", timeout=30))
        await asyncio.sleep(0.2)  # in line before the holder dies
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        lock = await asyncio.wait_for(waiting, 30)
        taken_at = time.time()
    finally:
        if holder.is_alive():
            holder.kill()
        await asyncio.to_thread(holder.join, 10)
    assert (lock.owner, lock.fence) == ("survivor", fence + 1)
    assert granted_at + ttl - 0.05 <= taken_at <= granted_at + ttl + 3
    await store.close()


async def test_a_dead_waiter_drops_out_of_the_queue(
    room: Room, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrooms.rooms.locks import queue as locks_module

    monkeypatch.setattr(locks_module, "WAITER_TTL", 0.3)
    a = await room.locks.try_acquire("plan", "A", ttl=30)
    dead = asyncio.create_task(room.locks.wait_acquire("plan", "dead", timeout=20))
    await asyncio.sleep(0.1)
    dead.cancel()  # the waiter's process is gone: its queue entry is no longer refreshed
    alive = asyncio.create_task(room.locks.wait_acquire("plan", "alive", timeout=20))
    await asyncio.sleep(0.6)
    assert await room.locks.release(a)
    lock = await asyncio.wait_for(alive, 10)
    assert lock.owner == "alive"


async def test_lock_cycles_and_handoffs(store: Store) -> None:
    """Uncontended take-and-release cycles each get the next fencing token and leave the
    lock free; an extended grant still releases; a holder's release hands the lock down
    a line of two in order, each with the next token, and the line is empty after.
    (What each path costs in round trips: ``python3 dev.py bench locks trips``.)"""
    room = await Rooms(store).create(f"trips-{uuid.uuid4().hex[:8]}")
    lock = await room.locks.try_acquire("l", "a", ttl=30)
    assert await room.locks.release(lock)
    for i in range(5):
        lock = await room.locks.try_acquire("l", "a", ttl=30)
        assert lock.fence == i + 2
        assert await room.locks.release(lock)
        assert await room.locks.holder("l") is None
    lock = await room.locks.extend(await room.locks.try_acquire("l", "a", ttl=30), 60)
    assert lock.fence == 7
    assert await room.locks.release(lock)  # an extended grant keeps what its release uses
    assert await room.locks.holder("l") is None

    holder = await room.locks.try_acquire("l", "holder", ttl=30)
    waiters = []
    for name in ("first", "second"):
        waiters.append(asyncio.create_task(room.locks.wait_acquire("l", name, timeout=20)))
        await in_line(store, room.name, len(waiters))  # in line before the next one comes
    first, second = waiters
    assert await room.locks.release(holder)
    got = await handed(first, "first", holder.fence + 1)
    assert not second.done()
    assert await room.locks.release(got)
    got = await handed(second, "second", holder.fence + 2)
    assert await room.locks.release(got)
    assert await room.locks.holder("l") is None
    assert (await store.scan(room.name, "lockq/")).records == []
    events = [e for e in await room.events.read(0, 100) if e.type.startswith("lock.")]
    assert [(e.type, e.data.get("to")) for e in events][-3:] == [
        ("lock.handoff", "first"),
        ("lock.handoff", "second"),
        ("lock.released", None),
    ]


async def test_locks_that_know_nothing_serve_the_same(store: Store) -> None:
    """What the process knows of its locks is optional: locks without it (each path reads
    what it needs) refuse a held lock, hand it down the line in order with the next
    fencing tokens, requeue, and serve a waiter of a lock released free."""
    room = await Rooms(store).create(f"blank-{uuid.uuid4().hex[:8]}")
    locks = Locks(room.scope)  # knows nothing
    a = await locks.try_acquire("l", "A", ttl=30)
    with pytest.raises(LockHeld):
        await locks.try_acquire("l", "B")
    waiters = []
    for name in ("B", "C"):
        waiters.append(asyncio.create_task(locks.wait_acquire("l", name, timeout=20)))
        await in_line(store, room.name, len(waiters))
    a_again = asyncio.create_task(locks.requeue(a, writes=[Put("report", "A")], timeout=20))
    b = await handed(waiters[0], "B", a.fence + 1)
    assert (await store.read(room.name, ["report"])).value("report") == "A"
    await in_line(store, room.name, 2)  # C, then A
    assert await locks.release(b)
    c = await handed(waiters[1], "C", a.fence + 2)
    assert await locks.release(c)
    a2 = await handed(a_again, "A", a.fence + 3)
    assert await locks.release(a2) and not await locks.release(a2)
    assert await locks.holder("l") is None
    assert (await store.scan(room.name, "lockq/")).records == []
    again = await locks.wait_acquire("l", "D", timeout=5)  # free: taken at once
    assert (again.owner, again.fence) == ("D", a.fence + 4)
    assert (await locks.extend(again, 60)).fence == again.fence
    assert await locks.release(again)


async def test_a_free_release_wakes_a_waiter_left_in_line_by_an_expired_holder(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter still in line from before the holder's grant (its holder's lease ran out,
    and another agent took the lock free) is woken by that holder's release and takes
    the lock, long before it would have looked again by itself."""
    from agentrooms.rooms.locks import queue as locks_module

    monkeypatch.setattr(locks_module, "EXPIRY_SLACK", 5.0)  # the waiter's own look: late
    room = await Rooms(store).create(f"stale-{uuid.uuid4().hex[:8]}")
    await room.locks.try_acquire("plan", "A", ttl=0.3)  # A stalls: its lease runs out
    waiter = asyncio.create_task(room.locks.wait_acquire("plan", "W", ttl=30, timeout=20))
    while not (await store.scan(room.name, "lockq/")).records:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    b = await room.locks.acquire("plan", "B", ttl=30, tries=100, step=0.01)  # free, at expiry
    released = time.monotonic()
    assert await room.locks.release(b)
    w = await asyncio.wait_for(waiter, 10)
    assert time.monotonic() - released < 2.5  # woken by the release, not by its own look
    assert (w.owner, w.fence) == ("W", b.fence + 1)
    assert (await store.scan(room.name, "lockq/")).records == []  # out of line
    assert await room.locks.release(w)


@pytest.mark.parametrize("again", ["release", "requeue"])
async def test_a_waiter_left_in_line_is_not_starved_by_a_holder_taking_turns(
    store: Store, monkeypatch: pytest.MonkeyPatch, again: str
) -> None:
    """A waiter still in line from before the holder's grant (its holder's lease ran out,
    and another agent took the lock free) loses the race for the lock that the holder's
    release freed, if the holder takes it again at once. It must not lose every time: it
    makes itself known, and the holder's next release hands the lock to it."""
    from agentrooms.rooms.locks import queue as locks_module

    monkeypatch.setattr(locks_module, "EXPIRY_SLACK", 5.0)  # the waiter's own look: late
    room = await Rooms(store).create(f"turns-{uuid.uuid4().hex[:8]}")
    await room.locks.try_acquire("plan", "A", ttl=0.3)  # A stalls: its lease runs out

    async def turn() -> Lock:
        w = await room.locks.wait_acquire("plan", "W", ttl=30, timeout=20)
        assert await room.locks.release(w)
        return w

    waiter = asyncio.create_task(turn())
    await in_line(store, room.name, 1)
    b = await room.locks.acquire("plan", "B", ttl=30, tries=100, step=0.01)  # free, at expiry

    line_key = "lockline/plan"

    async def marked(since: int) -> None:
        # W's look, woken by B's release, ends by marking the line if B took the lock back
        # first; a loaded machine may take a while to get there. B's next turn waits for it
        # (or for W's grant), so that the bound below counts turns, not scheduling luck.
        deadline = time.monotonic() + 5.0
        while not waiter.done() and time.monotonic() < deadline:
            if ((await store.read(room.name, [line_key])).version(line_key) or 0) > since:
                return
            await asyncio.sleep(0.01)

    turns = 0
    while not waiter.done() and turns < 10:
        turns += 1
        if again == "requeue":
            b = await room.locks.requeue(b, timeout=20)
        else:
            assert await room.locks.release(b)
            b = await room.locks.wait_acquire("plan", "B", ttl=30, timeout=20)
        await marked((await store.read(room.name, [line_key])).version(line_key) or 0)
    assert waiter.done() and turns <= 3, turns
    w = waiter.result()
    assert w.owner == "W" and w.fence < b.fence
    assert await room.locks.release(b)


async def test_a_local_waiter_whose_entry_left_the_store_is_skipped(store: Store) -> None:
    """A holder hands the lock to the next waiter of its own process without reading its
    entry; if that entry has left the store meanwhile (its waiter stalled past its TTL),
    the release's compare fails, the release reads the line again, and the lock goes
    the right way: never to a waiter out of line."""
    room = await Rooms(store).create(f"gone-{uuid.uuid4().hex[:8]}")
    holder = await room.locks.try_acquire("l", "holder", ttl=30)
    waiters = []
    for name in ("first", "second"):
        waiters.append(asyncio.create_task(room.locks.wait_acquire("l", name, timeout=20)))
        while len((await store.scan(room.name, "lockq/")).records) < len(waiters):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    first, second = waiters
    assert await room.locks.release(holder)
    got = await asyncio.wait_for(first, 10)
    (entry,) = (await store.scan(room.name, "lockq/")).records  # second's
    await store.transact(room.name, writes=[Delete(entry.key)])
    assert await room.locks.release(got)  # named second: its entry is gone, so nobody
    events = await store.read_log(room.name, 0, 100)
    assert [e.type for e in events if e.type.startswith("lock.")][-1] == "lock.released"
    got = await asyncio.wait_for(second, 10)  # woken by the release, takes the free lock
    assert (got.owner, got.fence) == ("second", holder.fence + 2)
    assert await room.locks.release(got)


async def test_stale_lock_knowledge_costs_a_write_never_a_wrong_grant(backend: Backend) -> None:
    """Two processes, each outdating what the other believes of the lock: every grant
    still gets the next fencing token, and a held lock is never granted."""
    one, two = await backend.open(), await backend.open()
    room = await Rooms(one).create(f"stale-{uuid.uuid4().hex[:8]}")
    here, there = room.locks, Rooms(two).room(room.name).locks
    assert await here.release(await here.try_acquire("l", "a"))  # here: "free at 1"
    b = await there.try_acquire("l", "b", ttl=30)
    with pytest.raises(LockHeld):
        await here.try_acquire("l", "a")  # believed free, found held
    assert await there.release(b)
    lock = await here.try_acquire("l", "a", ttl=30)  # believed held, found free
    assert lock.fence == 3
    waiting = asyncio.create_task(there.wait_acquire("l", "b", ttl=30, timeout=20))
    await asyncio.sleep(0.2)  # there believed it free at 2: it queued behind a
    assert await here.release(lock)
    got = await asyncio.wait_for(waiting, 10)
    assert (got.owner, got.fence) == ("b", 4)
    assert await there.release(got)
    lock = await here.wait_acquire("l", "a", ttl=30, timeout=5)  # believed held by b
    assert lock.fence == 5
    assert await here.release(lock)  # here: "free at 5"
    assert await there.release(await there.try_acquire("l", "b"))  # there: "free at 4" -> 6
    assert (await here.try_acquire("l", "a")).fence == 7  # not a second 6
    for s in (one, two):
        await s.close()


async def test_a_release_passes_over_a_head_that_left_after_it_was_looked_up(
    room: Room, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant from the line looks up the next in line while it is held; if that waiter
    has gone by the release, the release looks again."""
    from agentrooms.rooms.locks import queue as locks_module

    monkeypatch.setattr(locks_module, "WAITER_TTL", 0.3)
    a = await room.locks.try_acquire("plan", "A", ttl=30)

    async def in_line(n: int) -> None:  # the order of the line, whatever the store's latency
        while len(await room.locks.waiters("plan")) < n:  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    b = asyncio.create_task(room.locks.wait_acquire("plan", "B", ttl=30, timeout=20))
    await asyncio.wait_for(in_line(1), 10)
    dead = asyncio.create_task(room.locks.wait_acquire("plan", "dead", ttl=30, timeout=20))
    await asyncio.wait_for(in_line(2), 10)
    assert await room.locks.release(a)
    lock = await asyncio.wait_for(b, 10)  # and it looked up "dead" as the next in line
    dead.cancel()  # its entry is no longer refreshed
    alive = asyncio.create_task(room.locks.wait_acquire("plan", "alive", ttl=30, timeout=20))
    await asyncio.sleep(0.6)
    assert await room.locks.release(lock)
    assert (await asyncio.wait_for(alive, 10)).owner == "alive"
    with contextlib.suppress(asyncio.CancelledError):
        await dead


async def test_a_handoff_wakes_only_the_waiter_it_names(store: Store) -> None:
    """Twelve agents queued in one process: each handoff costs the waiter it names one
    read, instead of every queued waiter re-reading the lock (a thundering herd of
    reads, n(n+1)/2 = 78 of them for the chain below)."""
    counting = Interposed(store)
    room = await Rooms(counting).create(f"herd-{uuid.uuid4().hex[:8]}")
    first = await room.locks.try_acquire("plan", "first", ttl=30)
    n, order = 12, []

    async def waiter(i: int) -> None:
        lock = await room.locks.wait_acquire("plan", f"w{i}", ttl=30, timeout=60)
        order.append(i)
        held = await room.locks.holder("plan")  # what the waiter was told is what holds
        assert held is not None and (held.owner, held.fence) == (lock.owner, lock.fence)
        assert held.expires_at == pytest.approx(lock.expires_at, abs=1e-3)
        assert await room.locks.release(lock)

    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(waiter(i)))
        while len((await store.scan(room.name, "lockq/")).records) <= i:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # in line before the next one comes
    await asyncio.sleep(0.2)  # every waiter asleep on the lock
    before = counting.reads
    assert await room.locks.release(first)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert order == list(range(n))  # first come, first served
    # per handoff: the releaser's commit reads once, the named waiter not at all (the
    # handoff event says enough), and this test's check once
    assert counting.reads - before <= 3 * (n + 1)


async def test_a_handoff_names_the_line_behind_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each handoff event names up to LINE waiters behind the new holder, in order, and
    ten waiters with LINE = 3 are served in order (how often the line is scanned:
    ``python3 dev.py bench locks trips``)."""
    from agentrooms.rooms.locks import line as locks_module

    monkeypatch.setattr(locks_module, "LINE", 3)
    room = await Rooms(store).create(f"line-{uuid.uuid4().hex[:8]}")
    first = await room.locks.try_acquire("plan", "first", ttl=30)
    n, order = 10, []

    async def waiter(i: int) -> None:
        lock = await room.locks.wait_acquire("plan", f"w{i}", ttl=30, timeout=60)
        order.append(i)
        assert await room.locks.release(lock)

    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(waiter(i)))
        while len((await store.scan(room.name, "lockq/")).records) <= i:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # in line before the next one comes
    assert await room.locks.release(first)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert order == list(range(n))
    handoffs = [e.data for e in await room.events.read(0, 100) if e.type == "lock.handoff"]
    assert [len(h["line"]) for h in handoffs] == [3, 2, 1, 0, 3, 2, 1, 0, 1, 0]


async def test_a_handoff_in_one_process_wakes_the_waiter_without_the_log(store: Store) -> None:
    """The releasing write hands its event to the waiters of its own process at once:
    a local waiter wakes even while the reader of the log is stalled."""

    class Stalled(Forwarding):
        async def _follow_log(
            self, room: str, after: int, timeout: float, limit: int
        ) -> list[Event]:
            await asyncio.sleep(timeout)  # as if nothing were appended
            return []

    stalled = Stalled(store)
    room = await Rooms(stalled).create(f"tell-{uuid.uuid4().hex[:8]}")
    a = await room.locks.try_acquire("plan", "A", ttl=30)
    b = asyncio.create_task(room.locks.wait_acquire("plan", "B", ttl=30, timeout=20))
    while not (await store.scan(room.name, "lockq/")).records:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    t0 = time.monotonic()
    assert await room.locks.release(a)
    lock = await asyncio.wait_for(b, 10)
    assert (lock.owner, lock.fence) == ("B", a.fence + 1)
    assert time.monotonic() - t0 < 1  # not after the log's 5 s idle wait, nor A's lease


async def test_a_waiter_handed_the_lock_unawares_does_not_queue_again(
    store: Store, room: Room, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter's refresh compares its entry present: when the entry is gone because the
    lock was handed to it (here, without the event that would have told it), the refresh
    puts nothing back and the waiter finds the lock its own."""
    from agentrooms.rooms.locks import queue as locks_module
    from agentrooms.rooms.locks.records import grant_writes

    monkeypatch.setattr(locks_module, "WAITER_TTL", 0.3)  # a refresh every 0.1 s
    a = await room.locks.try_acquire("plan", "A", ttl=30)
    b = asyncio.create_task(room.locks.wait_acquire("plan", "B", ttl=30, timeout=20))
    while not (entries := (await store.scan(room.name, "lockq/")).records):  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    entry = entries[0].value
    # the handoff's writes, but no event: B learns of it only by its refresh failing
    granted = {"owner": "B", "token": entry["token"], "fence": a.fence + 1, "ttl": 30.0}
    await store.transact(
        room.name,
        writes=[*grant_writes("plan", granted), Delete(entries[0].key)],
    )
    lock = await asyncio.wait_for(b, 10)
    assert (lock.owner, lock.fence) == ("B", a.fence + 1)
    assert (await store.scan(room.name, "lockq/")).records == []  # not back in line
    assert await room.locks.release(lock)
    assert await room.locks.holder("plan") is None


async def test_a_waiter_that_dropped_out_of_the_line_gets_back_in(
    store: Store, room: Room, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter whose entry expired (its process stalled past WAITER_TTL; here the entry
    is deleted) joins the line again at its next refresh, and is still served."""
    from agentrooms.rooms.locks import queue as locks_module

    monkeypatch.setattr(locks_module, "WAITER_TTL", 0.3)
    a = await room.locks.try_acquire("plan", "A", ttl=30)
    b = asyncio.create_task(room.locks.wait_acquire("plan", "B", ttl=30, timeout=20))
    while not (entries := (await store.scan(room.name, "lockq/")).records):  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    await store.transact(room.name, writes=[Delete(entries[0].key)])
    while not (await store.scan(room.name, "lockq/")).records:  # noqa: ASYNC110
        await asyncio.sleep(0.01)  # back in line
    assert await room.locks.release(a)
    lock = await asyncio.wait_for(b, 10)
    assert (lock.owner, lock.fence) == ("B", a.fence + 1)


# ------------------------------------------------------------------------- documents


async def test_documents_compare_and_swap(room: Room) -> None:
    created = await room.docs.put("legal/report", {"v": 1}, create_only=True)
    with pytest.raises(VersionConflict) as info:
        await room.docs.put("legal/report", {"v": "again"}, create_only=True)
    assert info.value.conflicts == {"doc/legal/report": created.version}
    updated = await room.docs.put("legal/report", {"v": 2}, if_match=created.version)
    with pytest.raises(VersionConflict) as info:
        await room.docs.put("legal/report", {"v": "stale"}, if_match=created.version)
    assert info.value.conflicts == {"doc/legal/report": updated.version}
    got = await room.docs.get("legal/report")
    assert (got.value, got.version) == ({"v": 2}, updated.version)
    await room.docs.put("notes", "plain")
    assert [d.name for d in await room.docs.list()] == ["legal/report", "notes"]
    assert [d.name for d in await room.docs.list("legal")] == ["legal/report"]
    with pytest.raises(VersionConflict):
        await room.docs.delete("legal/report", if_match=created.version)
    await room.docs.delete("legal/report", if_match=updated.version)
    with pytest.raises(NotFound):
        await room.docs.get("legal/report")
    for bad in ("", "a/b/c", "/x", "x/", "sp ace"):
        with pytest.raises(BadRequest):
            await room.docs.put(bad, 1)


async def test_document_write_fenced_by_a_lease(room: Room) -> None:
    await room.plan.add([TaskSpec("t")])
    old = await room.plan.claim("t", "a", ttl=0.2)
    await asyncio.sleep(0.4)
    await room.plan.claim("t", "b")
    with pytest.raises(StaleFence):
        await room.docs.put("out", "late", fence=old.guard())
    with pytest.raises(NotFound):
        await room.docs.get("out")


async def test_commands_with_an_id_apply_once(room: Room) -> None:
    await room.plan.add([TaskSpec("a"), TaskSpec("b")])
    first = await room.plan.claim_next("agent", command_id="claim-1")
    again = await room.plan.claim_next("agent", command_id="claim-1")
    assert first is not None and again == first
    assert await room.plan.ready_count() == 1  # the retry claimed nothing more
    done = await room.plan.complete(first, "r", command_id="done-1")
    replay = await room.plan.complete(first, "r", command_id="done-1")
    assert done.status == replay.status == "done"
    doc = await room.docs.put("d", 1, create_only=True, command_id="put-1")
    assert (
        await room.docs.put("d", 1, create_only=True, command_id="put-1")
    ).version == doc.version
    seq = await room.events.post("e", 1, command_id="post-1")
    assert await room.events.post("e", 1, command_id="post-1") == seq  # the first seq
    assert [e.seq for e in await room.events.read(seq - 1, 10) if e.type == "e"] == [seq]


async def test_claim_replay_when_the_ready_set_is_empty(room: Room) -> None:
    await room.plan.add([TaskSpec("only")])
    first = await room.plan.claim_next("agent", command_id="c1")
    assert first is not None
    assert await room.plan.claim_next("agent", command_id="c1") == first
    with pytest.raises(IdempotencyMismatch):
        await room.plan.claim_next("other-agent", command_id="c1")
    assert await room.plan.claim_next("agent", command_id="c2") is None
    assert await room.plan.claim_next("agent", command_id="c2") is None


async def test_extend_needs_the_grants_token(room: Room) -> None:
    lock = await room.locks.try_acquire("plan", "A", ttl=30)
    forged = dataclasses.replace(lock, token="not-the-token")
    with pytest.raises(StaleFence):
        await room.locks.extend(forged, 60)
    overstated = dataclasses.replace(lock, fence=lock.fence + 5)
    with pytest.raises(StaleFence):
        await room.locks.extend(overstated, 60)
    assert (await room.locks.extend(lock, 60)).expires_at > lock.expires_at
