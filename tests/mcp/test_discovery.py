"""The discovery and completeness tools (list_rooms, list_documents, list_locks,
extend_lock, ack_events, cancel_task, delete_document), join_room's role and partition,
and a not_found hint per kind that names a tool that lists. Through the SDK's
in-process client, on every backend."""

from __future__ import annotations

import asyncio

from mcp import Client

from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.server.auth import Principal
from agentrooms.server.mcp import build_mcp
from agentrooms.server.mcp.server import AgentroomsMCP
from agentrooms.store import Store
from tests.mcp.support import call, err, ok


def as_token(store: Store, rooms: set[str] | None, scopes: set[str], role: str | None) -> Client:
    principal = Principal("w", None if rooms is None else frozenset(rooms), frozenset(scopes), role)
    return Client(AgentroomsMCP(store, principal=principal))


async def test_list_rooms_shows_only_those_the_token_may_enter(store: Store, room: str) -> None:
    hidden = f"{room}-hidden"
    await Rooms(store).create(room, "the team")
    await Rooms(store).create(hidden)
    await Rooms(store).room(room).plan.add([TaskSpec("a")])
    async with as_token(store, {room}, {"rooms:read"}, None) as client:
        body = ok(await call(client, "list_rooms"))
        assert body == {"rooms": [{"name": room, "description": "the team", "ready": 1}]}
    async with as_token(store, {room}, {"plan:read"}, None) as client:
        error = err(await call(client, "list_rooms"), "forbidden")
        assert "rooms:read" in error["message"]


async def test_join_room_tells_role_and_partition(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with as_token(store, None, {"presence:write", "docs:write"}, "qa") as client:
        body = ok(await call(client, "join_room", room=room))
        assert body["role"] == "qa" and body["writes"] == "only its own partition 'qa'"
        ok(await call(client, "write_document", room=room, name="qa/notes", value=1, version=0))
        refused = err(
            await call(client, "write_document", room=room, name="plan", value=1, version=0),
            "forbidden",
        )
        assert "only its own partition 'qa'" in refused["message"]
    async with Client(build_mcp(store, agent="boss")) as client:
        body = ok(await call(client, "join_room", room=room))
        assert body["writes"] == "every document" and "role" not in body


async def test_documents_listed_and_deleted(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with Client(build_mcp(store, agent="w")) as client:
        x = ok(await call(client, "write_document", room=room, name="a/x", value=1, version=0))
        b1 = ok(await call(client, "write_document", room=room, name="b", value=2, version=0))
        b2 = ok(
            await call(
                client, "write_document", room=room, name="b", value=3, version=b1["version"]
            )
        )
        ax = {"name": "a/x", "version": x["version"]}
        listed = ok(await call(client, "list_documents", room=room))
        assert listed == {"documents": [ax, {"name": "b", "version": b2["version"]}]}
        assert ok(await call(client, "list_documents", room=room, partition="a")) == {
            "documents": [ax]
        }
        stale = err(
            await call(client, "delete_document", room=room, name="b", version=b1["version"]),
            "version_conflict",
        )
        assert stale["details"]["current_version"] == b2["version"]
        ok(await call(client, "delete_document", room=room, name="b", version=b2["version"]))
        gone = err(
            await call(client, "delete_document", room=room, name="b", version=b2["version"]),
            "not_found",
        )
        assert "list_documents" in gone["message"]
        missing = err(await call(client, "read_document", room=room, name="zz"), "not_found")
        assert "list_documents" in missing["message"]
        assert ok(await call(client, "list_documents", room=room))["documents"] == [ax]


async def test_locks_listed_with_waiters_and_extended(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with (
        Client(build_mcp(store, agent="w")) as w,
        Client(build_mcp(store, agent="v")) as v,
    ):
        grant = ok(await call(w, "acquire_lock", room=room, name="db", ttl=5))
        queued = asyncio.create_task(call(v, "acquire_lock", room=room, name="db", wait=10))
        for _ in range(200):
            listed = ok(await call(w, "list_locks", room=room))["locks"]
            if listed and listed[0].get("waiters"):
                break
            await asyncio.sleep(0.02)
        (lock,) = listed
        assert lock["name"] == "db" and lock["holder"] == "w" and lock["fence"] == grant["fence"]
        assert lock["waiters"] == ["v"] and lock["since"] == grant["granted_at"]
        longer = ok(
            await call(w, "extend_lock", room=room, name="db", token=grant["token"], ttl=60)
        )
        assert longer["fence"] == grant["fence"] and longer["expires_at"] > grant["expires_at"]
        ok(await call(w, "release_lock", room=room, name="db", token=grant["token"]))
        ok(await queued)
        lost = err(
            await call(w, "extend_lock", room=room, name="db", token=grant["token"]), "stale_fence"
        )
        assert "acquire_lock again" in lost["message"]
        assert [x["holder"] for x in ok(await call(w, "list_locks", room=room))["locks"]] == ["v"]


async def test_ack_events_moves_an_explicit_cursor(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with Client(build_mcp(store, agent="w")) as client:
        start = ok(await call(client, "read_new_events", room=room, skip_to_latest=True))
        for n in range(3):
            ok(await call(client, "post_event", room=room, type="note", data=n))
        first = ok(await call(client, "read_new_events", room=room, explicit=True))
        seqs = [e["seq"] for e in first["events"]]
        assert len(seqs) == 3 and first["cursor"] == start["cursor"]
        again = ok(await call(client, "read_new_events", room=room, explicit=True, limit=1))
        assert [e["seq"] for e in again["events"]] == seqs[:1]  # not acked: returned again
        assert ok(await call(client, "ack_events", room=room, seq=seqs[1])) == {"cursor": seqs[1]}
        rest = ok(await call(client, "read_new_events", room=room))
        assert [e["seq"] for e in rest["events"]] == seqs[2:]
        beyond = err(await call(client, "ack_events", room=room, seq=seqs[2] + 5), "bad_request")
        assert "newest event" in beyond["message"]


async def test_cancel_task_and_its_errors(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with Client(build_mcp(store, agent="w")) as client:
        ok(await call(client, "add_tasks", room=room, tasks=[{"id": "a"}]))
        body = ok(await call(client, "cancel_task", room=room, task_id="a", reason="dup"))
        assert body == {"task_id": "a", "status": "cancelled"}
        again = err(await call(client, "cancel_task", room=room, task_id="a"), "invalid_transition")
        assert "do not repeat it" in again["message"]
        missing = err(await call(client, "cancel_task", room=room, task_id="zz"), "not_found")
        assert "read_plan" in missing["message"]
        finished = ok(await call(client, "claim_task", room=room))
        assert finished["finished"] is True


async def test_not_found_of_a_room_points_to_list_rooms(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with as_token(store, {room}, {"admin"}, None) as client:
        for tool in ("read_plan", "list_documents", "list_locks", "read_new_events"):
            for name in (f"{room}-absent", "outside"):
                error = err(await call(client, tool, room=name), "not_found")
                assert "list_rooms" in error["message"], (tool, error)
