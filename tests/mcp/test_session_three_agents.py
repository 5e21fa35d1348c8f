"""The scripted three-agent session of issue #26 through the official MCP SDK client,
over stdio (a server subprocess per agent) and over streamable HTTP (a bearer token per
agent): a lead, a reviewer (ana, role ``reviewer``) and a worker (bo)

* exchange addressed messages, to an agent and to a role, each reading its inbox
  exactly once;
* wait for work instead of polling: one ``claim_task`` with ``wait`` gets the task the
  lead adds meanwhile, one ``read_new_events`` with ``wait`` gets the message posted
  meanwhile (the tool calls are counted);
* reserve overlapping paths (refused, naming holder and pattern) and disjoint ones;
* lose a reservation to expiry and are told (in the inbox, and on renewal);
* recover from each kind of ``not_found`` by calling the tool its hint names.

docs/surfaces.md shows the same session as a transcript."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from typing import Any

from mcp import Client
from mcp_types import CallToolResult

from agentrooms.rooms import Rooms
from agentrooms.store import Store
from tests.conftest import Backend
from tests.mcp.support import TEAM_SCOPES, Connect, agents, err, ok, over_http, over_stdio

ADDED_AFTER = 0.5  # seconds the lead waits before adding the task a worker waits for


class Counted:
    """One agent's client, counting its tool calls by name."""

    def __init__(self, client: Client, room: str) -> None:
        self.client, self.room, self.calls = client, room, Counter[str]()

    async def call(self, tool: str, **arguments: Any) -> CallToolResult:
        self.calls[tool] += 1
        if tool != "list_rooms":
            arguments.setdefault("room", self.room)
        return await self.client.call_tool(tool, arguments)

    async def use(self, tool: str, **arguments: Any) -> dict[str, Any]:
        return ok(await self.call(tool, **arguments))

    async def post(self, type: str, **arguments: Any) -> int:
        seq: int = (await self.use("post_event", type=type, **arguments))["seq"]
        return seq

    async def inbox(self, **arguments: Any) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = (await self.use("read_new_events", inbox=True, **arguments))[
            "events"
        ]
        return events


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["seq"] for e in events]


def named_tool(error: dict[str, Any]) -> str:
    """The tool a ``not_found`` hint says to call ("... — call list_rooms to see ...")."""
    found = re.search(r"call (\w+)", error["message"])
    assert found is not None, error
    return found.group(1)


async def session(connect: Connect, room: str) -> None:
    async with agents(connect, lead="lead", ana="reviewer", bo=None) as team:
        lead, ana, bo = (Counted(team[name], room) for name in ("lead", "ana", "bo"))
        assert (await ana.use("join_room"))["role"] == "reviewer"
        await lead.use("join_room")
        await bo.use("join_room")
        await messages(lead, ana, bo)
        await waiting(lead, ana, bo)
        await paths(ana, bo)
        await not_found(lead, ana, bo, room)


async def messages(lead: Counted, ana: Counted, bo: Counted) -> None:
    """Addressed to an agent and to a role; each inbox read exactly once."""
    await lead.post("status", data="kick-off")  # for everyone: in no inbox
    direct = await lead.post("ask", data="review the parser", to=["ana"])
    to_role = await lead.post("review", data={"pr": 7}, to_roles=["reviewer"])
    job = await lead.post("ask", data="fix the parser", to=["bo"])
    assert seqs(await ana.inbox()) == [direct, to_role]
    assert seqs(await bo.inbox()) == [job]
    reply = await bo.post("ack", data="on it", to=["lead"])
    got = await lead.inbox()
    assert [(e["seq"], e["author"]) for e in got] == [(reply, "bo")]
    for agent in (lead, ana, bo):
        assert await agent.inbox() == []  # exactly once


