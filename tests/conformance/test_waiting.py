"""Waiting in the library (issue #26 item 2), on every backend: ``Plan.claim_next``,
``Plan.claim``, ``Events.read_new`` and ``Events.read_inbox`` with ``wait`` return as
soon as a task or an event arrives through *another* store handle, with the empty answer
after about ``wait`` when nothing happens, and at once when the plan is finished."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

import pytest

from agentrooms.errors import BadRequest, InvalidTransition, LeaseHeld, NotFound
from agentrooms.rooms import Room, Rooms, TaskSpec
from agentrooms.store import Store
from tests.conftest import Backend

# On a loaded machine a call takes seconds; these still tell a wake-up (or an answer at
# once) from sleeping out a 10 s wait
WOKEN = 5.0
AT_ONCE = 3.0


async def later(seconds: float, action: Awaitable[object]) -> None:
    await asyncio.sleep(seconds)
    await action


@pytest.fixture
async def rooms(store: Store, backend: Backend, room: str) -> tuple[Room, Room]:
    """The room through the test's store and through a second handle on the same data."""
    await Rooms(store).create(room)
    return Rooms(store).room(room), Rooms(await backend.open()).room(room)


async def test_claim_next_is_woken_by_a_task_another_handle_adds(
    rooms: tuple[Room, Room],
) -> None:
    mine, other = rooms
    start = time.monotonic()
    adding = asyncio.create_task(later(0.3, other.plan.add([TaskSpec("t1")])))
    lease = await mine.plan.claim_next("w", wait=10)
    took = time.monotonic() - start
    await adding
    assert lease is not None and lease.task_id == "t1"
    assert 0.25 <= took < WOKEN, took


async def test_claim_next_is_none_after_wait_and_not_finished(rooms: tuple[Room, Room]) -> None:
    mine, _ = rooms
    await mine.plan.add([TaskSpec("a"), TaskSpec("b", deps=("a",))])
    await mine.plan.claim("a", "x", ttl=60)
    start = time.monotonic()
    assert await mine.plan.claim_next("w", wait=0.5) is None
    assert 0.45 <= time.monotonic() - start < WOKEN
    assert await mine.plan.finished() is False


async def test_claim_next_answers_at_once_when_the_plan_is_finished(
    rooms: tuple[Room, Room],
) -> None:
    mine, _ = rooms
    assert await mine.plan.finished() is False  # no task yet: work may be added
    await mine.plan.add([TaskSpec("a"), TaskSpec("b")])
    await mine.plan.complete(await mine.plan.claim("a", "x"), None)
    await mine.plan.cancel("b", None)
    start = time.monotonic()
    assert await mine.plan.claim_next("w", wait=10) is None
    assert time.monotonic() - start < AT_ONCE
    assert await mine.plan.finished() is True


async def test_claim_next_waits_for_a_held_lease_to_run_out(rooms: tuple[Room, Room]) -> None:
    mine, _ = rooms
    await mine.plan.add([TaskSpec("a")])
    await mine.plan.claim("a", "x", ttl=0.4)
    start = time.monotonic()
    lease = await mine.plan.claim_next("w", wait=10)
    assert lease is not None and (lease.task_id, lease.agent) == ("a", "w")
    assert time.monotonic() - start < WOKEN


async def test_a_named_claim_waits_for_its_dependency(rooms: tuple[Room, Room]) -> None:
    mine, other = rooms
    await other.plan.add([TaskSpec("a"), TaskSpec("b", deps=("a",))])
    held = await other.plan.claim("a", "x")
    with pytest.raises(InvalidTransition):
        await mine.plan.claim("b", "w")  # no wait: refused at once
    start = time.monotonic()
    finishing = asyncio.create_task(later(0.3, other.plan.complete(held, None)))
    lease = await mine.plan.claim("b", "w", wait=10)
    await finishing
    assert lease.task_id == "b" and time.monotonic() - start < WOKEN


async def test_a_named_claim_raises_the_last_refusal_after_wait(rooms: tuple[Room, Room]) -> None:
    mine, _ = rooms
    start = time.monotonic()
    with pytest.raises(NotFound):
        await mine.plan.claim("later", "w", wait=0.4)  # never added
    assert 0.35 <= time.monotonic() - start < WOKEN
    await mine.plan.add([TaskSpec("a")])
    held = await mine.plan.claim("a", "x", ttl=60)
    with pytest.raises(LeaseHeld):
        await mine.plan.claim("a", "w", wait=0.3)
    await mine.plan.complete(held, None)
    start = time.monotonic()
    with pytest.raises(InvalidTransition):
        await mine.plan.claim("a", "w", wait=10)  # done: refused at once
    assert time.monotonic() - start < AT_ONCE


async def test_read_new_is_woken_by_an_event_another_handle_posts(
    rooms: tuple[Room, Room],
) -> None:
    mine, other = rooms
    await mine.events.read_new("w")  # past room.created
    start = time.monotonic()
    posting = asyncio.create_task(later(0.3, other.events.post("note", {"n": 1}, author="o")))
    events = await mine.events.read_new("w", wait=10)
    await posting
    assert [(e.type, e.data, e.author) for e in events] == [("note", {"n": 1}, "o")]
    assert 0.25 <= time.monotonic() - start < WOKEN
    start = time.monotonic()
    assert await mine.events.read_new("w", wait=0.4) == []
    assert 0.35 <= time.monotonic() - start < WOKEN


async def test_an_inbox_read_waits_past_events_not_for_it(rooms: tuple[Room, Room]) -> None:
    mine, other = rooms

    async def post_two() -> None:
        await other.events.post("chat", "for cy", to=["cy"])
        await asyncio.sleep(0.2)
        await other.events.post("review", {"pr": 7}, to_roles=["reviewer"])

    start = time.monotonic()
    posting = asyncio.create_task(later(0.2, post_two()))
    page = await mine.events.read_inbox("bob", ["reviewer"], wait=10)
    await posting
    assert [e.type for e in page.events] == ["review"] and page.more is False
    assert 0.35 <= time.monotonic() - start < WOKEN
    assert (await mine.events.read_inbox("bob", ["reviewer"], wait=0.3)).events == []
    assert await mine.events.read_new("bob", inbox=True, roles=["reviewer"], wait=0) == []


@pytest.mark.parametrize("wait", [-1, float("nan"), float("inf"), True, "1"])
async def test_a_bad_wait_is_refused(rooms: tuple[Room, Room], wait: object) -> None:
    mine, _ = rooms
    with pytest.raises(BadRequest, match="wait"):
        await mine.plan.claim_next("w", wait=wait)  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="wait"):
        await mine.events.read_new("w", wait=wait)  # type: ignore[arg-type]
