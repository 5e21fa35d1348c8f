"""What the state says, through HTTP: an event's author is the token's agent (never the
body's), leases and lock grants say when they were granted and renewed, waiters when
they joined the line, and an expired lease shows as "expired, reclaimable"."""

from __future__ import annotations

import asyncio

from agentrooms.store import Store
from tests.helpers import in_line
from tests.server.support import bearer, client, make_app, token

MS = 0.002


async def test_an_event_posted_with_agent_xs_token_reads_back_with_author_x(
    store: Store, room: str
) -> None:
    ann = bearer(await token(store, "ann"))
    bob = bearer(await token(store, "bob", scopes=["events:read", "events:write"]))
    async with client(make_app(store)) as c:
        assert (await c.post("/v1/rooms", json={"name": room}, headers=ann)).status_code == 201
        events = f"/v1/rooms/{room}/events"
        assert (await c.post(f"{events}/read-new", headers=bob)).status_code == 200  # cursor
        first = await c.post(events, json={"type": "note", "data": 1}, headers=ann)
        second = await c.post(events, json={"type": "note", "data": 2}, headers=bob)
        assert (first.status_code, second.status_code) == (201, 201)
        forged = await c.post(events, json={"type": "note", "author": "ann"}, headers=bob)
        assert forged.status_code == 400  # the body cannot name an author
        listed = (await c.get(events, headers=bob)).json()["events"]
        mine = {e["seq"]: e["author"] for e in listed if e["type"] == "note"}
        assert mine == {first.json()["seq"]: "ann", second.json()["seq"]: "bob"}
        assert [e["author"] for e in listed if e["type"] == "room.created"] == ["ann"]
        new = (await c.post(f"{events}/read-new", headers=bob)).json()["events"]
        assert [(e["data"], e["author"]) for e in new] == [(1, "ann"), (2, "bob")]
        await c.post(f"/v1/rooms/{room}/tasks", json={"tasks": [{"id": "t"}]}, headers=ann)
        await c.post(f"/v1/rooms/{room}/tasks/t/claim", json={}, headers=ann)
        tail = (await c.get(events, params={"after": second.json()["seq"]}, headers=bob)).json()
        assert [(e["type"], e["author"]) for e in tail["events"]] == [
            ("task.added", "ann"),
            ("lease.granted", "ann"),
        ]


async def test_leases_show_their_times_and_expiry_as_it_is(store: Store, room: str) -> None:
    ann = bearer(await token(store, "ann"))
    async with client(make_app(store)) as c:
        await c.post("/v1/rooms", json={"name": room}, headers=ann)
        tasks = f"/v1/rooms/{room}/tasks"
        await c.post(tasks, json={"tasks": [{"id": "t"}, {"id": "u"}]}, headers=ann)
        lease = (await c.post(f"{tasks}/t/claim", json={"ttl": 0.3}, headers=ann)).json()
        held = (await c.get(f"{tasks}/t", headers=ann)).json()
        assert (held["state"], held["lease_state"]) == ("claimed", "held")
        assert 0 < held["lease_remaining"] <= 0.3
        assert held["lease_granted_at"] == lease["granted_at"] is not None
        assert held["lease_renewed_at"] is None
        fence = lease["fence"]
        renewed = await c.post(f"{tasks}/t/renew", json={"fence": fence, "ttl": 0.3}, headers=ann)
        assert renewed.status_code == 200
        assert renewed.json()["granted_at"] == lease["granted_at"]
        after = (await c.get(f"{tasks}/t", headers=ann)).json()
        assert after["lease_renewed_at"] >= after["lease_granted_at"] == lease["granted_at"]
        await asyncio.sleep(0.5)
        expired = (await c.get(f"{tasks}/t", headers=ann)).json()
        assert (expired["status"], expired["state"], expired["lease_remaining"]) == (
            "claimed",
            "expired, reclaimable",
            0.0,
        )
        listed = {t["id"]: t for t in (await c.get(tasks, headers=ann)).json()["tasks"]}
        assert listed["t"]["state"] == "expired, reclaimable"
        assert (listed["u"]["state"], listed["u"]["lease_state"]) == ("ready", None)


async def test_a_lock_shows_its_grant_times_and_its_line(store: Store, room: str) -> None:
    ann = bearer(await token(store, "ann"))
    bob = bearer(await token(store, "bob"))
    async with client(make_app(store)) as c:
        await c.post("/v1/rooms", json={"name": room}, headers=ann)
        locks = f"/v1/rooms/{room}/locks/L"
        granted = (await c.post(f"{locks}/acquire", json={"ttl": 30}, headers=ann)).json()
        assert granted["granted_at"] is not None and granted["renewed_at"] is None
        state = (await c.get(locks, headers=bob)).json()
        assert state["waiters"] == []
        assert abs(state["holder"]["granted_at"] - granted["granted_at"]) <= MS
        ref = {"token": granted["token"], "fence": granted["fence"]}
        extended = await c.post(f"{locks}/extend", json={**ref, "ttl": 30}, headers=ann)
        assert extended.status_code == 200
        state = (await c.get(locks, headers=bob)).json()
        assert state["holder"]["renewed_at"] >= state["holder"]["granted_at"]
        waiting = asyncio.create_task(
            c.post(f"{locks}/acquire", json={"ttl": 30, "wait": 20}, headers=bob)
        )
        await in_line(store, room, 1)
        state = (await c.get(locks, headers=ann)).json()
        [waiter] = state["waiters"]
        assert waiter["owner"] == "bob" and waiter["joined_at"] >= granted["granted_at"]
        # only the grant's token releases: a made-up one with a larger fence does not,
        # and the grant's token sent by another agent is refused
        forged = {"token": "0" * 32, "fence": granted["fence"] + 100}
        assert not (await c.post(f"{locks}/release", json=forged, headers=ann)).json()["released"]
        foreign = await c.post(f"{locks}/release", json=ref, headers=bob)
        assert foreign.status_code == 403 and foreign.json()["error"]["type"] == "forbidden"
        assert (await c.get(locks, headers=bob)).json()["holder"]["owner"] == "ann"
        assert (await c.post(f"{locks}/release", json=ref, headers=ann)).json()["released"]
        handed = (await asyncio.wait_for(waiting, 10)).json()
        events = (await c.get(f"/v1/rooms/{room}/events", headers=ann)).json()["events"]
        [handoff] = [e for e in events if e["type"] == "lock.handoff"]
        assert handoff["author"] == "ann"
        state = (await c.get(locks, headers=ann)).json()
        assert state["holder"]["owner"] == "bob" and state["waiters"] == []
        assert abs(state["holder"]["granted_at"] - handoff["time"]) <= MS
        assert abs(handed["granted_at"] - handoff["time"]) <= MS


async def test_a_lock_whose_holder_expired_shows_as_free(store: Store, room: str) -> None:
    ann = bearer(await token(store, "ann"))
    async with client(make_app(store)) as c:
        await c.post("/v1/rooms", json={"name": room}, headers=ann)
        locks = f"/v1/rooms/{room}/locks/L"
        await c.post(f"{locks}/acquire", json={"ttl": 0.2}, headers=ann)
        assert (await c.get(locks, headers=ann)).json()["holder"]["owner"] == "ann"
        await asyncio.sleep(0.4)
        assert (await c.get(locks, headers=ann)).json() == {
            "name": "L",
            "holder": None,
            "waiters": [],
        }
