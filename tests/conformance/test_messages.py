"""Addressed events and the inbox (issue #26 item 1) through the library, on every
backend: addressed to an agent, to a role, exactly once with concurrent posters and
readers, at-least-once with explicit ack, and what is not addressed to an agent never in
its inbox."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from agentrooms.errors import BadRequest
from agentrooms.rooms import Room, Rooms
from agentrooms.store import Store


@pytest.fixture
async def room(store: Store) -> Room:
    return await Rooms(store).create(f"m-{uuid.uuid4().hex[:10]}", "messages")


async def test_an_event_addressed_to_an_agent_is_in_its_inbox_only(room: Room) -> None:
    ev = room.events
    await ev.post("note", "for all", author="ann")
    to_bob = await ev.post("msg", "hi bob", author="ann", to=["bob"])
    await ev.post("msg", "hi cy", author="ann", to=["cy"])
    [got] = await ev.read_new("bob", inbox=True)
    assert (got.seq, got.data, got.author, got.to) == (to_bob, "hi bob", "ann", ("bob",))
    assert await ev.read_new("bob", inbox=True) == []
    assert [e.data for e in await ev.read_new("cy", inbox=True)] == ["hi cy"]
    assert await ev.read_new("ann", inbox=True) == []  # its own posts are not for it
    # the full read is a cursor of its own: it still sees everything
    assert [e.type for e in await ev.read_new("bob")] == ["room.created", "note", "msg", "msg"]
    assert await ev.cursor("bob", inbox=True) == await ev.cursor("bob")


async def test_an_event_addressed_to_a_role_is_in_the_inbox_of_every_agent_with_it(
    room: Room,
) -> None:
    ev = room.events
    await ev.post("review", {"pr": 1}, to_roles=["reviewer"])
    await ev.post("deploy", {"pr": 1}, to_roles=["ops"], to=["dee"])
    assert [e.type for e in await ev.read_new("bob", inbox=True, roles=["reviewer"])] == ["review"]
    assert [e.type for e in await ev.read_new("cy", inbox=True, roles=["reviewer", "ops"])] == [
        "review",
        "deploy",
    ]
    assert [e.type for e in await ev.read_new("dee", inbox=True)] == ["deploy"]
    assert await ev.read_new("eve", inbox=True, roles=["writer"]) == []
    [deploy] = await ev.read(2, 10)
    assert (deploy.to, deploy.to_roles) == (("dee",), ("ops",))


async def test_events_not_addressed_to_an_agent_never_reach_its_inbox(room: Room) -> None:
    """Hundreds of events for others, then one for the agent: a small page still finds it
    (the read looks past the others), and pages bounded by ``scan`` say to read again."""
    ev = room.events
    for i in range(30):
        await ev.post("chatter", i, to=["someone-else"] if i % 2 else [])
    mine = await ev.post("msg", "yours", to=["bob"])
    assert [e.seq for e in await ev.read_new("bob", limit=1, inbox=True)] == [mine]
    await ev.post("late", None, to_roles=["other"])
    page = await ev.read_inbox("bob", limit=5)
    assert (page.events, page.more) == ([], False)
    assert page.scanned == await room.store.last_seq(room.name)
    first = await ev.read_inbox("cy", ["other"], limit=5, scan=10)
    assert (first.events, first.scanned, first.more) == ([], 10, True)
    rest = []
    while True:
        page = await ev.read_inbox("cy", ["other"], limit=5, scan=10)
        rest += page.events
        if not page.more:
            break
    assert [e.type for e in rest] == ["late"]


async def test_inbox_is_exactly_once_with_concurrent_posters_and_readers(room: Room) -> None:
    """Four posters address 50 messages each to bob or the 'rev' role while two readers
    sharing bob's name (bob holds 'rev') drain the inbox: each of the 200 is read once."""
    ev = room.events
    got: list[int] = []
    posted: list[int] = []
    done = asyncio.Event()

    async def poster(n: int) -> None:
        for i in range(50):
            if i % 3 == 0:
                posted.append(await ev.post("msg", [n, i], author=f"p{n}", to=["bob"]))
            elif i % 3 == 1:
                posted.append(await ev.post("msg", [n, i], author=f"p{n}", to_roles=["rev"]))
            else:
                await ev.post("noise", [n, i], author=f"p{n}", to=["cy"])
                posted.append(await ev.post("msg", [n, i], to=["bob", "cy"], to_roles=["rev"]))

    async def reader() -> None:
        while not done.is_set():
            got.extend(e.seq for e in await ev.read_new("bob", 7, inbox=True, roles=["rev"]))
            await asyncio.sleep(0)
        got.extend(e.seq for e in await ev.read_new("bob", 1000, inbox=True, roles=["rev"]))

    readers = [asyncio.create_task(reader()) for _ in range(2)]
    await asyncio.gather(*(poster(n) for n in range(4)))
    done.set()
    await asyncio.gather(*readers)
    assert len(posted) == 200
    assert sorted(got) == sorted(posted)  # none lost, none twice


