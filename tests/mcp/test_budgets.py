"""Result budgets (#26 item 4) through the SDK's in-process client, on every backend:
each listing tool pages with ``limit``/``next`` and a walk sees every item once; a result
over ``max_result_bytes`` is cut with an explicit marker and the rest is fetched in
parts; ``read_plan`` of a large plan is a summary."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mcp import Client

from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.server import HttpLimits
from agentrooms.server.auth import SCOPES, Principal
from agentrooms.server.mcp import build_mcp
from agentrooms.server.mcp.server import AgentroomsMCP
from agentrooms.store import Store
from tests.mcp.support import call, ok, text_of

SMALL = HttpLimits(rate=None, max_result_bytes=4096)
SUMMARY_TOKENS = 200  # read_plan's default answer for a 1,000-task plan


async def walk(
    client: Client, tool: str, items: Callable[[dict[str, Any]], list[str]], **args: Any
) -> list[str]:
    """Every item a paged tool lists, following ``next`` to the end."""
    seen: list[str] = []
    after = None
    while True:
        extra: dict[str, Any] = {} if after is None else {"after": after}
        body = ok(await call(client, tool, **args, **extra))
        seen += items(body)
        after = body.get("next")
        if after is None:
            return seen


async def test_every_listing_walks_to_the_end_once(store: Store, room: str) -> None:
    r = await Rooms(store).create(room)
    names = [f"n{i:02}" for i in range(23)]
    await r.plan.add([TaskSpec(n) for n in names])
    for n in names:
        await r.presence.heartbeat(n, "here")
        await r.docs.put(f"p/{n}" if n < "n10" else n, 1)
        await r.locks.try_acquire(n, "holder", ttl=600)
    async with Client(build_mcp(store, agent="w")) as client:

        def tasks(b: dict[str, Any]) -> list[str]:
            return [t["id"] for t in b["tasks"]]

        got = await walk(client, "read_plan", tasks, room=room, limit=5, summary=False)
        assert got == names
        assert (
            await walk(client, "who_is_online", lambda b: list(b["online"]), room=room, limit=4)
            == names
        )
        docs = await walk(
            client,
            "list_documents",
            lambda b: [d["name"] for d in b["documents"]],
            room=room,
            limit=6,
        )
        assert sorted(docs) == sorted(f"p/{n}" if n < "n10" else n for n in names)
        part = await walk(
            client,
            "list_documents",
            lambda b: [d["name"] for d in b["documents"]],
            room=room,
            limit=3,
            partition="p",
        )
        assert part == [f"p/{n}" for n in names if n < "n10"]
        locks = await walk(
            client, "list_locks", lambda b: [x["name"] for x in b["locks"]], room=room, limit=7
        )
        assert locks == names
        # a status filter pages too
        ready = await walk(
            client, "read_plan", tasks, room=room, limit=4, status="ready", summary=False
        )
        assert ready == names


async def test_list_rooms_pages_over_the_rooms_a_token_may_enter(store: Store, room: str) -> None:
    mine = [f"{room}-{i:02}" for i in range(12)]
    for name in mine:
        await Rooms(store).create(name)

    def rooms(b: dict[str, Any]) -> list[str]:
        return [x["name"] for x in b["rooms"]]

    named = Principal("w", frozenset(mine), SCOPES, None)
    async with Client(AgentroomsMCP(store, principal=named)) as client:
        assert await walk(client, "list_rooms", rooms, limit=5) == mine
    async with Client(build_mcp(store, agent="w")) as client:  # every room: the registry
        everything = await walk(client, "list_rooms", rooms, limit=5)
    assert len(everything) == len(set(everything))
    assert [n for n in everything if n.startswith(f"{room}-")] == mine


async def test_a_large_document_comes_in_parts(store: Store, room: str) -> None:
    r = await Rooms(store).create(room)
    value = {"lines": [f"line {i} " + "é" * 40 for i in range(400)]}
    small = {"a": 1}
    await r.docs.put("big", value)
    await r.docs.put("small", small)
    async with Client(build_mcp(store, agent="w", limits=SMALL)) as client:
        assert ok(await call(client, "read_document", room=room, name="small"))["value"] == small
        parts: list[str] = []
        offset = 0
        while True:
            result = await call(client, "read_document", room=room, name="big", offset=offset)
            assert len(text_of(result).encode()) <= SMALL.max_result_bytes
            body = ok(result)
            assert body["truncated"] is True and body["offset"] == offset
            parts.append(body["json"])
            if body.get("next_offset") is None:
                break
            offset = body["next_offset"]
    assert len(parts) > 3
    assert json.loads("".join(parts)) == value


async def test_a_large_event_is_cut_and_fetched_by_read_event(store: Store, room: str) -> None:
    r = await Rooms(store).create(room)
    big = {"blob": "x" * 20_000}
    await r.events.post("note", {"n": 1})
    seq = await r.events.post("dump", big)
    await r.events.post("note", {"n": 2})
    async with Client(build_mcp(store, agent="w", limits=SMALL)) as client:
        result = await call(client, "read_new_events", room=room)
        assert len(text_of(result).encode()) <= SMALL.max_result_bytes
        events = ok(result)["events"][-3:]  # after the room's own
        assert [e["seq"] for e in events] == [seq - 1, seq, seq + 1]
        assert events[0]["data"] == {"n": 1} and events[2]["data"] == {"n": 2}
        cut = events[1]["data"]
        assert cut["truncated"] is True and cut["fetch"] == f"read_event seq={seq}"
        assert cut["bytes"] > SMALL.max_result_bytes
        parts, offset = [], 0
        while True:
            body = ok(await call(client, "read_event", room=room, seq=seq, offset=offset))
            assert body["type"] == "dump"
            parts.append(body["json"])
            if body.get("next_offset") is None:
                break
            offset = body["next_offset"]
        assert json.loads("".join(parts)) == big
        whole = ok(await call(client, "read_event", room=room, seq=seq - 1))
        assert whole["data"] == {"n": 1} and "truncated" not in whole
        assert ok(await call(client, "read_new_events", room=room))["events"] == []


async def test_read_plan_pages_shrink_to_the_result_budget(store: Store, room: str) -> None:
    r = await Rooms(store).create(room)
    ids = [f"t{i:02}" for i in range(12)]
    await r.plan.add([TaskSpec(i, payload="p" * 900) for i in ids])
    await r.plan.add([TaskSpec("zz", payload="q" * 10_000)])
    async with Client(build_mcp(store, agent="w", limits=SMALL)) as client:
        pages: list[list[dict[str, Any]]] = []
        after = None
        while True:
            extra: dict[str, Any] = {} if after is None else {"after": after}
            result = await call(
                client, "read_plan", room=room, details=True, summary=False, **extra
            )
            assert len(text_of(result).encode()) <= SMALL.max_result_bytes + 512
            body = ok(result)
            pages.append(body["tasks"])
            after = body.get("next")
            if after is None:
                break
    assert len(pages) > 2
    listed = [t for page in pages for t in page]
    assert [t["id"] for t in listed] == [*ids, "zz"]
    assert all(t["payload"] == "p" * 900 for t in listed[:-1])
    assert listed[-1]["payload"]["truncated"] is True and "zz" in listed[-1]["payload"]["fetch"]


async def test_read_plan_of_a_large_plan_is_a_summary(store: Store, room: str) -> None:
    r = await Rooms(store).create(room)
    await r.plan.add([TaskSpec(f"t{i:04}", title=f"task {i}") for i in range(1000)])
    await r.plan.claim("t0003", "w", ttl=600)
    await r.plan.claim("t0004", "other", ttl=600)
    async with Client(build_mcp(store, agent="w")) as client:
        result = await call(client, "read_plan", room=room)
        assert len(text_of(result)) // 4 <= SUMMARY_TOKENS, len(text_of(result)) // 4
        body = ok(result)
        assert body["summary"] is True and body["total"] == 1000
        assert body["counts"] == {"claimed": 2, "ready": 998}
        assert body["ready"][:3] == ["t0000", "t0001", "t0002"] and body["ready_more"] is True
        assert [t["id"] for t in body["yours"]] == ["t0003"]
        page = ok(await call(client, "read_plan", room=room, summary=False, limit=10))
        assert len(page["tasks"]) == 10 and page["next"] == "t0009"
        small = ok(await call(client, "read_plan", room=room, status="claimed"))
        assert [t["id"] for t in small["tasks"]] == ["t0003", "t0004"]
        forced = ok(await call(client, "read_plan", room=room, status="claimed", summary=True))
        assert forced["summary"] is True