async def waiting(lead: Counted, ana: Counted, bo: Counted) -> None:
    """One claim_task with wait gets the task added meanwhile; one inbox read with wait
    gets the message posted meanwhile."""
    start = time.monotonic()
    claiming = asyncio.create_task(bo.call("claim_task", wait=20))
    await asyncio.sleep(ADDED_AFTER)
    task = {"id": "fix-parser", "payload": {"path": "src/parser.py"}}
    assert (await lead.use("add_tasks", tasks=[task]))["ready"] == ["fix-parser"]
    claimed = ok(await claiming)
    assert claimed["claimed"] is True and claimed["task"]["id"] == "fix-parser"
    assert bo.calls["claim_task"] == 1 and time.monotonic() - start < ADDED_AFTER + 3
    before = ana.calls["read_new_events"]
    reading = asyncio.create_task(ana.inbox(wait=20))
    await asyncio.sleep(0.3)
    done = await bo.use("complete_task", task_id="fix-parser", fence=claimed["fence"])
    assert done == {"task_id": "fix-parser", "status": "done"}
    review = await bo.post("done", data={"task": "fix-parser"}, to_roles=["reviewer"])
    assert seqs(await reading) == [review]
    assert ana.calls["read_new_events"] == before + 1
    nothing = await bo.use("claim_task")
    assert nothing["claimed"] is False and nothing["finished"] is True


async def paths(ana: Counted, bo: Counted) -> None:
    """Overlapping refused (holder and pattern named), disjoint granted, one lost to
    expiry and its holder told."""
    held = await ana.use("reserve_paths", paths=["src/**"], ttl=30)
    refused = err(await bo.call("reserve_paths", paths=["src/parser.py"]), "paths_reserved")
    assert (refused["details"]["holder"], refused["details"]["pattern"]) == ("ana", "src/**")
    docs = await bo.use("reserve_paths", paths=["docs/*.md"])  # disjoint
    assert docs["fence"] > held["fence"]
    renewed = await ana.use("reserve_paths", paths=["-"], renew=held["id"], ttl=0.3)
    assert renewed["id"] == held["id"]
    await asyncio.sleep(0.6)  # ana's reservation lapses
    taken = await bo.use("reserve_paths", paths=["src/parser.py"])  # reclaims it
    assert taken["fence"] > docs["fence"]
    told = await ana.inbox()
    assert [(e["type"], e["data"]["id"], e["data"]["by"]) for e in told] == [
        ("paths.expired", held["id"], "bo")
    ]
    lost = err(await ana.call("reserve_paths", paths=["-"], renew=held["id"]), "paths_lost")
    assert "reserve_paths again" in lost["message"]
    for grant in (docs, taken):
        assert await bo.use("release_paths", reservation=grant["id"]) == {"released": True}


async def not_found(lead: Counted, ana: Counted, bo: Counted, room: str) -> None:
    """Each kind of not_found (room, task, document, event) names a tool that lists;
    calling it gives what the retry needs."""
    typo = err(await bo.call("read_plan", room=f"{room}-typo"), "not_found")
    assert named_tool(typo) == "list_rooms"
    listed = await bo.use("list_rooms")
    assert [r["name"] for r in listed["rooms"]] == [room]
    await bo.use("read_plan", room=listed["rooms"][0]["name"])

    await lead.use("add_tasks", tasks=[{"id": "write-docs"}])
    wrong = err(await bo.call("claim_task", task_id="write-doc"), "not_found")
    assert named_tool(wrong) == "read_plan"
    plan = await bo.use("read_plan", status="ready")
    [ready] = [t["id"] for t in plan["tasks"]]
    assert (await bo.use("claim_task", task_id=ready))["task"]["id"] == "write-docs"

    await lead.use("write_document", name="lead/brief", value={"goal": "ship"}, version=0)
    missing = err(await ana.call("read_document", name="brief"), "not_found")
    assert named_tool(missing) == "list_documents"
    [doc] = (await ana.use("list_documents"))["documents"]
    assert (await ana.use("read_document", name=doc["name"]))["value"] == {"goal": "ship"}

    gone = err(await ana.call("read_event", seq=10**9), "not_found")
    assert named_tool(gone) == "join_room"
    standing = await ana.use("join_room")  # its full cursor: it read only its inbox
    assert standing["unread"] > 0
    first = standing["cursor"] + 1
    assert (await ana.use("read_event", seq=first))["seq"] == first


async def test_three_agent_session_over_http(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with over_http(store, room, TEAM_SCOPES) as connect:
        await session(connect, room)


async def test_three_agent_session_over_stdio(sqlite_backend: Backend, room: str) -> None:
    async with over_stdio(sqlite_backend, room) as (connect, _):
        await session(connect, room)
