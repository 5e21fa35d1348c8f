"""claim_task and read_new_events with wait: woken by the store's watch as soon as work
or an event arrives (from another store handle), back after about wait with the
"nothing ready" answer when nothing happens, and at once when the plan is finished.
Through the SDK's in-process client, on every backend."""

from __future__ import annotations

import asyncio
import time

from mcp import Client

from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.server.mcp import build_mcp
from agentrooms.store import Store
from tests.conftest import Backend
from tests.mcp.support import call, err, ok


async def later(seconds: float, action: object) -> None:
    await asyncio.sleep(seconds)
    assert asyncio.iscoroutine(action)
    await action


async def test_claim_waits_for_a_task_another_handle_adds(
    store: Store, backend: Backend, room: str
) -> None:
    await Rooms(store).create(room)
    other = Rooms(await backend.open()).room(room)
    async with Client(build_mcp(store, agent="w")) as client:
        start = time.monotonic()
        adding = asyncio.create_task(later(0.5, other.plan.add([TaskSpec("t1")])))
        body = ok(await call(client, "claim_task", room=room, wait=10))
        took = time.monotonic() - start
        await adding
        assert body["claimed"] is True and body["task"]["id"] == "t1"
        assert took < 1.5, took


async def test_claim_named_waits_for_its_dependency_to_finish(
    store: Store, backend: Backend, room: str
) -> None:
    await Rooms(store).create(room)
    other = Rooms(await backend.open()).room(room)
    await other.plan.add([TaskSpec("a"), TaskSpec("b", deps=("a",))])
    lease = await other.plan.claim("a", "x")
    async with Client(build_mcp(store, agent="w")) as client:
        start = time.monotonic()
        finishing = asyncio.create_task(later(0.5, other.plan.complete(lease, None)))
        body = ok(await call(client, "claim_task", room=room, task_id="b", wait=10))
        took = time.monotonic() - start
        await finishing
        assert body["claimed"] is True and body["task"]["id"] == "b"
        assert took < 1.5, took


async def test_nothing_ready_after_about_wait(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    await Rooms(store).room(room).plan.add([TaskSpec("a"), TaskSpec("b", deps=("a",))])
    await Rooms(store).room(room).plan.claim("a", "x", ttl=60)
    async with Client(build_mcp(store, agent="w")) as client:
        start = time.monotonic()
        body = ok(await call(client, "claim_task", room=room, wait=0.6))
        took = time.monotonic() - start
        assert body["claimed"] is False and body["finished"] is False
        assert "wait" in body["hint"]
        assert 0.55 <= took < 1.5, took


async def test_finished_plan_answers_at_once(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    plan = Rooms(store).room(room).plan
    await plan.add([TaskSpec("a"), TaskSpec("b")])
    await plan.complete(await plan.claim("a", "x"), None)
    await plan.cancel("b", None)
    async with Client(build_mcp(store, agent="w")) as client:
        start = time.monotonic()
        body = ok(await call(client, "claim_task", room=room, wait=10))
        assert time.monotonic() - start < 1.0
        assert body == {
            "claimed": False,
            "finished": True,
            "hint": "every task is done, failed or cancelled: no work is left",
        }


async def test_claim_waits_for_a_lease_to_expire(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    plan = Rooms(store).room(room).plan
    await plan.add([TaskSpec("a")])
    await plan.claim("a", "x", ttl=0.5)
    async with Client(build_mcp(store, agent="w")) as client:
        start = time.monotonic()
        body = ok(await call(client, "claim_task", room=room, wait=10))
        assert body["claimed"] is True and body["task"]["id"] == "a"
        assert time.monotonic() - start < 2.0


async def test_read_new_events_waits_for_an_event(
    store: Store, backend: Backend, room: str
) -> None:
    await Rooms(store).create(room)
    other = Rooms(await backend.open()).room(room)
    async with Client(build_mcp(store, agent="w")) as client:
        ok(await call(client, "read_new_events", room=room))
        start = time.monotonic()
        posting = asyncio.create_task(later(0.5, other.events.post("note", {"n": 1}, author="o")))
        body = ok(await call(client, "read_new_events", room=room, wait=10))
        took = time.monotonic() - start
        await posting
        assert [(e["type"], e["data"], e["author"]) for e in body["events"]] == [
            ("note", {"n": 1}, "o")
        ]
        assert took < 1.5, took
        start = time.monotonic()
        empty = ok(await call(client, "read_new_events", room=room, wait=0.5))
        assert empty["events"] == [] and 0.45 <= time.monotonic() - start < 1.5


async def test_wait_is_capped_with_a_clear_error(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with Client(build_mcp(store, agent="w")) as client:
        for tool in ("claim_task", "read_new_events"):
            error = err(await call(client, tool, room=room, wait=31), "bad_request")
            assert error["details"]["errors"][0]["argument"] == "wait"
            assert "30" in error["message"]
