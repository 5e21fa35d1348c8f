"""What the conformance suite does not reach: reads that span scan pages, the blocking
methods (from another thread, and refused on the store's own loop), odd thread ids."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from agentrooms.errors import BadRequest
from agentrooms.integrations.langgraph import AgentroomsSaver, ThreadHeld, layout
from agentrooms.integrations.langgraph.saver import PAGE
from agentrooms.store import open_store
from tests.conftest import Backend
from tests.langgraph.test_fork import checkpoint, config


async def test_lists_and_writes_that_span_pages(backend: Backend, room: str) -> None:
    saver = AgentroomsSaver(await backend.open(), owner="agent-a", room=room)
    thread = f"t-{uuid.uuid4().hex}"
    ids: list[str] = []
    parent = config(thread)
    for step in range(PAGE + 5):
        cp = checkpoint(f"n{step}", step)
        parent = await saver.aput(parent, cp, {"source": "loop", "step": step}, {"note": step})
        ids.append(cp["id"])
    middle = config(thread)
    middle["configurable"]["checkpoint_id"] = ids[PAGE // 2]
    writes = [(f"ch{i}", i) for i in range(PAGE + 3)]
    await saver.aput_writes(middle, writes, "task-1", "~path")
    await saver.aput_writes(middle, [("first", "x")], "task-0", "")

    listed = [t.checkpoint["id"] async for t in saver.alist(config(thread))]
    assert listed == ids[::-1]
    before = [t.checkpoint["id"] async for t in saver.alist(config(thread), before=middle)]
    assert before == ids[: PAGE // 2][::-1]
    some = [
        t.metadata["step"]
        async for t in saver.alist(config(thread), filter={"source": "loop"}, limit=PAGE + 1)
    ]
    assert some == list(range(PAGE + 4, 3, -1))
    got = await saver.aget_tuple(middle)
    assert got is not None and got.pending_writes is not None
    assert got.pending_writes[0] == ("task-0", "first", "x")  # writes_sort_key order
    assert got.pending_writes[1:] == [("task-1", c, v) for c, v in writes]
    assert got.checkpoint["channel_values"] == {"note": f"n{PAGE // 2}"}
    newest = await saver.aget_tuple(config(thread))
    assert newest is not None and newest.pending_writes == []


@pytest.mark.parametrize("thread", ["a/b c", "ü" * 130, "thread:x", "~"])
async def test_any_thread_id_is_its_own_thread(thread: str, room: str) -> None:
    async with await open_store("memory://") as store:
        saver = AgentroomsSaver(store, owner="agent-a", room=room)
        await saver.aput(config(thread), checkpoint("mine"), {"step": 0}, {"note": 1})
        await saver.aput(config(thread + "x"), checkpoint("other"), {"step": 0}, {"note": 1})
        got = [t.checkpoint["channel_values"]["note"] async for t in saver.alist(config(thread))]
        assert got == ["mine"]
        assert await saver.aowner(thread) == "agent-a"
        await saver.adelete_thread(thread)
        assert await saver.aget_tuple(config(thread)) is None
        assert await saver.aget_tuple(config(thread + "x")) is not None


async def test_blocking_methods_from_another_thread(backend: Backend, room: str) -> None:
    a = AgentroomsSaver(await backend.open(), owner="agent-a", room=room)
    b = AgentroomsSaver(await backend.open(), owner="agent-b", room=room)
    thread = f"t-{uuid.uuid4().hex}"
    await a.aput(config(thread), checkpoint("P"), {"step": -1}, {"note": 1})
    assert await b.aowner(thread) == "agent-a"  # both savers know their loop now

    def blocking() -> tuple[list[str], bool]:
        head = a.get_tuple(config(thread))
        assert head is not None
        stored = a.put(head.config, checkpoint("A", 2), {"step": 0}, {"note": 2})
        a.put_writes(stored, [("ch", "v")], "task")
        with pytest.raises(ThreadHeld):
            b.put(head.config, checkpoint("B", 3), {"step": 0}, {"note": 3})
        with pytest.raises(ThreadHeld):
            b.put_writes(stored, [("ch", "w")], "task-b")
        notes = [t.checkpoint["channel_values"]["note"] for t in a.list(config(thread))]
        a.delete_thread(thread)
        return notes, a.get_tuple(config(thread)) is None

    notes, gone = await asyncio.to_thread(blocking)
    assert notes == ["A", "P"] and gone


async def test_a_blocking_call_on_the_stores_own_loop_is_refused(
    backend: Backend, room: str
) -> None:
    saver = AgentroomsSaver(await backend.open(), owner="agent-a", room=room)
    with pytest.raises(BadRequest, match="event loop"):
        saver.get_tuple(config("t"))  # before any async call: no loop to run on
    assert await saver.aget_tuple(config("t")) is None
    with pytest.raises(BadRequest, match="event loop"):
        saver.get_tuple(config("t"))  # on the loop it would wait for


async def test_copy_and_prune_are_fenced_on_the_thread_they_write(
    backend: Backend, room: str
) -> None:
    a = AgentroomsSaver(await backend.open(), owner="agent-a", room=room)
    b = AgentroomsSaver(await backend.open(), owner="agent-b", room=room)
    mine, theirs, free = (f"t-{uuid.uuid4().hex}" for _ in range(3))
    parent = config(mine)
    for step in range(3):
        parent = await a.aput(parent, checkpoint(f"n{step}", step), {"step": step}, {"note": step})
    await b.aput(config(theirs), checkpoint("b", 1), {"step": 0}, {"note": 1})
    with pytest.raises(ThreadHeld) as held:
        await a.acopy_thread(mine, theirs)
    assert held.value.holder == "agent-b"
    with pytest.raises(ThreadHeld):
        await a.aprune([theirs])
    assert [t.checkpoint["channel_values"]["note"] async for t in a.alist(config(theirs))] == ["b"]

    await a.acopy_thread(mine, free)
    copied = [t async for t in a.alist(config(free))]
    assert [t.checkpoint["channel_values"]["note"] for t in copied] == ["n2", "n1", "n0"]
    assert all(t.config["configurable"]["thread_id"] == free for t in copied)
    assert await a.aowner(free) is None  # taken for the copy, given up after
    await a.aprune([mine])
    kept = [t.checkpoint["channel_values"]["note"] async for t in a.alist(config(mine))]
    assert kept == ["n2"] and await a.aowner(mine) == "agent-a"  # owned before: still


async def test_the_run_index_follows_deletes(backend: Backend, room: str) -> None:
    saver = AgentroomsSaver(await backend.open(), owner="agent-a", room=room)
    one, two = f"t-{uuid.uuid4().hex}", f"t-{uuid.uuid4().hex}"
    for thread in (one, two):
        await saver.aput(config(thread), checkpoint("x"), {"step": 0, "run_id": "run-1"}, {})
    await saver.aput(config(two), checkpoint("y"), {"step": 1, "run_id": "run-2"}, {})

    async def index() -> list[str]:
        page = await saver.store.scan(room, layout.RUNS, None, 100)
        return sorted(r.key.split("/")[1] for r in page.records)

    assert await index() == ["run-1", "run-1", "run-2"]
    await saver.adelete_thread(one)
    assert await index() == ["run-1", "run-2"]
    await saver.adelete_for_runs(["run-1"])
    assert await index() == ["run-2"]
    left = [t.checkpoint["channel_values"] async for t in saver.alist(config(two))]
    assert len(left) == 1 and await saver.aget_tuple(config(one)) is None


async def test_prune_keep_latest_refuses_a_delta_channel_thread(room: str) -> None:
    async with await open_store("memory://") as store:
        saver = AgentroomsSaver(store, owner="agent-a", room=room)
        metadata: Any = {"step": 0, "counters_since_delta_snapshot": {"note": [1, 1]}}
        await saver.aput(config("t"), checkpoint("x"), metadata, {})
        with pytest.raises(BadRequest, match="DeltaChannel"):
            await saver.aprune(["t"])
        assert await saver.aget_tuple(config("t")) is not None
        await saver.aprune(["t"], strategy="delete")
        assert await saver.aget_tuple(config("t")) is None


@pytest.mark.parametrize(
    ("options", "message"),
    [({"owner": "no spaces"}, "owner"), ({"owner": "a", "ttl": 0}, "ttl")],
)
async def test_a_bad_owner_or_ttl_is_refused_up_front(options: Any, message: str) -> None:
    async with await open_store("memory://") as store:
        with pytest.raises(BadRequest, match=message):
            AgentroomsSaver(store, **options)


def test_a_blocking_call_whose_loop_stopped_is_refused() -> None:
    async def opened() -> AgentroomsSaver:
        saver = AgentroomsSaver(await open_store("memory://"), owner="agent-a")
        await saver.aget_tuple(config("t"))
        return saver

    saver = asyncio.run(opened())
    with pytest.raises(BadRequest, match="event loop"):
        saver.get_tuple(config("t"))


async def test_a_run_id_that_is_not_a_string_is_indexed_as_one(room: str) -> None:
    async with await open_store("memory://") as store:
        saver = AgentroomsSaver(store, owner="agent-a", room=room)
        run = uuid.uuid4()
        await saver.aput(config("t"), checkpoint("x"), {"step": 0, "run_id": run}, {})  # type: ignore[typeddict-item]
        await saver.adelete_for_runs([str(run)])
        assert await saver.aget_tuple(config("t")) is None
