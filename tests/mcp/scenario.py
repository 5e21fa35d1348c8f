"""One agent loop, driven through MCP tool calls by two agents (alice and bob), whatever
the transport: join, plan, push + read events through cursors, claim, renew, complete,
presence, a lock, and a document conflict resolved by re-reading."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from itertools import count
from typing import Any, Protocol

from mcp.client.subscriptions import ResourceUpdated, Subscription
from mcp_types import CallToolResult

from agentrooms.rooms import Rooms
from agentrooms.server.mcp import events_uri
from agentrooms.store import Store
from tests.mcp.support import err, ok, text_of

PUSH_TIMEOUT = 10.0
DOC = "team/report"  # a partitioned name: HTTP tokens with role "team" may write it


class Agent(Protocol):
    """What the scenario needs of an MCP client (``mcp.Client`` is one)."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None
    ) -> CallToolResult: ...

    def listen(
        self, *, resource_subscriptions: Sequence[str] = ()
    ) -> AbstractAsyncContextManager[Subscription]: ...


class Alternating:
    """One logical agent whose calls go to its clients in turn (one per server
    instance); ``listen`` opens on the last one."""

    def __init__(self, *clients: Agent) -> None:
        self.clients = clients
        self.turn = count()
        self.served: list[int] = []

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
        index = next(self.turn) % len(self.clients)
        self.served.append(index)
        return await self.clients[index].call_tool(name, arguments)

    def listen(
        self, *, resource_subscriptions: Sequence[str] = ()
    ) -> AbstractAsyncContextManager[Subscription]:
        return self.clients[-1].listen(resource_subscriptions=resource_subscriptions)


