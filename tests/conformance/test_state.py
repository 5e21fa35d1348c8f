"""What the state says about itself (issue #22 item 1), on every backend: who appended
each event, when leases and lock grants were granted and renewed, when waiters joined a
lock's line, and expiry shown as what it is, judged by the store's clock."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from agentrooms.errors import StaleFence
from agentrooms.rooms import Room, Rooms, TaskSpec
from agentrooms.rooms.locks import queue
from agentrooms.rooms.plan import LEASE_EXPIRED, LEASE_EXPIRED_LAST, LEASE_HELD
from agentrooms.store import Store
from tests.helpers import in_line

MS = 0.002  # store times derived from millisecond expiries are this close, at worst


@pytest.fixture
async def room(store: Store) -> Room:
    return await Rooms(store).create(f"st-{uuid.uuid4().hex[:10]}")


async def _now(room: Room) -> float:
    return (await room.scope.store.read(room.name, [])).now


async def _authors(room: Room, after: int = 0) -> list[tuple[str, str | None]]:
    return [(e.type, e.author) for e in await room.events.read(after, 1000)]


# --------------------------------------------------------------------------- authors


async def test_events_the_library_appends_carry_the_agent_doing_it(room: Room) -> None:
    start = await room.scope.store.last_seq(room.name)
    await room.plan.add([TaskSpec("t"), TaskSpec("u", deps=["t"])], author="lead")
    lease = await room.plan.claim("t", "ann")
    lease = await room.plan.renew(lease)
    await room.plan.complete(lease, "ok")
    second = await room.plan.claim_next("bob")
    assert second is not None and second.task_id == "u"
    await room.plan.fail(second, "no")
    await room.plan.cancel("u", "dropped", author="lead")
    await room.events.post("note", {"x": 1}, author="cy")
    await room.events.post("anon")
    await room.docs.put("d", {"v": 1}, author="cy")
    await room.docs.delete("d", author="cy")
    assert await _authors(room, start) == [
        ("task.added", "lead"),
        ("task.added", "lead"),
        ("lease.granted", "ann"),
        ("lease.renewed", "ann"),
        ("task.completed", "ann"),
        ("task.ready", "ann"),
        ("lease.granted", "bob"),
        ("task.failed", "bob"),
        ("task.cancelled", "lead"),
        ("note", "cy"),
        ("anon", None),
        ("doc.written", "cy"),
        ("doc.deleted", "cy"),
    ]
    await room.plan.add([TaskSpec("v")])
    held = await room.plan.claim("v", "ann")
    await room.plan.cancel("v", author="lead")
    with pytest.raises(StaleFence):
        await room.plan.renew(held)  # a late holder: its lease.lost is its own
    assert (await _authors(room))[-2:] == [("task.cancelled", "lead"), ("lease.lost", "ann")]


async def test_lock_events_carry_the_releasing_holder(room: Room, store: Store) -> None:
    a = await room.locks.try_acquire("L", "ann", ttl=30)
    waiting = asyncio.create_task(room.locks.wait_acquire("L", "bob", timeout=20))
    await in_line(store, room.name, 1)
    assert await room.locks.release(a)
    b = await asyncio.wait_for(waiting, 10)
    assert await room.locks.release(b)
    kinds = [(t, who) for t, who in await _authors(room) if t.startswith("lock.")]
    assert kinds == [("lock.handoff", "ann"), ("lock.released", "bob")]


async def test_read_new_returns_each_events_author(room: Room) -> None:
    await room.events.resync("reader")
    await room.events.post("a", author="ann")
    await room.events.post("b")
    got = await room.events.read_new("reader")
    assert [(e.type, e.author) for e in got] == [("a", "ann"), ("b", None)]


# ----------------------------------------------------------------------------- leases


async def test_a_lease_records_when_it_was_granted_and_renewed(room: Room) -> None:
    await room.plan.add([TaskSpec("t")])
    before = await _now(room)
    lease = await room.plan.claim("t", "ann", ttl=30)
    after = await _now(room)
    task = await room.plan.get("t")
    assert task.lease_granted_at is not None and before <= task.lease_granted_at <= after
    assert lease.granted_at == task.lease_granted_at
    assert task.lease_renewed_at is None
    await asyncio.sleep(0.05)
    renewed = await room.plan.renew(lease, 30)
    task = await room.plan.get("t")
    assert task.lease_granted_at == lease.granted_at == renewed.granted_at
    assert task.lease_renewed_at is not None and task.lease_renewed_at > task.lease_granted_at
    assert task.lease_renewed_at <= await _now(room)
    assert [t.lease_renewed_at for t in await room.plan.tasks()] == [task.lease_renewed_at]
    done = await room.plan.complete(renewed)
    assert (done.lease_granted_at, done.lease_renewed_at) == (None, None)


async def test_an_expired_lease_shows_as_expired_reclaimable(room: Room) -> None:
    await room.plan.add([TaskSpec("t"), TaskSpec("last", max_attempts=1)])
    await room.plan.claim("t", "slow", ttl=0.3)
    await room.plan.claim("last", "slow", ttl=0.3)
    held = await room.plan.get("t")
    assert (held.status, held.lease_state, held.state) == ("claimed", LEASE_HELD, "claimed")
    assert held.lease_remaining is not None and 0 < held.lease_remaining <= 0.3
    await asyncio.sleep(0.5)
    expired = await room.plan.get("t")
    assert (expired.status, expired.lease_state, expired.lease_remaining) == (
        "claimed",
        LEASE_EXPIRED,
        0.0,
    )
    assert expired.state == "expired, reclaimable" == LEASE_EXPIRED
    shown = {t.id: t.state for t in await room.plan.tasks()}
    assert shown == {"t": LEASE_EXPIRED, "last": LEASE_EXPIRED_LAST}
    assert expired == held  # the time-varying fields take no part in equality
    reclaimed = await room.plan.claim_next("fast")
    assert reclaimed is not None and reclaimed.task_id == "t"
    now = await room.plan.get("t")
    assert (now.owner, now.lease_state) == ("fast", LEASE_HELD)
    assert {t.id: t.lease_state for t in await room.plan.tasks("ready")} == {}


# ------------------------------------------------------------------------------ locks


async def test_a_lock_grant_records_when_it_was_granted_and_extended(room: Room) -> None:
    before = await _now(room)
    lock = await room.locks.try_acquire("L", "ann", ttl=30)
    after = await _now(room)
    assert lock.granted_at is not None and before <= lock.granted_at <= after
    assert lock.renewed_at is None
    info = await room.locks.holder("L")
    assert info is not None and info.renewed_at is None
    assert info.granted_at is not None and abs(info.granted_at - lock.granted_at) <= MS
    await asyncio.sleep(0.05)
    extended = await room.locks.extend(lock, 20)
    info = await room.locks.holder("L")
    assert info is not None and info.granted_at is not None and info.renewed_at is not None
    assert abs(info.granted_at - lock.granted_at) <= MS
    assert info.renewed_at > info.granted_at + 0.04 and info.renewed_at <= await _now(room)
    assert extended.granted_at == info.granted_at and extended.renewed_at is not None
    again = await room.locks.extend(extended, 20)  # the grant's time survives extends
    info = await room.locks.holder("L")
    assert info is not None and info.granted_at == again.granted_at == extended.granted_at


async def test_a_handoff_is_granted_at_the_handoff_writes_time(room: Room, store: Store) -> None:
    a = await room.locks.try_acquire("L", "ann", ttl=30)
    waiting = asyncio.create_task(room.locks.wait_acquire("L", "bob", ttl=7, timeout=20))
    await in_line(store, room.name, 1)
    await asyncio.sleep(0.05)
    assert await room.locks.release(a)
    b = await asyncio.wait_for(waiting, 10)
    [handoff] = [e for e in await room.events.read(0, 100) if e.type == "lock.handoff"]
    info = await room.locks.holder("L")
    assert info is not None and info.owner == "bob" and info.granted_at is not None
    assert abs(info.granted_at - handoff.time) <= MS
    assert b.granted_at is not None and abs(b.granted_at - handoff.time) <= MS
    assert a.granted_at is not None and info.granted_at > a.granted_at


async def test_waiters_record_when_they_joined_the_line(room: Room, store: Store) -> None:
    a = await room.locks.try_acquire("L", "ann", ttl=30)
    tasks, joined = [], []
    for name in ("bob", "cy"):
        before = await _now(room)
        tasks.append(asyncio.create_task(room.locks.wait_acquire("L", name, timeout=20)))
        await in_line(store, room.name, len(tasks))
        joined.append((before, await _now(room)))
    line = await room.locks.waiters("L")
    assert [w.owner for w in line] == ["bob", "cy"]
    for waiter, (before, after) in zip(line, joined, strict=True):
        assert waiter.joined_at is not None and before - MS <= waiter.joined_at <= after + MS
    assert line[0].ticket < line[1].ticket
    assert await room.locks.release(a)
    b = await asyncio.wait_for(tasks[0], 10)
    assert [w.owner for w in await room.locks.waiters("L")] == ["cy"]
    assert await room.locks.release(b)
    assert await room.locks.release(await asyncio.wait_for(tasks[1], 10))
    assert await room.locks.waiters("L") == []


async def test_an_expired_lock_shows_as_free(room: Room) -> None:
    await room.locks.try_acquire("L", "ann", ttl=0.2)
    assert (await room.locks.holder("L")) is not None
    await asyncio.sleep(0.4)
    assert await room.locks.holder("L") is None


async def test_a_waiters_join_time_survives_its_refreshes(
    room: Room, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refreshes that keep a waiter's entry alive rewrite it (and its expiry): the
    time it joined the line stays the join's."""
    monkeypatch.setattr(queue, "WAITER_TTL", 0.6)  # a refresh every 0.2 s
    a = await room.locks.try_acquire("L", "ann", ttl=30)
    waiting = asyncio.create_task(room.locks.wait_acquire("L", "bob", timeout=20))
    await in_line(store, room.name, 1)
    [first] = await room.locks.waiters("L")
    await asyncio.sleep(0.7)  # past the first entry's own expiry: refreshed since
    [later] = await room.locks.waiters("L")
    assert first.joined_at is not None and later.joined_at is not None
    assert later.expires_at is not None and first.expires_at is not None
    assert later.expires_at > first.expires_at
    assert abs(later.joined_at - first.joined_at) <= MS
    assert (later.waiter, later.ticket) == (first.waiter, first.ticket)
    assert await room.locks.release(a)
    assert await room.locks.release(await asyncio.wait_for(waiting, 10))
