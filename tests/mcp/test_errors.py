"""Typed tool errors: each starts with its type, says what to do next, and carries the
``{"error": {type, message, details}}`` envelope as structured content. Driven through
the SDK's in-process client (the same MCP dispatch as the wire transports, without the
startup cost); the transport-specific cases are in test_http and test_agent_loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp import Client
from prometheus_client import REGISTRY

from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.server import HttpLimits
from agentrooms.server.mcp import build_mcp
from agentrooms.store import Store
from tests.mcp.support import call, err, ok


@asynccontextmanager
async def agents(store: Store, *names: str) -> AsyncIterator[list[Client]]:
    clients = [Client(build_mcp(store, agent=name)) for name in names]
    for client in clients:
        await client.__aenter__()
    try:
        yield clients
    finally:
        for client in reversed(clients):
            await client.__aexit__(None, None, None)


async def test_stale_fence_after_the_lease_was_taken_over(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    await Rooms(store).room(room).plan.add([TaskSpec("tax")])
    async with agents(store, "alice", "bob") as (alice, bob):
        slow = ok(await call(bob, "claim_task", room=room, ttl=0.2))
        await asyncio.sleep(0.3)
        taken = ok(await call(alice, "claim_task", room=room))
        assert taken["task"]["id"] == "tax" and taken["fence"] == slow["fence"] + 1
        late = await call(bob, "complete_task", room=room, task_id="tax", fence=slow["fence"])
        error = err(late, "stale_fence")
        assert error["message"] == (
            f"your lease on task 'tax' was taken over or ended (your fence {slow['fence']}, "
            f"current {taken['fence']}) — discard your work on it (do not complete it) and "
            "claim another task"
        )
        assert error["details"] == {
            "key": "task/tax",
            "fence": slow["fence"],
            "current": taken["fence"],
        }
        stale = await call(bob, "renew_lease", room=room, task_id="tax", fence=slow["fence"])
        err(stale, "stale_fence")
        # the holder's result is the one recorded
        ok(await call(alice, "complete_task", room=room, task_id="tax", fence=taken["fence"]))


async def test_lease_held_names_holder_and_expiry(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    await Rooms(store).room(room).plan.add([TaskSpec("a"), TaskSpec("b")])
    async with agents(store, "alice", "bob") as (alice, bob):
        ok(await call(alice, "claim_task", room=room, task_id="a", ttl=60))
        error = err(await call(bob, "claim_task", room=room, task_id="a"), "lease_held")
        assert error["message"].startswith("task 'a' is leased by 'alice', expiring in ")
        assert "pick other work" in error["message"]
        assert error["details"]["holder"] == "alice"
        assert 0 < error["details"]["expires_in"] <= 60
        mine = err(await call(alice, "claim_task", room=room, task_id="a"), "lease_held")
        assert mine["message"].startswith("you already hold task 'a'")
        # claiming without a name skips the held task
        assert ok(await call(bob, "claim_task", room=room))["task"]["id"] == "b"


def lock_held_count() -> float:
    return REGISTRY.get_sample_value("agentrooms_mcp_errors_total", {"type": "lock_held"}) or 0.0


async def test_lock_held_and_release(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with agents(store, "alice", "bob") as (alice, bob):
        grant = ok(await call(alice, "acquire_lock", room=room, name="db", ttl=20))
        before = lock_held_count()
        error = err(await call(bob, "acquire_lock", room=room, name="db"), "lock_held")
        assert lock_held_count() == before + 1  # each kind has its own counter
        assert error["message"].startswith("lock 'db' is held by 'alice', expiring in ")
        assert "wait" in error["message"] and 0 < error["details"]["expires_in"] <= 20
        # release by someone else's token does nothing; a wrong token is not ours
        assert ok(await call(bob, "release_lock", room=room, name="db", token="x" * 32)) == {
            "released": False
        }
        foreign = await call(bob, "release_lock", room=room, name="db", token=grant["token"])
        err(foreign, "forbidden")
        # queued acquire: bob waits, alice releases, bob gets it
        waiting = asyncio.create_task(call(bob, "acquire_lock", room=room, name="db", wait=5))
        await asyncio.sleep(0.2)
        assert ok(await call(alice, "release_lock", room=room, name="db", token=grant["token"]))
        assert ok(await waiting)["fence"] == grant["fence"] + 1


async def test_lock_request_id_makes_acquire_repeatable(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with agents(store, "alice", "bob") as (alice, bob):
        first = ok(await call(alice, "acquire_lock", room=room, name="db", request_id="r1"))
        again = ok(await call(alice, "acquire_lock", room=room, name="db", request_id="r1"))
        assert (again["token"], again["fence"]) == (first["token"], first["fence"])
        err(await call(alice, "acquire_lock", room=room, name="db", request_id="r2"), "lock_held")
        err(await call(bob, "acquire_lock", room=room, name="db", request_id="r1"), "lock_held")


async def test_not_found(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with agents(store, "alice") as (alice,):
        missing_room = err(await call(alice, "read_plan", room="no-such-room"), "not_found")
        assert "room 'no-such-room' does not exist" in missing_room["message"]
        err(await call(alice, "read_document", room=room, name="nope"), "not_found")
        err(await call(alice, "claim_task", room=room, task_id="nope"), "not_found")
        err(await call(alice, "post_event", room="no-such-room", type="x"), "not_found")


async def test_a_room_outside_the_agents_rooms_answers_as_absent(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    await Rooms(store).create(f"{room}-other")
    async with Client(build_mcp(store, agent="alice", rooms=[room])) as alice:
        ok(await call(alice, "join_room", room=room))
        hidden = err(await call(alice, "join_room", room=f"{room}-other"), "not_found")
        absent = err(await call(alice, "join_room", room=f"{room}-absent"), "not_found")
        assert hidden["message"] == absent["message"].replace("-absent", "-other")


async def test_bad_request_names_the_argument(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with agents(store, "alice") as (alice,):
        error = err(await call(alice, "claim_task", room=room, ttl="soon"), "bad_request")
        assert error["details"]["errors"][0]["argument"] == "ttl"
        assert "ttl:" in error["message"]
        missing = err(await call(alice, "complete_task", room=room, task_id="t"), "bad_request")
        assert [e["argument"] for e in missing["details"]["errors"]] == ["fence"]
        pattern = err(await call(alice, "read_plan", room="bad room!"), "bad_request")
        assert pattern["details"]["errors"][0]["argument"] == "room"
        version = await call(alice, "write_document", room=room, name="d", value=1, version=-1)
        err(version, "bad_request")
        cycle = [{"id": "a", "deps": ["b"]}, {"id": "b", "deps": ["a"]}]
        cyclic = err(await call(alice, "add_tasks", room=room, tasks=cycle), "bad_request")
        assert "dependency cycle" in cyclic["message"]
        unknown = err(await call(alice, "launch_rocket", room=room), "bad_request")
        assert "claim_task" in unknown["message"]


async def test_invalid_transition_says_do_not_repeat(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with agents(store, "alice") as (alice,):
        ok(await call(alice, "add_tasks", room=room, tasks=[{"id": "t"}]))
        again = err(
            await call(alice, "add_tasks", room=room, tasks=[{"id": "t"}]), "invalid_transition"
        )
        assert "do not repeat it" in again["message"]
        lease = ok(await call(alice, "claim_task", room=room))
        ok(await call(alice, "complete_task", room=room, task_id="t", fence=lease["fence"]))
        twice = await call(alice, "complete_task", room=room, task_id="t", fence=lease["fence"])
        err(twice, "invalid_transition")


async def test_request_id_reused_for_another_call(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with agents(store, "alice", "bob") as (alice, bob):
        first = ok(await call(alice, "post_event", room=room, type="note", data=1, request_id="n1"))
        assert (
            ok(await call(alice, "post_event", room=room, type="note", data=1, request_id="n1"))
            == first
        )
        other = await call(alice, "post_event", room=room, type="note", data=2, request_id="n1")
        error = err(other, "idempotency_mismatch")
        assert "new request_id" in error["message"]
        # request ids are scoped per agent: bob's n1 is his own
        assert "seq" in ok(
            await call(bob, "post_event", room=room, type="note", data=2, request_id="n1")
        )


async def test_rate_limited_says_how_long_to_wait(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    server = build_mcp(store, agent="alice", limits=HttpLimits(rate=0.5, burst=1))
    async with Client(server) as alice:
        ok(await call(alice, "who_is_online", room=room))
        error = err(await call(alice, "who_is_online", room=room), "rate_limited")
        assert error["message"].startswith("too many calls — wait ")
        assert "do not re-read" in error["message"]
        assert 0 < error["details"]["retry_after"] <= 2


async def test_cursor_moves_only_forward_and_skip_to_latest(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    events = Rooms(store).room(room).events
    async with agents(store, "alice") as (alice,):
        for i in range(5):
            await events.post("tick", i)
        page = ok(await call(alice, "read_new_events", room=room, limit=3))
        assert len(page["events"]) == 3 and page["more"] is True
        rest = ok(await call(alice, "read_new_events", room=room, limit=3))
        assert [e["data"] for e in rest["events"]] == [2, 3, 4] and "more" not in rest
        await events.post("tick", 5)
        skipped = ok(await call(alice, "read_new_events", room=room, skip_to_latest=True))
        assert skipped["events"] == [] and skipped["cursor"] == rest["cursor"] + 1
        assert ok(await call(alice, "read_new_events", room=room))["events"] == []


async def test_values_of_the_caller_keep_their_nulls(store: Store, room: str) -> None:
    """Absent members are left out of the envelope, but a document, payload or event
    comes back exactly as written."""
    await Rooms(store).create(room)
    value = {"a": None, "b": [None, {"c": None}]}
    async with agents(store, "alice") as (alice,):
        ok(await call(alice, "write_document", room=room, name="d", value=value, version=0))
        assert ok(await call(alice, "read_document", room=room, name="d"))["value"] == value
        ok(await call(alice, "write_document", room=room, name="n", value=None, version=0))
        assert ok(await call(alice, "read_document", room=room, name="n"))["value"] is None
        ok(await call(alice, "add_tasks", room=room, tasks=[{"id": "t", "payload": value}]))
        assert ok(await call(alice, "claim_task", room=room))["task"]["payload"] == value
        ok(await call(alice, "read_new_events", room=room))
        ok(await call(alice, "post_event", room=room, type="note", data=value))
        assert ok(await call(alice, "read_new_events", room=room))["events"][0]["data"] == value