async def test_explicit_ack_redelivers_the_inbox_until_acknowledged(room: Room) -> None:
    ev = room.events
    await ev.post("noise")
    a = await ev.post("msg", 1, to=["bob"])
    await ev.post("noise")
    b = await ev.post("msg", 2, to_roles=["rev"])
    first = await ev.read_new("bob", inbox=True, roles=["rev"], ack="explicit")
    assert [e.seq for e in first] == [a, b]
    assert await ev.cursor("bob", inbox=True) == a - 1  # past what is not for bob only
    again = await ev.read_new("bob", inbox=True, roles=["rev"], ack="explicit")
    assert [e.seq for e in again] == [a, b]  # a crash before ack loses nothing
    assert await ev.ack("bob", a, inbox=True) == a
    assert [e.seq for e in await ev.read_new("bob", inbox=True, roles=["rev"], ack="explicit")] == [
        b
    ]
    assert await ev.ack("bob", b, inbox=True) == b
    assert await ev.read_new("bob", inbox=True, roles=["rev"], ack="explicit") == []
    assert await ev.cursor("bob") == 0  # the full cursor was never moved
    assert await ev.resync("bob", inbox=True) == await room.store.last_seq(room.name)


async def test_subscribe_to_the_inbox_yields_only_what_is_addressed(room: Room) -> None:
    ev = room.events
    seen: list[object] = []

    async def follow() -> None:
        async for event in ev.subscribe("bob", inbox=True, roles=["rev"], wait=0.2):
            seen.append(event.data)
            if len(seen) == 2:
                return

    task = asyncio.create_task(follow())
    await ev.post("noise", 0)
    await ev.post("msg", 1, to=["bob"])
    await ev.post("noise", 2, to=["cy"])
    await ev.post("msg", 3, to_roles=["rev"])
    await asyncio.wait_for(task, 10)
    assert seen == [1, 3]


@pytest.mark.parametrize(
    ("to", "roles"), [("bob", []), (["bad name"], []), ([], ["r/x"]), ([""], [])]
)
async def test_bad_addressees_are_refused_and_nothing_is_posted(
    room: Room, to: object, roles: object
) -> None:
    before = await room.store.last_seq(room.name)
    with pytest.raises(BadRequest):
        await room.events.post("msg", to=to, to_roles=roles)  # type: ignore[arg-type]
    assert await room.store.last_seq(room.name) == before


async def test_a_retried_addressed_post_appends_once(room: Room) -> None:
    ev = room.events
    first = await ev.post("msg", 1, command_id="c1", to=["bob"])
    assert await ev.post("msg", 1, command_id="c1", to=["bob"]) == first
    assert [e.seq for e in await ev.read_new("bob", inbox=True)] == [first]
