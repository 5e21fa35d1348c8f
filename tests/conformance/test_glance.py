"""Store contract: ``glance``, ``scan_rooms`` and ``scan_keys``, many rooms' records (or
keys), sequence and set sizes in one call, and one request: one worker job (SQLite), one
statement (PostgreSQL), one write on the wire (Redis), one write to each primary that owns
some of the rooms (Redis Cluster)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agentrooms.errors import BadRequest
from agentrooms.store import Append, Delete, Limits, Put, SetAdd, Store
from agentrooms.store.postgres.backend import PostgresStore
from agentrooms.store.redis.backend import RedisStore
from agentrooms.store.redis.cluster import RedisClusterStore
from agentrooms.store.sqlite.backend import SqliteStore
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


async def test_scan_rooms_reads_each_room_after_a_key(store: Store, room: str) -> None:
    a, b = room + "-a", room + "-b"
    await store.transact(a, writes=[Put(f"p/{i}", i) for i in range(4)] + [Put("q/0", 0)])
    await store.transact(b, writes=[Put("p/0", "b0")])
    pa, pb = await store.scan_rooms([a, b], "p/", 2, after="p/0")
    assert ([r.key for r in pa.records], pa.next_after) == (["p/1", "p/2"], "p/2")
    assert (pb.records, pb.next_after) == ([], None)
    (whole,) = await store.scan_rooms([a], "", 10, after="o")  # no prefix: to the room's end
    assert [r.key for r in whole.records] == ["p/0", "p/1", "p/2", "p/3", "q/0"]
    (before,) = await store.scan_rooms([a], "p/", 10, after="a")  # after sorts before prefix
    assert [r.key for r in before.records] == ["p/0", "p/1", "p/2", "p/3"]
    with pytest.raises(BadRequest):
        await store.scan_rooms([a], "p/", 2, after="")


async def test_scan_keys_reads_each_rooms_keys_as_scan_rooms_does(store: Store, room: str) -> None:
    a, b, empty = room + "-a", room + "-b", room + "-never"
    await store.transact(a, writes=[Put(f"p/{i}", i) for i in range(4)] + [Put("q/0", 0)])
    await store.transact(b, writes=[Put("p/x", "x"), Put("p/gone", 1, ttl=0.001)])
    await store.transact(b, writes=[Put("p/y", "y")])
    await store.transact(b, writes=[Delete("p/y")])
    await asyncio.sleep(0.01)
    pa, pb, pe = await store.scan_keys([a, b, empty], "p/", 2)
    assert (pa.keys, pa.next_after) == (["p/0", "p/1"], "p/1")
    assert (pb.keys, pb.next_after) == (["p/x"], None)  # expired or deleted: absent
    assert (pe.keys, pe.next_after) == ([], None)
    (rest,) = await store.scan_keys([a], "p/", 2, after=pa.next_after)
    assert (rest.keys, rest.next_after) == (["p/2", "p/3"], None)
    (whole,) = await store.scan_keys([a], "", 10, after="o")  # no prefix: to the room's end
    assert whole.keys == ["p/0", "p/1", "p/2", "p/3", "q/0"]
    (before,) = await store.scan_keys([a], "p/", 10, after="a")  # after sorts before prefix
    assert before.keys == ["p/0", "p/1", "p/2", "p/3"]
    for keys, records in zip(
        await store.scan_keys([a, b], "", 3),
        await store.scan_rooms([a, b], "", 3),
        strict=True,
    ):
        assert (keys.keys, keys.next_after) == (
            [r.key for r in records.records],
            records.next_after,
        )
    assert await store.scan_keys([], "p/") == []
    with pytest.raises(BadRequest):
        await store.scan_keys(a, "p/")
    with pytest.raises(BadRequest):
        await store.scan_keys([a], "p/", 0)
    with pytest.raises(BadRequest):
        await store.scan_keys([a], "p/", 2, after="")


def _requests(store: Store, monkeypatch: pytest.MonkeyPatch) -> Callable[[], dict[Any, int]]:
    """The requests ``store`` has sent so far, per server it sends them to."""
    if isinstance(store, RedisClusterStore):
        return lambda: {
            address: node._wire.writes
            for address, node in store._nodes.items()
            if node._wire is not None
        }
    if isinstance(store, RedisStore):
        return lambda: {"redis": 0 if store._wire is None else store._wire.writes}
    counted = {"server": 0}
    name = "_call" if isinstance(store, SqliteStore) else "_fetch"
    assert isinstance(store, (SqliteStore, PostgresStore)), store
    sent = getattr(store, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        counted["server"] += 1
        return sent(*args, **kwargs)

    monkeypatch.setattr(store, name, counting)
    return lambda: dict(counted)


@pytest.mark.parametrize("call", ["scan_rooms", "scan_keys", "glance"])
async def test_many_rooms_are_one_request(
    store: Store, room: str, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    if store.backend == "memory":
        pytest.skip("the memory store sends no requests")
    rooms = [f"{room}-{i:02d}" for i in range(40)]
    for name in rooms:
        await store.transact(name, writes=[Put("p/a", name), Put("p/b", name)])
    requests = _requests(store, monkeypatch)
    before = requests()
    if call == "scan_rooms":
        pages = await store.scan_rooms(rooms, "p/", 1)
        assert [(p.records[0].value, p.next_after) for p in pages] == [(r, "p/a") for r in rooms]
    elif call == "scan_keys":
        keys = await store.scan_keys(rooms, "p/", 1)
        assert [(p.keys, p.next_after) for p in keys] == [(["p/a"], "p/a")] * len(rooms)
    else:
        glances = await store.glance(rooms, ["p/b"], [])
        assert [g.snapshot.value("p/b") for g in glances] == rooms
    after = requests()
    assert after.keys() == before.keys()
    sent = {server: after[server] - before[server] for server in after}
    if isinstance(store, RedisClusterStore):  # 40 rooms: some on every primary
        assert len(sent) == len(store.shards) > 1
    assert set(sent.values()) == {1}, sent
