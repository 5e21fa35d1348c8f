"""Rooms listed by page: filtered before they are described, a page in one glance and
one scan_keys over the registry's shards."""

from __future__ import annotations

import uuid

import pytest

from agentrooms import Rooms
from agentrooms.errors import BadRequest, NotFound
from agentrooms.rooms import TaskSpec
from agentrooms.rooms.registry import SHARDS, shard_of
from agentrooms.store import Limits, Store
from agentrooms.store.types import Glance, KeyPage, ScanPage
from agentrooms.store.wrap import Forwarding
from tests.conftest import Backend


class Trips(Forwarding):
    """Counts the store calls a listing makes, by kind."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.scans = 0
        self.room_scans: list[int] = []  # rooms per scan_rooms or scan_keys call
        self.glances: list[list[str]] = []

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        self.scans += 1
        return await self.inner._scan(room, prefix, after, limit)

    async def _scan_rooms(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[ScanPage]:
        self.room_scans.append(len(rooms))
        return await self.inner._scan_rooms(rooms, prefix, after, limit)

    async def _scan_keys(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[KeyPage]:
        self.room_scans.append(len(rooms))
        return await self.inner._scan_keys(rooms, prefix, after, limit)

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        self.glances.append(rooms)
        return await self.inner._glance(rooms, keys, sets)


async def test_rooms_by_page_each_page_one_scan_and_one_glance(store: Store) -> None:
    tag = f"pg-{uuid.uuid4().hex[:8]}"
    rooms = Rooms(store)
    names = [f"{tag}-{i:02d}" for i in range(7)]
    for name in names:
        await rooms.create(name)
    await rooms.archive(names[3])
    mine = Rooms(counted := Trips(store))
    seen: list[str] = []
    after: str | None = names[0][:-3]  # sorts before every name of the tag
    pages = 0
    while after is not None and after.startswith(tag):
        counted.scans, counted.room_scans, counted.glances = 0, [], []
        page = await mine.page(2, after, allowed=lambda n: n.startswith(tag))
        assert (counted.scans, counted.room_scans) == (0, [SHARDS])  # read ahead: one call
        assert len(counted.glances) <= 2
        assert all(g[0].startswith(tag) for g in counted.glances)  # refused: not described
        seen += [r.name for r in page.rooms]
        assert len(page.rooms) <= 2
        after, pages = page.next_after, pages + 1
    assert seen == [n for n in names if n != names[3]]
    assert pages <= 4
    page = await mine.page(10, names[0][:-3], include_archived=True, allowed=lambda n: n in names)
    assert [r.name for r in page.rooms] == names
    assert page.rooms[3].archived and not page.rooms[2].archived
    with pytest.raises(BadRequest):
        await mine.page(0)


async def test_a_full_page_is_described_in_one_glance(store: Store) -> None:
    tag = f"pf-{uuid.uuid4().hex[:8]}"
    rooms = Rooms(store)
    names = [f"{tag}-{i:02d}" for i in range(5)]
    for name in names:
        await rooms.create(name)
    counted = Trips(store)
    page = await Rooms(counted).page(5, f"{tag}-", allowed=lambda n: n.startswith(tag))
    assert [r.name for r in page.rooms] == names
    assert (counted.scans, counted.room_scans, counted.glances) == (0, [SHARDS], [names])
    counted.glances = []
    info = await Rooms(counted).describe(names[1])
    assert (info.name, counted.glances) == (names[1], [[names[1]]])


async def test_a_page_among_named_rooms_scans_no_registry(store: Store) -> None:
    tag = f"pn-{uuid.uuid4().hex[:8]}"
    rooms = Rooms(store)
    names = [f"{tag}-{i}" for i in range(4)]
    for name in names:
        await rooms.create(name)
    await rooms.archive(names[2])
    counted = Trips(store)
    among = [names[3], names[0], names[2], f"{tag}-never"]
    page = await Rooms(counted).page(1, among=among)
    assert ([r.name for r in page.rooms], page.next_after) == ([names[0]], names[0])
    assert (counted.scans, counted.room_scans, counted.glances) == (0, [], [[names[0]]])
    page = await Rooms(counted).page(5, names[0], among=among)
    assert ([r.name for r in page.rooms], page.next_after) == ([names[3]], None)
    page = await Rooms(counted).page(5, among=among, include_archived=True)
    assert [r.name for r in page.rooms] == [names[0], names[2], names[3]]
    assert (counted.scans, counted.room_scans) == (0, [])


async def test_presence_and_plan_by_page(store: Store, room: str) -> None:
    r = await Rooms(store).create(room)
    for agent in ("a3", "a1", "a2"):
        await r.presence.heartbeat(agent, ttl=600)
    first = await r.presence.page(2)
    assert ([m.agent for m in first.members], first.next_after) == (["a1", "a2"], "a2")
    rest = await r.presence.page(2, first.next_after)
    assert ([m.agent for m in rest.members], rest.next_after) == (["a3"], None)
    assert [m.agent for m in (await r.presence.page()).members] == ["a1", "a2", "a3"]
    await r.plan.add([TaskSpec("t1"), TaskSpec("t2", deps=["t1"]), TaskSpec("t3")])
    page = await r.plan.page(2)
    assert ([t.id for t in page.tasks], page.next_after) == (["t1", "t2"], "t2")
    page = await r.plan.page(2, "t2")
    assert ([t.id for t in page.tasks], page.next_after) == (["t3"], None)
    ready = await r.plan.page(1, status="ready")
    assert ([t.id for t in ready.tasks], ready.next_after) == (["t1"], "t1")
    ready = await r.plan.page(1, "t1", status="ready")
    assert ([t.id for t in ready.tasks], ready.next_after) == (["t3"], None)
    with pytest.raises(BadRequest):
        await r.plan.page(0)
    with pytest.raises(NotFound):
        await Rooms(store).room(room + "-x").presence.page()


async def test_documents_and_held_locks_by_page(store: Store, room: str) -> None:
    r = await Rooms(store).create(room)
    for name in ("b", "qa/x", "a", "qa/y", "c"):
        await r.docs.put(name, 1)
    first = await r.docs.page(2)
    assert ([d.name for d in first.documents], first.next_after) == (["a", "b"], "b")
    rest = await r.docs.page(10, first.next_after)
    assert [d.name for d in rest.documents] == ["c", "qa/x", "qa/y"] and rest.next_after is None
    qa = await r.docs.page(1, partition="qa")
    assert ([d.name for d in qa.documents], qa.next_after) == (["qa/x"], "qa/x")
    qa = await r.docs.page(1, "qa/x", partition="qa")
    assert ([d.name for d in qa.documents], qa.next_after) == (["qa/y"], None)
    with pytest.raises(BadRequest):
        await r.docs.page(1, "b", partition="qa")
    for name in ("l2", "l1", "l3"):
        await r.locks.try_acquire(name, "holder", ttl=600)
    assert [i.name for i in await r.locks.held(2)] == ["l1", "l2"]
    assert [i.name for i in await r.locks.held(2, "l2")] == ["l3"]


async def test_pages_merge_the_registry_shards_in_name_order(backend: Backend) -> None:
    """With two names read ahead per shard, shards run dry and are read on mid-page: every
    room still comes once, in name order, across pages."""
    store = await backend.open(limits=Limits(max_page=2))
    tag = f"pm-{uuid.uuid4().hex[:8]}"
    names = [f"{tag}-{i:02d}" for i in range(24)]
    rooms = Rooms(store)
    for name in names:
        await rooms.create(name)
    assert len({shard_of(n) for n in names}) > 1
    seen: list[str] = []
    after: str | None = tag
    while after is not None:
        page = await rooms.page(2, after, allowed=lambda n: n.startswith(tag))
        seen += [r.name for r in page.rooms]
        after = page.next_after
    assert seen == names
    unfiltered = await rooms.page(2, names[5])
    assert [r.name for r in unfiltered.rooms] == names[6:8]
