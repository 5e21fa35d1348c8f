"""Store contract, second part: sets with pick, watch, and room deletion — every backend."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from agentrooms.errors import BadRequest, CursorCompacted, VersionConflict
from agentrooms.store import (
    Absent,
    Append,
    Put,
    SetAdd,
    SetRemove,
    Store,
    VersionIs,
)
from tests.conformance import workers
from tests.conftest import Backend

# ------------------------------------------------------------------------------ sets


async def test_set_add_remove_size(store: Store, room: str) -> None:
    await store.transact(room, writes=[SetAdd("ready", m) for m in ("t3", "t1", "t2")])
    assert await store.set_size(room, "ready") == 3
    await store.transact(room, writes=[SetAdd("ready", "t1"), SetRemove("ready", "t2")])
    assert await store.set_size(room, "ready") == 2
    await store.transact(room, writes=[SetRemove("ready", "never-there")])
    assert await store.set_size(room, "ready") == 2
    assert await store.set_size(room, "other") == 0
    assert await store.set_size(room + "-x", "ready") == 0


async def test_pick_order_fresh_first_then_least_recently_picked(store: Store, room: str) -> None:
    await store.transact(room, writes=[SetAdd("s", m) for m in ("c", "a", "b", "d")])
    assert await store.set_pick(room, "s", 2) == ["a", "b"]
    assert await store.set_pick(room, "s", 1) == ["c"]
    assert await store.set_pick(room, "s", 3) == ["d", "a", "b"]
    assert await store.set_pick(room, "s", 1) == ["c"]
    await store.transact(room, writes=[SetAdd("s", "e"), SetRemove("s", "d")])
    assert await store.set_pick(room, "s", 10) == ["e", "a", "b", "c"]
    assert await store.set_size(room, "s") == 4  # picking does not remove
    # a removed and re-added member is fresh again
    await store.transact(room, writes=[SetRemove("s", "b")])
    await store.transact(room, writes=[SetAdd("s", "b")])
    assert await store.set_pick(room, "s", 1) == ["b"]
    assert await store.set_pick(room, "empty", 5) == []


async def test_concurrent_pickers_get_different_members(backend: Backend, room: str) -> None:
    setup = await backend.open()
    await setup.transact(room, writes=[SetAdd("ready", f"t{i:03}") for i in range(100)])
    stores = [await backend.open() for _ in range(16)]
    barrier = asyncio.Barrier(16)

    async def pick(s: Store) -> list[str]:
        await barrier.wait()
        return await s.set_pick(room, "ready", 3)

    picks = [m for ms in await asyncio.gather(*(pick(s) for s in stores)) for m in ms]
    assert len(picks) == 48 and len(set(picks)) == 48
    assert set(picks) == {f"t{i:03}" for i in range(48)}
    for s in {*stores, setup}:
        await s.close()


async def test_set_ops_are_atomic_with_the_transact(store: Store, room: str) -> None:
    v = (await store.transact(room, writes=[Put("task/a", "ready"), SetAdd("ready", "a")])).versions
    await store.transact(room, writes=[Put("task/a", "changed")])
    with pytest.raises(VersionConflict):
        await store.transact(
            room,
            [VersionIs("task/a", v["task/a"])],
            [Put("task/a", "claimed"), SetRemove("ready", "a"), SetAdd("ready", "b")],
        )
    assert await store.set_pick(room, "ready", 5) == ["a"]


async def test_set_ops_never_conflict_with_each_other(backend: Backend, room: str) -> None:
    stores = [await backend.open() for _ in range(8)]

    async def add(i: int, s: Store) -> None:
        for j in range(10):
            await s.transact(room, writes=[SetAdd("ready", f"{i}-{j}")])

    await asyncio.gather(*(add(i, s) for i, s in enumerate(stores)))
    assert await stores[0].set_size(room, "ready") == 80
    for s in set(stores):
        await s.close()


@pytest.mark.parametrize(
    "write",
    [SetAdd("", "m"), SetAdd("s", ""), SetRemove("s", "x\x00"), SetAdd("s", "m" * 2000)],
)
async def test_bad_set_operations(store: Store, room: str, write: SetAdd) -> None:
    with pytest.raises(BadRequest):
        await store.transact(room, writes=[Put("k", 1), write])
    assert (await store.read(room, ["k"])).get("k") is None
    with pytest.raises(BadRequest):
        await store.set_pick(room, "s", 0)
    with pytest.raises(BadRequest):
        await store.set_pick(room, "", 1)


# ----------------------------------------------------------------------------- watch


async def test_watch_returns_at_once_when_behind(store: Store, room: str) -> None:
    await store.transact(room, appends=[Append("a"), Append("b")])
    t0 = time.monotonic()
    assert await store.watch(room, 0, 10) == 2
    assert await store.watch(room, 1, 10) == 2
    assert time.monotonic() - t0 < 2


async def test_watch_times_out(store: Store, room: str) -> None:
    await store.transact(room, appends=[Append("a")])
    t0 = time.monotonic()
    assert await store.watch(room, 1, 0.3) == 1
    assert 0.25 <= time.monotonic() - t0 < 3
    assert await store.watch(room, 1, 0) == 1


async def test_watch_is_woken_by_an_append(backend: Backend, room: str) -> None:
    waiter, writer = await backend.open(), await backend.open()

    async def append_later() -> None:
        await asyncio.sleep(0.3)
        await writer.transact(room, appends=[Append("wake")])

    t0 = time.monotonic()
    task = asyncio.create_task(append_later())
    assert await waiter.watch(room, 0, 20) == 1
    assert time.monotonic() - t0 < 5  # woken, not timed out
    await task
    for s in {waiter, writer}:
        await s.close()


@pytest.mark.slow
async def test_watch_is_woken_by_another_process(backend: Backend, room: str) -> None:
    if not backend.shared_across_processes:
        pytest.skip("memory:// is private to one process")
    waiter = await backend.open()
    loop = asyncio.get_running_loop()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        t0 = time.monotonic()
        appended = loop.run_in_executor(pool, workers.append_after, backend.url, room, 1.0)
        seq = await waiter.watch(room, 0, 30)
        waited = time.monotonic() - t0
        await appended
    assert seq == 1
    assert waited < 10
    await waiter.close()


async def test_bad_watch_arguments(store: Store, room: str) -> None:
    for timeout in (-1, 10_000, "1"):
        with pytest.raises(BadRequest):
            await store.watch(room, 0, timeout)  # type: ignore[arg-type]


async def test_follow_log_returns_the_events(backend: Backend, room: str) -> None:
    waiter, writer = await backend.open(), await backend.open()
    await writer.transact(room, appends=[Append("a", 1), Append("b", 2)])
    got = await waiter.follow_log(room, 0, 10)
    assert [(e.seq, e.type, e.data) for e in got] == [(1, "a", 1), (2, "b", 2)]
    assert [e.seq for e in await waiter.follow_log(room, 0, 10, limit=1)] == [1]

    async def append_later() -> None:
        await asyncio.sleep(0.3)
        await writer.transact(room, appends=[Append("c", {"k": [3]}, author="w")])

    t0 = time.monotonic()
    task = asyncio.create_task(append_later())
    woken = await waiter.follow_log(room, 2, 20)
    assert time.monotonic() - t0 < 5  # woken by the append, not timed out
    assert [(e.seq, e.type, e.data, e.author) for e in woken] == [(3, "c", {"k": [3]}, "w")]
    assert woken == await waiter.read_log(room, 2)  # the same events, times included
    await task
    t0 = time.monotonic()
    assert await waiter.follow_log(room, 3, 0.3) == []
    assert 0.25 <= time.monotonic() - t0 < 3
    assert await waiter.follow_log(room, 3, 0) == []
    for s in {waiter, writer}:
        await s.close()


async def test_follow_log_reports_a_trimmed_log(store: Store, room: str) -> None:
    await store.transact(room, appends=[Append("a"), Append("b"), Append("c")])
    await store.trim_log(room, 3)
    with pytest.raises(CursorCompacted):
        await store.follow_log(room, 1, 5)
    assert [e.seq for e in await store.follow_log(room, 2, 5)] == [3]
    await store.delete_room(room)  # the sequence goes on, the entries are gone
    with pytest.raises(CursorCompacted):
        await store.follow_log(room, 2, 0.5)


async def test_bad_follow_log_arguments(store: Store, room: str) -> None:
    for timeout in (-1, 10_000, "1", float("nan")):
        with pytest.raises(BadRequest):
            await store.follow_log(room, 0, timeout)  # type: ignore[arg-type]
    for limit in (0, -1):
        with pytest.raises(BadRequest):
            await store.follow_log(room, 0, 1, limit)


# ----------------------------------------------------------------------- delete room


async def test_delete_room_removes_everything_but_keeps_counters(store: Store, room: str) -> None:
    other = room + "-kept"
    first = await store.transact(
        room,
        writes=[Put("a", 1), Put("b", 2), SetAdd("ready", "t1")],
        appends=[Append("e1"), Append("e2")],
    )
    await store.transact(other, writes=[Put("a", "other")], appends=[Append("o")])
    await store.delete_room(room)
    assert (await store.read(room, ["a", "b"])).records == {}
    assert (await store.scan(room)).records == []
    assert await store.set_size(room, "ready") == 0
    assert await store.last_seq(room) == 2
    with pytest.raises(CursorCompacted):
        await store.read_log(room, 0)
    assert await store.read_log(room, 2) == []
    again = await store.transact(room, [Absent("a")], [Put("a", 3)], [Append("e3")])
    assert again.seqs == [3]
    assert again.versions["a"] > first.versions["a"]
    assert (await store.read(other, ["a"])).value("a") == "other"
    assert [e.type for e in await store.read_log(other)] == ["o"]
    await store.delete_room(room + "-never-existed")
