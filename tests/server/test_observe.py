"""The operator's metrics, read from ``/metrics`` over HTTP after real operations on every
backend, and their labels bounded whatever rooms and paths a workload uses."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agentrooms.effects import Effect, Outbox, OutcomeUnknown, Worker
from agentrooms.metrics import EFFECT_STATES, LEASE_EVENTS, MAX_ROUTES, UNMATCHED_ROUTE
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.store import Store, open_store
from agentrooms.store.types import JSON
from tests.server.support import client, make_app

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(c: httpx.AsyncClient) -> Samples:
    answer = await c.get("/metrics")
    assert answer.status_code == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and want <= got)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def as_agent(agent: str) -> Mapping[str, str]:
    return {"X-Agent": agent}


async def test_requests_and_leases_are_counted(store: Store, room: str) -> None:
    async with client(make_app(store, dev=True)) as c:
        before = await scrape(c)
        a, b = as_agent("agent-a"), as_agent("agent-b")
        assert (await c.post("/v1/rooms", json={"name": room}, headers=a)).status_code == 201
        tasks = {"tasks": [{"id": "t1"}, {"id": "t2"}]}
        assert (await c.post(f"/v1/rooms/{room}/tasks", json=tasks, headers=a)).status_code == 201
        # granted twice, renewed once, one expired and reclaimed by another agent
        claim = f"/v1/rooms/{room}/tasks/{{}}/claim"
        lease = (await c.post(claim.format("t1"), json={"ttl": 60}, headers=a)).json()
        renewed = await c.post(f"/v1/rooms/{room}/tasks/t1/renew", json=lease, headers=a)
        assert renewed.status_code == 200
        assert (await c.post(claim.format("t2"), json={"ttl": 0.2}, headers=a)).status_code == 200
        await asyncio.sleep(0.4)
        reclaimed = await c.post(claim.format("t2"), json={"ttl": 60}, headers=b)
        assert reclaimed.status_code == 200 and reclaimed.json()["fence"] == 2
        assert (await c.post(claim.format("t1"), headers=b)).status_code == 409  # held
        assert (await c.get("/v1/rooms/no-such-room-here", headers=a)).status_code == 404
        assert (await c.get("/nowhere/at/all")).status_code == 404
        after = await scrape(c)

    leases = {e: moved(before, after, "agentrooms_leases_total", event=e) for e in LEASE_EVENTS}
    assert leases == {"granted": 2, "renewed": 1, "expired": 1, "reclaimed": 1, "lost": 0}
    requests = "agentrooms_http_requests_total"
    template = "/v1/rooms/{room}/tasks/{task}/claim"
    assert moved(before, after, requests, method="POST", route=template, status="2xx") == 3
    assert moved(before, after, requests, method="POST", route=template, status="4xx") == 1
    assert moved(before, after, requests, route="/v1/rooms/{room}", status="4xx") == 1
    assert moved(before, after, requests, route=UNMATCHED_ROUTE, status="4xx") == 1
    assert moved(before, after, "agentrooms_http_request_seconds_count", route=template) == 4
    assert not any(room in dict(labels).get("route", "") for _, labels in after)  # templates


async def test_a_lock_waiter_is_counted_while_in_line_and_its_wait_timed(
    store: Store, room: str
) -> None:
    a, b = as_agent("agent-a"), as_agent("agent-b")
    async with client(make_app(store, dev=True)) as c:
        await c.post("/v1/rooms", json={"name": room}, headers=a)
        before = await scrape(c)
        lock = f"/v1/rooms/{room}/locks/L"
        held = (await c.post(f"{lock}/acquire", json={"ttl": 30}, headers=a)).json()
        waiting = asyncio.create_task(
            c.post(f"{lock}/acquire", json={"ttl": 30, "wait": 10}, headers=b)
        )
        for _ in range(200):
            if moved(before, await scrape(c), "agentrooms_lock_waiters") >= 1:
                break
            await asyncio.sleep(0.02)
        assert moved(before, await scrape(c), "agentrooms_lock_waiters") == 1
        await asyncio.sleep(0.1)
        grant = {"token": held["token"], "fence": held["fence"]}
        released = await c.post(f"{lock}/release", json=grant, headers=a)
        assert released.json() == {"released": True}
        assert (await waiting).status_code == 200
        after = await scrape(c)
    assert moved(before, after, "agentrooms_lock_waiters") == 0
    assert moved(before, after, "agentrooms_lock_wait_seconds_count", outcome="granted") == 1
    assert moved(before, after, "agentrooms_lock_wait_seconds_sum", outcome="granted") >= 0.1


async def test_cursor_lag_is_observed_when_an_agent_reads(store: Store, room: str) -> None:
    a = as_agent("agent-a")
    async with client(make_app(store, dev=True)) as c:
        await c.post("/v1/rooms", json={"name": room}, headers=a)
        for i in range(5):
            await c.post(f"/v1/rooms/{room}/events", json={"type": "note", "data": i}, headers=a)
        head = (await c.get(f"/v1/rooms/{room}/events?limit=1000", headers=a)).json()
        last = head["events"][-1]["seq"]
        before = await scrape(c)
        read = await c.post(f"/v1/rooms/{room}/events/read-new?limit=2", headers=a)
        assert len(read.json()["events"]) == 2
        middle = await scrape(c)
        await c.post(f"/v1/rooms/{room}/events/read-new?limit=1000", headers=a)
        after = await scrape(c)
    lag = "agentrooms_cursor_lag_events"
    assert moved(before, middle, f"{lag}_count") == 1
    assert moved(before, middle, f"{lag}_sum") == last - 2  # a full page: the head was read
    assert moved(middle, after, f"{lag}_count") == 1
    assert moved(middle, after, f"{lag}_sum") == 0  # read to the head
    assert moved(middle, after, f"{lag}_bucket", le="0.0") == 1


async def test_effects_are_counted_by_the_state_they_move_into(store: Store, room: str) -> None:
    async with client(make_app(store, dev=True)) as c:
        await c.post("/v1/rooms", json={"name": room}, headers=as_agent("a"))
        before = await scrape(c)
        outbox = Outbox(Rooms(store).room(room))
        await outbox.request("ok-1", "mail", {})
        await outbox.request("unsure-1", "mail", {})

        async def handler(effect: Effect) -> JSON:
            if effect.id == "unsure-1":
                raise OutcomeUnknown("the sink timed out")
            return {"sent": True}

        await Worker(outbox, handler, name="w1").drain()
        after = await scrape(c)
    states = set(EFFECT_STATES.values())
    effects = {s: moved(before, after, "agentrooms_effects_total", state=s) for s in states}
    assert effects == {
        "pending": 2,
        "in_progress": 2,
        "done": 1,
        "unknown": 1,
        "failed": 0,
        "compensated": 0,
    }


def series_count(samples: Samples) -> int:
    return sum(1 for name, _ in samples if name.startswith("agentrooms_"))


async def test_a_thousand_rooms_and_paths_do_not_make_a_thousand_series() -> None:
    store = await open_store("memory://")
    try:
        async with client(make_app(store, dev=True)) as c:
            warm = as_agent("warm")
            await c.post("/v1/rooms", json={"name": "warm"}, headers=warm)
            await c.get("/v1/rooms/absent-0", headers=warm)
            await c.get("/warm/up")
            before = await scrape(c)
            rooms = Rooms(store)
            for i in range(1000):
                agent = as_agent(f"agent-{i}")
                assert (await c.get(f"/v1/rooms/absent-{i}", headers=agent)).status_code == 404
                assert (await c.get(f"/path-{i}/x{i}")).status_code == 404
                if i % 10 == 0:  # a hundred rooms with a lease and a cursor each
                    room = await rooms.create(f"room-{i}")
                    await room.plan.add([TaskSpec("t")])
                    await room.plan.claim("t", f"agent-{i}")
                    await room.events.read_new(f"agent-{i}")
            after = await scrape(c)
    finally:
        await store.close()
    assert moved(before, after, "agentrooms_http_requests_total", route=UNMATCHED_ROUTE) == 1000
    assert series_count(after) - series_count(before) <= 2 * 20  # new buckets, never per room
    routes = {r for _, labels in after if (r := dict(labels).get("route")) is not None}
    assert len(routes) <= MAX_ROUTES
    assert not any(r.startswith(("/path-", "/v1/rooms/absent")) for r in routes)
