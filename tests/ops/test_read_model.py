"""The operator read model (agentrooms.ops) on every backend: the 2am scenario's every
stuck item, the plan's expired state, pagination of tasks, events and rooms, and the
contention table read from another handle."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agentrooms.commit import Intent
from agentrooms.errors import InvalidTransition, NotFound, VersionConflict
from agentrooms.ops import EXPIRED, EXPIRED_LAST, Ops, Thresholds, as_json
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.rooms.registry import SHARD_ROOMS
from agentrooms.store import (
    Append,
    Event,
    Put,
    ScanPage,
    SetAdd,
    Snapshot,
    Store,
    TransactResult,
    VersionIs,
)
from agentrooms.store.contention import FLUSH_EVERY
from agentrooms.store.types import Glance, KeyPage, Prepared
from agentrooms.store.wrap import Forwarding
from agentrooms.writer import IntentQueue, Writer
from tests import ops_scenario as s
from tests.conftest import Backend


async def test_the_2am_room_shows_every_stuck_item(store: Store, room: str) -> None:
    seeded = await s.seed_2am(store, room)
    page = await Ops(store).room(room)
    doc = as_json(page)
    json.dumps(doc)  # plain JSON
    stuck = {(i["kind"], i["subject"]) for i in doc["stuck"]}
    assert stuck == {
        ("expired_lease", s.EXPIRED_TASK),
        ("failed_at_limit", s.FAILED_TASK),
        ("waiter_waiting", s.LOCK),
        ("effect_unknown", s.UNKNOWN_EFFECT),
        ("cursor_lagging", s.LAGGING_AGENT),
    }
    kinds = [i["kind"] for i in doc["stuck"]]
    assert kinds[0] == "expired_lease" and kinds[-1] == "cursor_lagging"
    (failed,) = [i for i in doc["stuck"] if i["kind"] == "failed_at_limit"]
    assert failed["detail"].endswith("(1 of 1): exit status 137"), failed["detail"]
    assert doc["last_seq"] == seeded.last_seq
    assert doc["plan"]["total"] == s.TASKS
    assert sum(doc["plan"]["counts"].values()) == s.TASKS
    assert len(doc["plan"]["tasks"]) == 100 and doc["plan"]["next_after"] is not None
    assert doc["plan"]["states"][EXPIRED] == 1
    (lock,) = [lock for lock in doc["locks"] if lock["name"] == s.LOCK]
    assert lock["holder"] == s.LOCK_HOLDER and lock["fence"] >= 1
    assert [w["owner"] for w in lock["waiters"]] == [f"worker-{i}" for i in range(s.WAITERS)]
    assert all(w["waited"] > 60 for w in lock["waiters"])
    assert 0 < lock["remaining"] <= 600
    (lagging,) = [c for c in doc["cursors"] if c["agent"] == s.LAGGING_AGENT]
    assert lagging["lag"] >= s.LAG
    assert {p["agent"] for p in doc["presence"]} == set(s.ONLINE)
    assert all(p["online"] and p["age"] < 60 for p in doc["presence"])
    assert [e["id"] for e in doc["effects"]["unknown"]] == [s.UNKNOWN_EFFECT]
    assert [e["id"] for e in doc["effects"]["dead_letters"]] == [s.DEAD_EFFECT]
    assert doc["effects"]["counts"] == {"unknown": 1, "failed": 1}
    assert doc["contention"][0] == {"prefix": f"doc/{s.HOT_DOC}", "conflicts": s.HOT_CONFLICTS}
    assert [d["name"] for d in doc["documents"]] == [s.HOT_DOC]
    assert len(doc["events"]) == 50
    assert [e["seq"] for e in doc["events"]] == list(
        range(seeded.last_seq, seeded.last_seq - 50, -1)
    )


async def test_an_expired_lease_is_expired_reclaimable_until_reclaimed(
    store: Store, room: str
) -> None:
    r = await Rooms(store).create(room)
    await r.plan.add([TaskSpec("a"), TaskSpec("b"), TaskSpec("c", max_attempts=1)])
    await r.plan.claim("a", "alice", ttl=0.05)
    await r.plan.claim("b", "bob", ttl=600)
    await r.plan.claim("c", "dave", ttl=0.05)
    await asyncio.sleep(0.1)
    rows = {t.id: t for t in (await Ops(store).tasks(room)).tasks}
    assert rows["a"].state == EXPIRED and rows["a"].status == "claimed"
    assert rows["a"].lease_remaining == 0.0
    assert rows["b"].state == "claimed" and 590 < (rows["b"].lease_remaining or 0) <= 600
    assert rows["c"].state == EXPIRED_LAST
    stuck = (await Ops(store).room(room)).stuck
    assert [(i.kind, i.subject) for i in stuck] == [("expired_lease", "a"), ("expired_lease", "c")]
    assert "the next claim fails it" in stuck[1].detail
    with pytest.raises(InvalidTransition):
        await r.plan.claim("c", "carol")  # fails it
    await r.plan.claim_next("carol", ttl=600)  # reclaims "a"
    page = await Ops(store).room(room)
    assert [(i.kind, i.subject) for i in page.stuck] == [("failed_at_limit", "c")]
    assert page.plan.states == {"claimed": 2, "failed": 1}


async def test_thresholds_decide_what_is_stuck(store: Store, room: str) -> None:
    await s.seed_2am(store, room)
    lenient = Thresholds(effect_unknown=3600, waiter_waiting=3600, cursor_lag=10**6)
    kinds = {i.kind for i in (await Ops(store).room(room, lenient)).stuck}
    assert kinds == {"expired_lease", "failed_at_limit"}


async def test_tasks_events_and_rooms_paginate(store: Store, room: str) -> None:
    rooms = Rooms(store)
    r = await rooms.create(room)
    await r.plan.add([TaskSpec(f"t{i:02d}") for i in range(25)])
    await r.plan.claim("t03", "alice", ttl=600)
    ops = Ops(store)
    seen: list[str] = []
    after: str | None = None
    while True:
        page = await ops.tasks(room, limit=10, after=after)
        seen += [t.id for t in page.tasks]
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == [f"t{i:02d}" for i in range(25)]
    claimed = await ops.tasks(room, limit=10, status="claimed")
    assert [t.id for t in claimed.tasks] == ["t03"] and claimed.next_after is None
    for i in range(30):
        await r.events.post("note" if i % 3 else "alert", {"i": i})
    head = await store.last_seq(room)
    first = await ops.events(room, limit=20)
    assert [e.seq for e in first.events] == list(range(head, head - 20, -1))
    rest = await ops.events(room, limit=1000, before=first.next_before)
    assert [e.seq for e in rest.events] == list(range(head - 20, 0, -1))
    assert rest.next_before is None
    alerts = await ops.events(room, limit=100, type="alert")
    assert [e.data["i"] for e in alerts.events] == list(range(27, -1, -3))
    names = [f"{room}-{c}" for c in "abc"]
    for name in names:
        await rooms.create(name)
    listed: list[str] = []
    cursor: str | None = room
    while True:
        rpage = await ops.rooms(limit=2, after=cursor, allowed=lambda n: n.startswith(room))
        listed += [x.room for x in rpage.rooms]
        if rpage.next_after is None:
            break
        cursor = rpage.next_after
    assert listed == names
    summary = (await ops.rooms(limit=1, after=f"{room}-a", allowed=lambda n: n == names[1])).rooms
    assert [x.room for x in summary] == [names[1]]


async def test_a_missing_room_is_not_found(store: Store, room: str) -> None:
    for read in (Ops(store).room, Ops(store).tasks, Ops(store).events):
        try:
            await read(room)
        except NotFound:
            continue
        raise AssertionError(f"{read.__name__} answered for a missing room")


async def test_contention_of_another_handle_is_read_after_its_flush(
    backend: Backend, room: str
) -> None:
    writer = await backend.open()
    reader = await backend.open() if backend.shared_across_processes else writer
    await Rooms(writer).create(room)
    await writer.transact(room, writes=[Put("doc/x", 1)])
    for _ in range(3):
        with pytest.raises(VersionConflict):
            await writer.transact(room, [VersionIs("doc/x", 10**9)], [Put("doc/x", 2)])
    deadline = time.monotonic() + 2 * FLUSH_EVERY + 2  # a first flush, then one more
    while True:
        conflicts = await Ops(reader).contention(room)
        if sum(c.conflicts for c in conflicts) >= 3 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert [(c.prefix, c.conflicts) for c in conflicts] == [("doc/x", 3)]


async def test_events_stop_at_the_trimmed_start(store: Store, room: str) -> None:
    r = await Rooms(store).create(room)
    for i in range(40):
        await r.events.post("note", {"i": i})
    first = await store.trim_log(room, 30)
    ops = Ops(store)
    page = await ops.events(room, limit=5, before=first + 3)
    assert [e.seq for e in page.events] == [first + 2, first + 1, first]
    assert page.next_before is None
    exact = await ops.events(room, limit=3, before=first + 3)
    assert [e.seq for e in exact.events] == [first + 2, first + 1, first]
    if exact.next_before is not None:  # a page ending on the trimmed start may not know it
        after = await ops.events(room, limit=3, before=exact.next_before)
        assert after.events == [] and after.next_before is None
    filtered = await ops.events(room, limit=100, type="note")
    assert [e.seq for e in filtered.events] == list(range(41, first - 1, -1))
    assert filtered.next_before is None


async def test_the_writer_section_counts_queued_intents_and_dead_letters(
    store: Store, room: str
) -> None:
    r = await Rooms(store).create(room)
    queue = IntentQueue(r)
    poison = {"when": [], "writes": [{"op": "explode"}], "appends": []}
    item = {"id": "poison", "status": "queued", "intent": poison, "digest": "-", "failures": 0}
    await r.scope.transact(
        writes=[Put(queue.keys.item("poison"), item), SetAdd(queue.keys.queued, "poison")],
        appends=[Append("wq.submitted", {"queue": "main", "id": "poison", "keys": []})],
    )
    writer = Writer(r, owner="w1", max_failures=2, retry_delay=0.01)
    lock = await r.locks.try_acquire("writer.main", "w1")
    assert await writer.apply_pending(lock) == 1
    await queue.submit(Intent([], [Put("x", 1)]))
    await IntentQueue(r, "other").submit(Intent([], [Put("y", 1)]))
    page = await Ops(store).room(room)
    assert (page.writer.queued, page.writer.dead_letters) == (2, 1)
    assert {(q.name, q.queued, q.dead_letters) for q in page.writer.queues} == {
        ("main", 1, 1),
        ("other", 1, 0),
    }
    (letter,) = page.writer.dead
    assert (letter["queue"], letter["id"], letter["failures"]) == ("main", "poison", 2)


class _Counted(Forwarding):
    """Counts every round trip the read model makes, and asserts it writes nothing."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.trips = 0

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        self.trips += 1
        return await self.inner._read(room, keys)

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        self.trips += 1
        return await self.inner._scan(room, prefix, after, limit)

    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]:
        self.trips += 1
        return await self.inner._read_log(room, after, limit)

    async def _last_seq(self, room: str) -> int:
        self.trips += 1
        return await self.inner._last_seq(room)

    async def _set_size(self, room: str, name: str) -> int:
        self.trips += 1
        return await self.inner._set_size(room, name)

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        raise AssertionError("the read model wrote")


