"""The per-handle contention table: labels name one record, stay bounded, skip the
room-guard keys and the internal rooms, and a closing handle writes what it counted."""

from __future__ import annotations

import pytest

from agentrooms.ops import Ops
from agentrooms.rooms import Rooms
from agentrooms.store import open_store
from agentrooms.store.contention import MAX_LABELS, MAX_ROOMS, ROOM, label
from tests.conftest import Backend


def test_labels_name_a_record_or_its_collection() -> None:
    assert label("task/t1") == "task/t1"
    assert label("lockq/build/3f2a") == "lockq/build/"
    assert label("wq/main/i/x") == "wq/main/"
    assert label("hot") == "hot"


async def test_the_table_is_bounded() -> None:
    store = await open_store("memory://")
    try:
        table = store.contention
        table.note("r", [f"doc/d{i}" for i in range(MAX_LABELS * 3)])
        table.note("r", [f"k{i}" for i in range(MAX_LABELS * 3)])
        counts = table.local("r")
        assert len(counts) <= MAX_LABELS + 9
        assert counts["doc/*"] == MAX_LABELS * 2
        assert sum(counts.values()) == MAX_LABELS * 6
        for i in range(MAX_ROOMS + 5):
            table.note(f"room{i}", ["x/y"])
        assert table.dropped == 6  # "r" took one of the MAX_ROOMS places
        table.note("_auth", ["tok/1"])
        table.note("r2", ["_meta", "_archived"])
        assert table.local("_auth") == {} and table.local("r2") == {}
    finally:
        await store.close()


async def test_a_closing_handle_writes_its_counts(backend: Backend, room: str) -> None:
    if not backend.shared_across_processes:
        pytest.skip("a memory store's data goes with its handle")
    store = await backend.open()
    await Rooms(store).create(room)
    for _ in range(4):
        store.contention.note(room, ["doc/a"])
    await store.close()  # the first flush ran at once; close writes the rest
    reader = await backend.open()
    assert [(c.prefix, c.conflicts) for c in await Ops(reader).contention(room)] == [("doc/a", 4)]
    assert (await reader.scan(ROOM, f"{room}/")).records[0].value["room"] == room
