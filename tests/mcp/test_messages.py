"""Addressed messages over MCP (issue #26 item 1): three agents, each with its own token
(one with a role), exchange addressed events through the official SDK client; each
reads its inbox exactly once, an inbox read waits for a message instead of polling, and
explicit reads redeliver until ack_events(inbox=true). Over streamable HTTP on every
backend, and over stdio (a server subprocess per agent, its role given with --role)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from mcp import Client

from agentrooms.rooms import Rooms
from agentrooms.store import Store
from tests.conftest import Backend
from tests.mcp.support import Connect, agents, call, err, ok, over_http, over_stdio

SCOPES = ["events:read", "events:write", "presence:write"]


async def three_agents_exchange_addressed_messages(connect: Connect, room: str) -> None:
    async with agents(connect, lead=None, ana="reviewer", bo=None) as team:
        lead, ana, bo = team["lead"], team["ana"], team["bo"]

        async def post(client: Client, **args: Any) -> int:
            seq: int = ok(await call(client, "post_event", room=room, **args))["seq"]
            return seq

        async def inbox(client: Client) -> list[dict[str, Any]]:
            body = ok(await call(client, "read_new_events", room=room, inbox=True))
            events: list[dict[str, Any]] = body["events"]
            return events

        await post(lead, type="status", data="for everyone")
        review = await post(lead, type="review", data={"pr": 7}, to_roles=["reviewer"])
        task = await post(lead, type="task", data="write tests", to=["bo"])
        got = await inbox(ana)
        assert [(e["seq"], e["author"], e["to_roles"]) for e in got] == [
            (review, "lead", ["reviewer"])
        ]
        assert [e["seq"] for e in await inbox(bo)] == [task]
        assert await inbox(ana) == [] and await inbox(bo) == []  # exactly once
        # replies addressed back, and to both at once
        reply = await post(ana, type="reply", data="lgtm", to=["lead"])
        both = await post(bo, type="done", data=None, to=["lead", "ana"])
        assert [(e["seq"], e["author"]) for e in await inbox(lead)] == [
            (reply, "ana"),
            (both, "bo"),
        ]
        assert [e["seq"] for e in await inbox(ana)] == [both]
        assert await inbox(bo) == []  # its own message is not for it
        # the full read still shows every event to every agent, on its own cursor
        full = ok(await call(bo, "read_new_events", room=room))["events"]
        assert [e["type"] for e in full] == [
            "room.created",
            "status",
            "review",
            "task",
            "reply",
            "done",
        ]
        bad = await call(lead, "post_event", room=room, type="x", to=["not a name"])
        err(bad, "bad_request")


async def an_inbox_read_waits_for_a_message_and_ignores_others(connect: Connect, room: str) -> None:
    async with agents(connect, lead=None, bo=None) as team:
        lead_c, bo_c = team["lead"], team["bo"]

        async def later() -> None:
            await asyncio.sleep(0.3)
            await call(lead_c, "post_event", room=room, type="noise")
            await asyncio.sleep(0.3)
            await call(lead_c, "post_event", room=room, type="msg", to=["bo"])

        start = time.monotonic()
        posting = asyncio.create_task(later())
        body = ok(await call(bo_c, "read_new_events", room=room, inbox=True, wait=10))
        took = time.monotonic() - start
        await posting
        assert [e["type"] for e in body["events"]] == ["msg"]
        assert took < 3, took


async def explicit_inbox_reads_redeliver_until_ack_events(connect: Connect, room: str) -> None:
    async with agents(connect, lead=None, bo=None) as team:
        lead_c, bo_c = team["lead"], team["bo"]
        await call(lead_c, "post_event", room=room, type="noise")
        seq = ok(await call(lead_c, "post_event", room=room, type="m", to=["bo"]))["seq"]
        for _ in range(2):
            body = ok(await call(bo_c, "read_new_events", room=room, inbox=True, explicit=True))
            assert [e["seq"] for e in body["events"]] == [seq]
        acked = ok(await call(bo_c, "ack_events", room=room, seq=seq, inbox=True))
        assert acked["cursor"] == seq
        again = ok(await call(bo_c, "read_new_events", room=room, inbox=True, explicit=True))
        assert again["events"] == []
        full = ok(await call(bo_c, "read_new_events", room=room, explicit=True))
        assert len(full["events"]) == 3  # the full cursor never moved


SCENARIOS = [
    three_agents_exchange_addressed_messages,
    an_inbox_read_waits_for_a_message_and_ignores_others,
    explicit_inbox_reads_redeliver_until_ack_events,
]
Scenario = Callable[[Connect, str], Awaitable[None]]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_over_http(store: Store, room: str, scenario: Scenario) -> None:
    await Rooms(store).create(room)
    async with over_http(store, room, SCOPES) as connect:
        await scenario(connect, room)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_over_stdio(sqlite_backend: Backend, room: str, scenario: Scenario) -> None:
    async with over_stdio(sqlite_backend, room) as (connect, _):
        await scenario(connect, room)
