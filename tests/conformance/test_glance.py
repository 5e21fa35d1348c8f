"""Store contract: ``glance``, many rooms' records, sequence and set sizes in one call."""

from __future__ import annotations

import asyncio

import pytest

from agentrooms.errors import BadRequest
from agentrooms.store import Append, Limits, Put, SetAdd, Store
from tests.conftest import Backend


async def test_glance_reads_each_room_in_the_order_asked(store: Store, room: str) -> None:
    a, b, empty = room + "-a", room + "-b", room + "-never"
    await store.transact(
        a,
        writes=[Put("m", {"n": 1}), Put("x", 2), SetAdd("ready", "t1"), SetAdd("ready", "t2")],
        appends=[Append("e", {}), Append("e", {})],
    )
    await store.transact(b, writes=[Put("m", "b")], appends=[Append("e", {})])
    await store.transact(b, writes=[Put("gone", 1, ttl=0.001)])
    await asyncio.sleep(0.01)
    ga, gb, ge = await store.glance([a, b, empty], ["m", "gone", "x"], ["ready", "other"])
    assert (ga.room, gb.room, ge.room) == (a, b, empty)
    assert {k: r.value for k, r in ga.snapshot.records.items()} == {"m": {"n": 1}, "x": 2}
    assert ga.snapshot.records["m"].version == (await store.read(a, ["m"])).version("m")
    assert (ga.last_seq, dict(ga.set_sizes)) == (2, {"ready": 2, "other": 0})
    assert list(gb.snapshot.records) == ["m"]  # the expired record is absent
    assert (gb.last_seq, dict(gb.set_sizes)) == (1, {"ready": 0, "other": 0})
    assert (dict(ge.snapshot.records), ge.last_seq, dict(ge.set_sizes)) == (
        {},
        0,
        {"ready": 0, "other": 0},
    )
    assert ga.snapshot.now > 0
    assert await store.glance([], ["m"]) == []
    (only,) = await store.glance([a], [])
    assert (dict(only.snapshot.records), only.last_seq, dict(only.set_sizes)) == ({}, 2, {})


async def test_glance_input_is_checked(backend: Backend, room: str) -> None:
    store = await backend.open(limits=Limits(max_page=2, max_ops=3))
    try:
        with pytest.raises(BadRequest):
            await store.glance([room, room + "1", room + "2"], ["k"])
        with pytest.raises(BadRequest):
            await store.glance([room], ["a", "b"], ["c", "d"])
        with pytest.raises(BadRequest):
            await store.glance(room, ["k"])
        with pytest.raises(BadRequest):
            await store.glance([room], "k")
        with pytest.raises(BadRequest):
            await store.glance([""], ["k"])
        assert len(await store.glance([room, room + "1"], ["k", "k", "k", "k"])) == 2
    finally:
        await store.close()


async def test_scan_rooms_reads_each_rooms_first_page_in_the_order_asked(
    store: Store, room: str
) -> None:
    a, b, empty = room + "-a", room + "-b", room + "-never"
    await store.transact(a, writes=[Put(f"p/{i}", i) for i in range(3)] + [Put("q/0", 0)])
    await store.transact(b, writes=[Put("p/x", "x"), Put("p/gone", 1, ttl=0.001)])
    await asyncio.sleep(0.01)
    pa, pb, pe = await store.scan_rooms([a, b, empty], "p/", 2)
    assert ([r.key for r in pa.records], pa.next_after) == (["p/0", "p/1"], "p/1")
    assert ([r.value for r in pb.records], pb.next_after) == (["x"], None)  # expired: absent
    assert (pe.records, pe.next_after) == ([], None)
    rest = await store.scan(a, "p/", pa.next_after, 2)
    assert [r.key for r in rest.records] == ["p/2"]
    assert await store.scan_rooms([], "p/") == []
    with pytest.raises(BadRequest):
        await store.scan_rooms(a, "p/")
    with pytest.raises(BadRequest):
        await store.scan_rooms([a], "p/", 0)
