"""The operator API over HTTP on every backend: the contract's shape on the 2am room,
access (ops:read, admin; rooms outside the token absent), pagination, thresholds as
query parameters, and the change stream woken within a second by another handle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from fastapi import FastAPI

from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.server import SCOPES, HttpLimits
from agentrooms.store import Store
from tests import ops_scenario as s
from tests.conftest import Backend
from tests.server.support import bearer, client, error_of, make_app, token

STUCK_KINDS = {
    "expired_lease",
    "failed_at_limit",
    "effect_unknown",
    "waiter_waiting",
    "cursor_lagging",
}
TASK_KEYS = {"id", "status", "state", "owner", "lease_remaining", "fence", "attempts", "deps"}
EFFECT_KEYS = {"id", "state", "since", "attempts", "error"}
EVENT_KEYS = {"seq", "type", "author", "time", "data"}


def _has(row: dict[str, Any], wanted: set[str]) -> None:
    assert wanted <= set(row), wanted - set(row)


async def test_the_room_page_has_the_contracts_shape_and_every_stuck_item(
    store: Store, room: str
) -> None:
    seeded = await s.seed_2am(store, room)
    auth = bearer(await token(store, "oncall", [room], ["ops:read"]))
    async with client(make_app(store)) as c:
        response = await c.get(f"/v1/ops/rooms/{room}", headers=auth)
        claimed = await c.get(
            f"/v1/ops/rooms/{room}/tasks", params={"status": "claimed"}, headers=auth
        )
    assert response.status_code == 200
    doc = response.json()
    _has(doc, {"room", "now", "last_seq", "stuck", "plan", "locks", "presence", "cursors"})
    _has(doc, {"documents", "effects", "writer", "contention", "events"})
    assert doc["room"] == room and doc["last_seq"] == seeded.last_seq
    assert isinstance(doc["now"], float)
    for item in doc["stuck"]:
        _has(item, {"kind", "subject", "detail", "since"})
        assert item["kind"] in STUCK_KINDS
    assert {(i["kind"], i["subject"]) for i in doc["stuck"]} == {
        ("expired_lease", s.EXPIRED_TASK),
        ("failed_at_limit", s.FAILED_TASK),
        ("waiter_waiting", s.LOCK),
        ("effect_unknown", s.UNKNOWN_EFFECT),
        ("cursor_lagging", s.LAGGING_AGENT),
    }
    plan = doc["plan"]
    _has(plan, {"counts", "total", "tasks", "next_after"})
    assert plan["total"] == s.TASKS and len(plan["tasks"]) == 100
    for task in plan["tasks"]:
        _has(task, TASK_KEYS)
    (expired,) = [t for t in claimed.json()["tasks"] if t["id"] == s.EXPIRED_TASK]
    assert expired["state"] == "expired, reclaimable" and expired["lease_remaining"] == 0
    (lock,) = [x for x in doc["locks"] if x["name"] == s.LOCK]
    _has(lock, {"name", "holder", "since", "expires_at", "remaining", "fence", "waiters"})
    assert len(lock["waiters"]) == s.WAITERS
    assert all(set(w) >= {"owner", "waited"} and w["waited"] > 60 for w in lock["waiters"])
    for p in doc["presence"]:
        _has(p, {"agent", "last_seen", "age", "online"})
    (lag,) = [x for x in doc["cursors"] if x["agent"] == s.LAGGING_AGENT]
    assert set(lag) == {"agent", "position", "lag"} and lag["lag"] >= s.LAG
    assert doc["documents"][0]["name"] == s.HOT_DOC
    _has(doc["documents"][0], {"name", "version", "last_writer"})
    effects = doc["effects"]
    _has(effects, {"counts", "unknown", "failed", "dead_letters"})
    (unknown,) = effects["unknown"]
    _has(unknown, EFFECT_KEYS)
    assert [e["id"] for e in effects["dead_letters"]] == [s.DEAD_EFFECT]
    _has(doc["writer"], {"queued", "dead_letters"})
    assert doc["contention"][0] == {"prefix": f"doc/{s.HOT_DOC}", "conflicts": s.HOT_CONFLICTS}
    assert len(doc["events"]) == 50
    for event in doc["events"]:
        _has(event, EVENT_KEYS)


async def test_thresholds_are_query_parameters(store: Store, room: str) -> None:
    await s.seed_2am(store, room)
    auth = bearer(await token(store, "oncall", [room], ["ops:read"]))
    params = {"effect_unknown": 3600, "waiter_waiting": 3600, "cursor_lag": 10**6}
    async with client(make_app(store)) as c:
        response = await c.get(f"/v1/ops/rooms/{room}", params=params, headers=auth)
        bad = await c.get(f"/v1/ops/rooms/{room}", params={"cursor_lag": -1}, headers=auth)
    kinds = {i["kind"] for i in response.json()["stuck"]}
    assert kinds == {"expired_lease", "failed_at_limit"}
    assert bad.status_code == 400


async def test_access_needs_ops_read_and_hides_other_rooms(store: Store, room: str) -> None:
    other = f"{room}-other"
    rooms = Rooms(store)
    await rooms.create(room)
    await rooms.create(other)
    without = bearer(await token(store, "dev", "*", sorted(SCOPES - {"ops:read", "admin"})))
    admin = bearer(await token(store, "root", "*", ["admin"]))
    mine = bearer(await token(store, "oncall", [room], ["ops:read"]))
    pages = [f"/v1/ops/rooms/{{r}}{tail}" for tail in ("", "/tasks", "/events", "/stream")]
    limits = HttpLimits(rate=None, max_stream_seconds=0.2, keepalive_seconds=0.05)
    async with client(make_app(store, limits=limits)) as c:
        assert (await c.get("/v1/ops/rooms", headers=without)).status_code == 403
        for page in pages:
            refused = await c.get(page.format(r=room), headers=without)
            assert refused.status_code == 403, page
            assert refused.json()["error"]["type"] == "forbidden"
            assert (await c.get(page.format(r=room), headers=admin)).status_code == 200, page
            assert (await c.get(page.format(r=room), headers=mine)).status_code == 200, page
            hidden = await c.get(page.format(r=other), headers=mine)
            absent = await c.get(page.format(r=f"{room}-absent"), headers=admin)
            assert hidden.status_code == absent.status_code == 404, page
            assert hidden.json()["error"]["message"].replace(other, "X") == absent.json()["error"][
                "message"
            ].replace(f"{room}-absent", "X")
        listed = (await c.get("/v1/ops/rooms", headers=mine)).json()
        assert [r["room"] for r in listed["rooms"]] == [room]
        assert listed["next_after"] is None
        seen: set[str] = set()  # every room of the store (a shared one holds other tests')
        params: dict[str, str | int] = {"limit": 200}
        while True:
            page = (await c.get("/v1/ops/rooms", params=params, headers=admin)).json()
            seen |= {r["room"] for r in page["rooms"]}
            if page["next_after"] is None:
                break
            params["after"] = page["next_after"]
        assert {room, other} <= seen
        assert (await c.get("/v1/ops/rooms")).status_code == 401


async def test_pages_paginate(store: Store, room: str) -> None:
    rooms = Rooms(store)
    r = await rooms.create(room)
    await r.plan.add([TaskSpec(f"t{i:03d}") for i in range(150)])
    for i in range(60):
        await r.events.post("tick" if i % 2 else "tock", {"i": i})
    names = [f"{room}-{i}" for i in range(5)]
    for name in names:
        await rooms.create(name)
    auth = bearer(await token(store, "oncall", [room, *names], ["ops:read"]))
    async with client(make_app(store)) as c:
        ids: list[str] = []
        params: dict[str, Any] = {"limit": 40}
        while True:
            page = (await c.get(f"/v1/ops/rooms/{room}/tasks", params=params, headers=auth)).json()
            ids += [t["id"] for t in page["tasks"]]
            if page["next_after"] is None:
                break
            params["after"] = page["next_after"]
        assert ids == [f"t{i:03d}" for i in range(150)]
        first = (await c.get(f"/v1/ops/rooms/{room}", headers=auth)).json()["plan"]
        assert first["next_after"] == "t099"
        seqs: list[int] = []
        params = {"limit": 25, "type": "tick"}
        while True:
            page = (await c.get(f"/v1/ops/rooms/{room}/events", params=params, headers=auth)).json()
            assert all(e["type"] == "tick" for e in page["events"])
            seqs += [e["seq"] for e in page["events"]]
            if page["next_before"] is None:
                break
            params["before"] = page["next_before"]
        assert len(seqs) == 30 and seqs == sorted(seqs, reverse=True)
        listed: list[str] = []
        params = {"limit": 2}
        while True:
            page = (await c.get("/v1/ops/rooms", params=params, headers=auth)).json()
            listed += [x["room"] for x in page["rooms"]]
            if page["next_after"] is None:
                break
            params["after"] = page["next_after"]
        assert listed == [room, *names]


async def _sse(
    app: FastAPI, path: str, headers: dict[str, str], done: Callable[[bytes], bool], timeout: float
) -> list[tuple[float, bytes]]:
    """Drive the ASGI app as a client would: record when each body chunk was sent, and
    go away (``http.disconnect``) once ``done(body so far)``; the app must then end."""
    chunks: list[tuple[float, bytes]] = []
    gone = asyncio.Event()
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200
        if message["type"] == "http.response.body" and message.get("body"):
            chunks.append((time.monotonic(), message["body"]))
            if done(b"".join(c for _, c in chunks)):
                gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1234),
        "server": ("agentrooms.test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout)
    return chunks


def _changes(body: bytes) -> list[int]:
    out = []
    for block in body.decode().split("\n\n"):
        lines = dict(x.split(": ", 1) for x in block.splitlines() if not x.startswith(":"))
        if lines.get("event") == "change":
            out.append(json.loads(lines["data"])["last_seq"])
    return out


async def test_the_stream_wakes_within_a_second_of_another_handles_event(
    backend: Backend, room: str
) -> None:
    store = await backend.open()
    other = await backend.open() if backend.shared_across_processes else store
    await Rooms(store).create(room)
    head = await store.last_seq(room)
    auth = bearer(await token(store, "oncall", [room], ["ops:read"]))
    limits = HttpLimits(rate=None, keepalive_seconds=0.2, max_stream_seconds=30)
    app = make_app(store, limits=limits)
    posted: list[tuple[float, int]] = []
    connected = asyncio.Event()  # the stream sent its first frame: it is watching

    def seen(body: bytes) -> bool:
        changes = _changes(body)
        if changes:
            connected.set()
        return head + 1 in changes

    async def post_later() -> None:
        await connected.wait()
        await asyncio.sleep(0.7)  # idle past a few keepalives first
        seq = await Rooms(other).room(room).events.post("note", {"from": "another handle"})
        posted.append((time.monotonic(), seq))

    poster = asyncio.create_task(post_later())
    chunks = await _sse(
        app,
        f"/v1/ops/rooms/{room}/stream",
        auth,
        seen,
        timeout=10,
    )
    await poster
    ((at, seq),) = posted
    assert seq == head + 1
    body = b"".join(c for _, c in chunks)
    assert _changes(body) == [head, seq]
    assert b": keepalive" in body
    (woke,) = [t for t, c in chunks if f'"last_seq": {seq}'.encode() in c]
    assert woke - at < 1.0


async def test_dashboard_streams_have_a_pool_apart_from_the_agents_streams(
    store: Store, room: str
) -> None:
    await Rooms(store).create(room)
    auth = bearer(await token(store, "oncall", [room]))  # one agent: its streams and /ui
    limits = HttpLimits(
        rate=None, max_streams_per_agent=8, max_dashboard_streams=2, keepalive_seconds=0.05
    )
    app = make_app(store, limits=limits)
    held: list[asyncio.Task[list[tuple[float, bytes]]]] = []

    async def hold(path: str) -> None:
        opened = asyncio.Event()

        def seen(body: bytes) -> bool:
            opened.set()
            return b"refused" in body  # never: held until cancelled

        held.append(asyncio.create_task(_sse(app, path, auth, seen, timeout=60)))
        await asyncio.wait_for(opened.wait(), 10)

    events, dashboard = f"/v1/rooms/{room}/events/stream", f"/v1/ops/rooms/{room}/stream"
    try:
        for _ in range(8):
            await hold(events)  # the agent's own streams, all its slots
        await hold(dashboard)  # dashboards still open beside them
        await hold(dashboard)
        async with client(app) as c:
            ninth = await c.get(events, headers=auth)
            third = await c.get(dashboard, headers=auth)
            ticket = await c.post(f"{dashboard}-tickets", headers=auth)
        assert ninth.status_code == 429 and "8 open event streams" in ninth.text
        for refused in (third, ticket):
            assert refused.status_code == 429, refused.text
            error = error_of(refused)
            assert error["type"] == "rate_limited" and "Retry-After" in refused.headers
            assert "2 open dashboard streams" in error["message"]
            assert "max_dashboard_streams" in error["message"]
        held.pop().cancel()  # a tab closed: its slot is back
        await asyncio.sleep(0.1)
        async with client(app) as c:
            assert (await c.post(f"{dashboard}-tickets", headers=auth)).status_code == 201
    finally:
        for task in held:
            task.cancel()
        for task in held:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_documents_writer_is_the_agent_of_its_version(store: Store, room: str) -> None:
    r = await Rooms(store).create(room)
    ann, bob = [bearer(await token(store, who, [room])) for who in ("ann", "bob")]
    oncall = bearer(await token(store, "oncall", [room], ["ops:read"]))

    async def shown(c: Any) -> tuple[str | None, str | None]:
        read = (await c.get(f"/v1/rooms/{room}/docs/spec", headers=ann)).json()
        page = (await c.get(f"/v1/ops/rooms/{room}", headers=oncall)).json()
        (row,) = [d for d in page["documents"] if d["name"] == "spec"]
        assert row["version"] == read["version"]
        return read["writer"], row["last_writer"]

    async with client(make_app(store, limits=HttpLimits(rate=None))) as c:
        put = await c.put(
            f"/v1/rooms/{room}/docs/spec",
            json={"value": {"v": 1}},
            headers={**ann, "If-None-Match": "*"},
        )
        assert put.status_code == 201 and put.json()["writer"] == "ann"
        for i in range(100):  # others' events push the write out of any event window
            await r.events.post("note", {"i": i}, author="chatter")
        assert await shown(c) == ("ann", "ann")
        again = await c.put(
            f"/v1/rooms/{room}/docs/spec",
            json={"value": {"v": 2}},
            headers={**bob, "If-Match": put.headers["ETag"]},
        )
        assert again.status_code == 200 and again.json()["writer"] == "bob"
        assert await shown(c) == ("bob", "bob")
        listed = (await c.get(f"/v1/rooms/{room}/docs", headers=ann)).json()["documents"]
        assert [(d["name"], d["writer"]) for d in listed] == [("spec", "bob")]
