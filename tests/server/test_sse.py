"""The Server-Sent Events stream: ids are sequence numbers, Last-Event-ID resumes with
exactly the missing events, new events wake the stream, an idle stream keeps alive."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from agentrooms.rooms import Rooms
from agentrooms.server import HttpLimits
from agentrooms.store import Store
from tests.server.support import bearer, client, error_of, make_app, token


def parse(stream: str) -> list[dict[str, Any]]:
    """The events of an SSE body (comments and the retry field skipped)."""
    events = []
    for block in stream.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if "data" in fields:
            events.append(
                {"id": fields.get("id"), "event": fields.get("event"), **json.loads(fields["data"])}
            )
    return events


async def _post(c: httpx.AsyncClient, room: str, auth: dict[str, str], n: int) -> None:
    for i in range(n):
        response = await c.post(
            f"/v1/rooms/{room}/events", json={"type": "note", "data": {"i": i}}, headers=auth
        )
        assert response.status_code == 201


async def test_resume_with_last_event_id_gets_exactly_the_missing_events(
    store: Store, room: str
) -> None:
    await Rooms(store).create(room)
    auth = bearer(await token(store, "alice", [room], ["events:read", "events:write"]))
    url = f"/v1/rooms/{room}/events/stream"
    async with client(make_app(store)) as c:
        await _post(c, room, auth, 5)  # seqs 2..6 (1 is room.created)
        first = await c.get(url, params={"after": 0, "max_events": 4}, headers=auth)
        assert first.status_code == 200
        assert first.headers["content-type"].startswith("text/event-stream")
        seen = parse(first.text)
        assert [e["seq"] for e in seen] == [1, 2, 3, 4]
        assert [e["id"] for e in seen] == ["1", "2", "3", "4"]
        assert [e["author"] for e in seen] == [None, "alice", "alice", "alice"]  # the token's
        await _post(c, room, auth, 3)  # seqs 7..9 arrive while disconnected
        resumed = await c.get(
            url,
            params={"after": 0, "timeout": 0.3},  # Last-Event-ID wins over ?after=
            headers={**auth, "Last-Event-ID": seen[-1]["id"]},
        )
        rest = parse(resumed.text)
        assert [e["seq"] for e in rest] == [5, 6, 7, 8, 9]
        assert [e["data"] for e in rest][-3:] == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert {e["type"] for e in rest} == {"note"}


async def test_the_stream_is_woken_by_new_events(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    auth = bearer(await token(store, "alice", [room], ["events:read", "events:write"]))
    async with client(make_app(store)) as c:
        head = 1

        async def later() -> None:
            await asyncio.sleep(0.2)
            await _post(c, room, auth, 2)

        started = time.monotonic()
        poster = asyncio.create_task(later())
        response = await c.get(
            f"/v1/rooms/{room}/events/stream",
            params={"after": head, "max_events": 2, "timeout": 20},
            headers=auth,
        )
        await poster
    assert [e["seq"] for e in parse(response.text)] == [2, 3]
    assert time.monotonic() - started < 10  # woken, not timed out


async def test_an_idle_stream_keeps_alive_and_ends_at_its_timeout(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    auth = bearer(await token(store, "alice", [room], ["events:read"]))
    limits = HttpLimits(keepalive_seconds=0.05, max_stream_seconds=0.3, rate=None)
    async with client(make_app(store, limits=limits)) as c:
        response = await c.get(
            f"/v1/rooms/{room}/events/stream", params={"after": 1, "timeout": 60}, headers=auth
        )
    assert response.status_code == 200
    assert ": keep-alive" in response.text  # and it ended: the server caps the timeout
    assert parse(response.text) == []


async def test_the_stream_starts_at_the_callers_cursor(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    auth = bearer(await token(store, "alice", [room], ["events:read", "events:write"]))
    async with client(make_app(store)) as c:
        await _post(c, room, auth, 3)
        await c.post(f"/v1/rooms/{room}/events/ack", json={"seq": 3}, headers=auth)
        response = await c.get(
            f"/v1/rooms/{room}/events/stream", params={"max_events": 1}, headers=auth
        )
        assert [e["seq"] for e in parse(response.text)] == [4]
        bad = await c.get(
            f"/v1/rooms/{room}/events/stream", headers={**auth, "Last-Event-ID": "soon"}
        )
        assert bad.status_code == 400 and error_of(bad)["type"] == "bad_request"