async def test_the_room_page_costs_the_same_round_trips_however_full_the_room(
    store: Store, room: str
) -> None:
    r = await Rooms(store).create(room)
    counted = _Counted(store)
    await Ops(counted).room(room)
    empty = counted.trips
    await r.plan.add([TaskSpec(f"t{i:03d}") for i in range(900)])
    for i in range(40):
        await r.locks.try_acquire(f"lock{i}", f"agent{i}", ttl=600)
        await r.presence.heartbeat(f"agent{i}", ttl=600)
        await r.events.ack(f"agent{i}", 1)
        await r.docs.put(f"doc{i}", {"i": i})
    counted.trips = 0
    page = await Ops(counted).room(room)
    assert (page.plan.total, len(page.locks), len(page.cursors)) == (900, 40, 40)
    assert counted.trips == empty <= 16


class CallsByKind(Forwarding):
    """Counts the store calls made through it, by backend method."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        self._count("read")
        return await super()._read(room, keys)

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        self._count("scan")
        return await super()._scan(room, prefix, after, limit)

    async def _scan_rooms(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[ScanPage]:
        self._count("scan_rooms")
        return await super()._scan_rooms(rooms, prefix, after, limit)

    async def _scan_keys(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[KeyPage]:
        # the registry's shards are read as far as the listing needs, which depends on
        # what else the store holds: counted apart from the page's own reads
        assert set(rooms) <= set(SHARD_ROOMS)
        self._count("registry")
        return await super()._scan_keys(rooms, prefix, after, limit)

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        self._count("glance")
        return await super()._glance(rooms, keys, sets)

    async def _last_seq(self, room: str) -> int:
        self._count("last_seq")
        return await super()._last_seq(room)


async def test_a_rooms_page_costs_the_same_store_calls_for_2_and_for_12_rooms(
    store: Store, room: str
) -> None:
    rooms = Rooms(store)
    names = [f"{room}-{i:02d}" for i in range(12)]
    for name in names:
        r = await rooms.create(name)
        await r.plan.add([TaskSpec("t1"), TaskSpec("t2", deps=["t1"])])
        await r.presence.heartbeat("ann", ttl=600)
        await r.locks.try_acquire("L", "ann", ttl=600)
    costs = []
    for n in (2, 12):
        counted = CallsByKind(store)
        mine = set(names[:n])
        page = await Ops(counted).rooms(limit=50, after=room, allowed=mine.__contains__)
        assert [x.room for x in page.rooms] == names[:n]
        assert all(x.tasks == {"ready": 1, "pending": 1} for x in page.rooms)
        assert all((x.locks_held, x.online) == (1, 1) for x in page.rooms)
        costs.append(counted.calls)
    # the registry read as far as for 2 rooms, then one scan_rooms per kind of record of
    # the page's rooms, one glance and one read whatever the page's size
    assert costs[0] == costs[1]
    assert costs[0].pop("registry") >= 1
    assert costs[0] == {"glance": 1, "scan_rooms": 6, "read": 1}
