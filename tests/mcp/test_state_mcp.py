"""What the state says, through MCP (the official SDK client): an event's author is the
calling agent, from its token (HTTP) or its --agent (stdio); read_plan shows a lease
that ran out as "expired, reclaimable"; acquire_lock says when it was granted."""

from __future__ import annotations

import asyncio

from agentrooms.rooms import Rooms
from agentrooms.server import mint
from agentrooms.store import Store
from tests.conftest import Backend
from tests.mcp.support import bearer, call, http_client, http_server, ok, stdio_session


async def test_events_posted_over_http_read_back_with_the_tokens_agent(
    store: Store, room: str
) -> None:
    await Rooms(store).create(room)
    ann = bearer((await mint(store, "ann", rooms="*", scopes=["admin"])).token)
    bob = bearer((await mint(store, "bob", rooms="*", scopes=["admin"])).token)
    async with (
        http_server(store) as url,
        http_client(url, ann) as as_ann,
        http_client(url, bob) as as_bob,
    ):
        ok(await call(as_bob, "read_new_events", room=room, skip_to_latest=True))
        ok(await call(as_ann, "post_event", room=room, type="note", data={"n": 1}))
        ok(await call(as_bob, "post_event", room=room, type="note", data={"n": 2}))
        got = ok(await call(as_bob, "read_new_events", room=room))["events"]
        assert [(e["data"], e["author"]) for e in got] == [({"n": 1}, "ann"), ({"n": 2}, "bob")]
        log = await Rooms(store).room(room).events.read(0, 100)
        assert [(e.type, e.author) for e in log] == [
            ("room.created", None),
            ("note", "ann"),
            ("note", "bob"),
        ]
        granted = ok(await call(as_ann, "acquire_lock", room=room, name="L", ttl=30))
        info = await Rooms(store).room(room).locks.holder("L")
        assert info is not None and info.granted_at is not None
        assert abs(granted["granted_at"] - info.granted_at) <= 0.002


async def test_read_plan_shows_an_expired_lease_as_expired_reclaimable(
    store: Store, room: str
) -> None:
    await Rooms(store).create(room)
    ann = bearer((await mint(store, "ann", rooms="*", scopes=["admin"])).token)
    async with http_server(store) as url, http_client(url, ann) as as_ann:
        tasks = [{"id": "t"}, {"id": "u"}]
        ok(await call(as_ann, "add_tasks", room=room, tasks=tasks))
        ok(await call(as_ann, "claim_task", room=room, task_id="t", ttl=0.3))
        plan = {t["id"]: t for t in ok(await call(as_ann, "read_plan", room=room))["tasks"]}
        assert plan["t"]["lease"] == "held" and 0 < plan["t"]["lease_remaining"] <= 0.3
        assert "lease" not in plan["u"]
        await asyncio.sleep(0.5)
        shown = ok(await call(as_ann, "read_plan", room=room, details=True))["tasks"]
        plan = {t["id"]: t for t in shown}
        assert (plan["t"]["status"], plan["t"]["lease"], plan["t"]["lease_remaining"]) == (
            "claimed",
            "expired, reclaimable",
            0.0,
        )
        assert plan["t"]["lease_granted_at"] is not None
        added = [e for e in await Rooms(store).room(room).events.read(0, 100) if e.data]
        assert {e.author for e in added if e.type in ("task.added", "lease.granted")} == {"ann"}


async def test_events_posted_over_stdio_read_back_with_the_servers_agent(
    sqlite_backend: Backend, room: str
) -> None:
    store = await sqlite_backend.open()
    try:
        await Rooms(store).create(room)
        async with (
            stdio_session(sqlite_backend.url, "alice") as alice,
            stdio_session(sqlite_backend.url, "bob") as bob,
        ):
            ok(await call(bob, "read_new_events", room=room, skip_to_latest=True))
            ok(await call(alice, "post_event", room=room, type="note", data="hi"))
            got = ok(await call(bob, "read_new_events", room=room))["events"]
            assert [(e["data"], e["author"]) for e in got] == [("hi", "alice")]
    finally:
        await store.close()
