"""Issue #22's remaining authors, on every backend: room.created and room.archived,
effect.requested (Outbox.request and request_effects), wq.submitted and the sourcing
domain events name the agent the caller gave; without one they name none, as before."""

from __future__ import annotations

import uuid

import pytest

from agentrooms.commit import Change, Intent, View
from agentrooms.effects import EffectRequest, Outbox, request_effects
from agentrooms.errors import BadRequest
from agentrooms.rooms import Room, Rooms
from agentrooms.sourcing import Aggregates
from agentrooms.store import Append, Put, Store
from agentrooms.writer import IntentQueue
from tests.conformance import sourcing_workers as w


@pytest.fixture
async def room(store: Store) -> Room:
    return await Rooms(store).create(f"au-{uuid.uuid4().hex[:10]}", author="maker")


async def authors(room: Room, prefix: str) -> list[tuple[str, str | None]]:
    log = await room.store.read_log(room.name, 0, 10_000)
    return [(e.type, e.author) for e in log if e.type.startswith(prefix)]


async def test_room_created_and_archived_name_their_agent(store: Store, room: Room) -> None:
    await Rooms(store).archive(room.name, author="keeper")
    assert await authors(room, "room.") == [("room.created", "maker"), ("room.archived", "keeper")]
    plain = await Rooms(store).create(f"au-{uuid.uuid4().hex[:10]}")
    assert await authors(plain, "room.") == [("room.created", None)]
    with pytest.raises(BadRequest):
        await Rooms(store).create(f"au-{uuid.uuid4().hex[:10]}", author="no spaces")


async def test_effect_requested_names_the_requesting_agent(room: Room) -> None:
    outbox = Outbox(room)
    await outbox.request("op-1", "notify", {"i": 1}, author="ann")
    await outbox.request("op-2", "notify", {"i": 2})

    def ship(view: View, _: None) -> Change:
        change = Change(writes=[Put("order/o1", {"status": "shipped"})])
        return request_effects(view, change, EffectRequest("mail-o1", "mail", author="bob"))

    await room.scope.commit(ship, None, ["order/o1"])
    assert await authors(room, "effect.requested") == [
        ("effect.requested", "ann"),
        ("effect.requested", None),
        ("effect.requested", "bob"),
    ]


async def test_wq_submitted_names_the_submitting_agent(room: Room) -> None:
    queue = IntentQueue(room)
    await queue.submit(Intent([], [Put("a", 1)], [Append("item")]), author="cy")
    await queue.submit(Intent([], [Put("b", 1)], [Append("item")]))
    assert await authors(room, "wq.submitted") == [("wq.submitted", "cy"), ("wq.submitted", None)]


async def test_domain_events_name_the_agent_appending_or_commanding(
    store: Store, room: Room
) -> None:
    tasks = Aggregates(store, room.name, w.TASK)
    await tasks.append("t1", [w.created("write docs")], author="dee")
    await tasks.execute("t1", lambda state, note: [w.noted(note)], "n", author="eve")
    await tasks.append("t1", [w.noted("anonymous")])
    log = await store.read_log(room.name, 0, 10_000)
    assert [e.author for e in log if e.data and "aggregate" in e.data] == ["dee", "eve", None]
