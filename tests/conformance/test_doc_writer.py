"""A document's writer, on every backend: recorded with each version in the same transact
as the value, so the library (get, list, page) and the operator read model show the
agent that wrote the current version however many events came after it; a rewrite
shows the new writer, a write naming no author shows none, a delete takes it away."""

from __future__ import annotations

import uuid

import pytest

from agentrooms.errors import VersionConflict
from agentrooms.ops import Ops
from agentrooms.rooms import Room, Rooms
from agentrooms.rooms import keys as room_keys
from agentrooms.store import Store

NOISE = 100  # events by others after the write, more than the room page's event window


async def writers(store: Store, room: Room, name: str) -> set[str | None]:
    """The writer of ``name`` as every reader shows it (one value when they agree)."""
    got = await room.docs.get(name)
    (listed,) = [d for d in await room.docs.list() if d.name == name]
    (paged,) = [d for d in (await room.docs.page(limit=1000)).documents if d.name == name]
    (row,) = [d for d in (await Ops(store).room(room.name)).documents if d.name == name]
    assert got.version == listed.version == paged.version == row.version
    return {got.writer, listed.writer, paged.writer, row.last_writer}


async def noise(room: Room) -> None:
    for i in range(NOISE // 2):
        await room.docs.put(f"other-{i % 5}", {"i": i}, author="bystander")
        await room.events.post("note", {"i": i}, author="chatter")


async def test_the_writer_of_a_document_outlives_any_number_of_events(store: Store) -> None:
    room = await Rooms(store).create(f"dw-outlives-{uuid.uuid4().hex[:8]}")
    written = await room.docs.put("plan", {"v": 1}, create_only=True, author="ann")
    assert written.writer == "ann"
    await noise(room)
    assert await writers(store, room, "plan") == {"ann"}
    again = await room.docs.put("plan", {"v": 2}, if_match=written.version, author="bob")
    assert (again.writer, (await room.docs.get("plan")).value) == ("bob", {"v": 2})
    assert await writers(store, room, "plan") == {"bob"}
    await noise(room)
    assert await writers(store, room, "plan") == {"bob"}


async def test_a_write_naming_no_author_clears_the_writer(store: Store) -> None:
    room = await Rooms(store).create(f"dw-anonymous-{uuid.uuid4().hex[:8]}")
    await room.docs.put("notes", [1], author="ann")
    await room.docs.put("notes", [2])
    assert await writers(store, room, "notes") == {None}


async def test_a_delete_takes_the_writer_with_the_document(store: Store) -> None:
    room = await Rooms(store).create(f"dw-delete-{uuid.uuid4().hex[:8]}")
    first = await room.docs.put("part/spec", "x", author="ann")
    await room.docs.delete("part/spec", if_match=first.version, author="bob")
    snapshot = await store.read(room.name, [room_keys.doc_writer("part/spec")])
    assert snapshot.get(room_keys.doc_writer("part/spec")) is None
    await room.docs.put("part/spec", "y", create_only=True)
    assert await writers(store, room, "part/spec") == {None}
    assert [d.writer for d in await room.docs.list("part")] == [None]


async def test_a_failed_write_leaves_the_writer_and_a_replay_names_the_first(
    store: Store,
) -> None:
    room = await Rooms(store).create(f"dw-failed-{uuid.uuid4().hex[:8]}")
    doc = await room.docs.put("cfg", {"a": 1}, author="ann", command_id="c1")
    with pytest.raises(VersionConflict):
        await room.docs.put("cfg", {"a": 2}, if_match=doc.version + 5, author="bob")
    replay = await room.docs.put("cfg", {"a": 1}, author="ann", command_id="c1")
    assert (replay.version, replay.writer) == (doc.version, "ann")
    assert await writers(store, room, "cfg") == {"ann"}