async def use(agent: Agent, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call ``tool`` and return its body, failing on a tool error. (No value in this
    scenario holds a null, so none may appear: the envelope leaves absent members out.)"""
    result = await agent.call_tool(tool, arguments)
    body = ok(result)
    assert "null" not in text_of(result), text_of(result)
    return body


async def next_update(sub: Subscription) -> ResourceUpdated:
    async with asyncio.timeout(PUSH_TIMEOUT):
        event = await anext(aiter(sub))
    assert isinstance(event, ResourceUpdated), event
    return event


@asynccontextmanager
async def listening(agent: Agent, room: str) -> AsyncIterator[Subscription]:
    async with agent.listen(resource_subscriptions=[events_uri(room)]) as sub:
        assert sub.honored is not None
        assert sub.honored.resource_subscriptions == [events_uri(room)]
        yield sub


async def agent_loop(alice: Agent, bob: Agent, store: Store, room: str) -> None:
    """The whole loop; ``store`` is the test's own handle, used as a third writer."""
    await Rooms(store).create(room)
    await join_and_plan(alice, bob, room)
    await events_and_push(alice, bob, store, room)
    write = await claim_renew_complete(alice, bob, room)
    await presence_and_lock(alice, bob, room)
    await document_conflict(alice, bob, room)
    finished = await use(
        alice, "complete_task", room=room, task_id="write", fence=write["fence"], result="ok"
    )
    assert finished["status"] == "done"
    tasks = (await use(bob, "read_plan", room=room, details=True))["tasks"]
    assert [(t["id"], t["status"], t.get("result")) for t in tasks] == [
        ("research", "done", {"sources": 3}),
        ("write", "done", "ok"),
    ]


async def join_and_plan(alice: Agent, bob: Agent, room: str) -> None:
    """Join (a compact summary of where each agent stands) and add the plan, once even
    when the call is repeated with its request_id."""
    joined = await use(alice, "join_room", room=room)
    assert joined["you"] == "alice" and joined["cursor"] == 0 and joined["unread"] >= 1
    assert joined["ready"] == 0 and joined["online"] == {"alice": "online"}
    joined = await use(bob, "join_room", room=room, status="starting")
    assert joined["online"] == {"alice": "online", "bob": "starting"}
    plan = [
        {"id": "research", "title": "find sources", "payload": {"topic": "tides"}},
        {"id": "write", "deps": ["research"]},
    ]
    added = await use(alice, "add_tasks", room=room, tasks=plan, request_id="plan-1")
    assert added == {"added": 2, "ready": ["research"]}
    assert await use(alice, "add_tasks", room=room, tasks=plan, request_id="plan-1") == added
    tasks = (await use(bob, "read_plan", room=room))["tasks"]
    assert tasks == [
        {"id": "research", "status": "ready"},
        {"id": "write", "status": "pending", "deps": ["research"]},
    ]


async def events_and_push(alice: Agent, bob: Agent, store: Store, room: str) -> None:
    """Each read returns only what the cursor has not passed; while alice listens, a
    post by bob and one by a writer outside MCP both reach her as pushes."""
    first = await use(alice, "read_new_events", room=room)
    types = [e["type"] for e in first["events"]]
    assert types == ["room.created", "task.added", "task.added"]
    assert first["cursor"] == first["events"][-1]["seq"]
    again = await use(alice, "read_new_events", room=room)
    assert again == {"events": [], "cursor": first["cursor"]}
    async with listening(alice, room) as sub:
        posted = await use(bob, "post_event", room=room, type="note", data={"text": "hi"})
        await next_update(sub)
        news = await use(alice, "read_new_events", room=room)
        note = {"seq": posted["seq"], "type": "note", "data": {"text": "hi"}, "author": "bob"}
        assert news["events"] == [note]
        seq = await Rooms(store).room(room).events.post("deploy", {"by": "ci"})
        await next_update(sub)
        news = await use(alice, "read_new_events", room=room)
        assert news["events"] == [{"seq": seq, "type": "deploy", "data": {"by": "ci"}}]


async def claim_renew_complete(alice: Agent, bob: Agent, room: str) -> dict[str, Any]:
    """Bob claims (idempotent with a request_id), renews and completes; the dependent
    task becomes claimable by alice, whose claim is returned."""
    claim = await use(bob, "claim_task", room=room, ttl=30, request_id="claim-1")
    assert claim["claimed"] is True
    assert claim["task"] == {
        "id": "research",
        "title": "find sources",
        "payload": {"topic": "tides"},
        "attempt": 1,
    }
    assert claim["ttl"] == 30
    assert await use(bob, "claim_task", room=room, ttl=30, request_id="claim-1") == claim
    assert (await use(alice, "claim_task", room=room))["claimed"] is False
    fence = claim["fence"]
    renewed = await use(bob, "renew_lease", room=room, task_id="research", fence=fence, ttl=120)
    assert renewed["fence"] == fence and renewed["expires_at"] > claim["expires_at"]
    complete = {
        "room": room,
        "task_id": "research",
        "fence": fence,
        "result": {"sources": 3},
        "request_id": "done-1",
    }
    done = await use(bob, "complete_task", **complete)
    assert done == {"task_id": "research", "status": "done"}
    assert await use(bob, "complete_task", **complete) == done
    write = await use(alice, "claim_task", room=room)
    assert write["task"]["id"] == "write" and write["task"]["deps"] == ["research"]
    return write


async def presence_and_lock(alice: Agent, bob: Agent, room: str) -> None:
    await use(bob, "heartbeat", room=room, status="reviewing")
    online = await use(alice, "who_is_online", room=room)
    assert online == {"online": {"alice": "online", "bob": "reviewing"}}
    lock = await use(alice, "acquire_lock", room=room, name="publish", ttl=30)
    held = err(await bob.call_tool("acquire_lock", {"room": room, "name": "publish"}), "lock_held")
    assert "'alice'" in held["message"] and held["details"]["holder"] == "alice"
    released = await use(alice, "release_lock", room=room, name="publish", token=lock["token"])
    assert released == {"released": True}
    assert (await use(bob, "acquire_lock", room=room, name="publish"))["fence"] > lock["fence"]


async def document_conflict(alice: Agent, bob: Agent, room: str) -> None:
    """Both read version v; alice writes first; bob gets version_conflict naming the
    current version, re-reads, re-applies his change and writes with that version."""
    empty: dict[str, list[str]] = {"sections": []}
    created = await use(alice, "write_document", room=room, name=DOC, value=empty, version=0)
    read_a = await use(alice, "read_document", room=room, name=DOC)
    read_b = await use(bob, "read_document", room=room, name=DOC)
    assert read_a == read_b == {"value": empty, "version": created["version"]}
    intro = {"sections": ["intro"]}
    won = await use(
        alice, "write_document", room=room, name=DOC, value=intro, version=read_a["version"]
    )
    summary = {"sections": ["summary"]}
    lost = await bob.call_tool(
        "write_document",
        {"room": room, "name": DOC, "value": summary, "version": read_b["version"]},
    )
    conflict = err(lost, "version_conflict")
    assert f"it is now version {won['version']}" in conflict["message"]
    assert f"write with version {won['version']}" in conflict["message"]
    assert conflict["details"]["current_version"] == won["version"]
    reread = await use(bob, "read_document", room=room, name=DOC)
    assert reread == {"value": intro, "version": won["version"]}
    merged = {"sections": [*reread["value"]["sections"], "summary"]}
    final = await use(
        bob, "write_document", room=room, name=DOC, value=merged, version=reread["version"]
    )
    assert final["version"] > won["version"]
    assert (await use(alice, "read_document", room=room, name=DOC))["value"] == merged
