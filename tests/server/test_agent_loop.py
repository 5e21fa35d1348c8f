"""A team of agents working a plan entirely over HTTP, each with its own token: create a
room, add tasks with dependencies, claim, renew, complete, read events through cursors,
heartbeat, hold a lock, write their role's documents."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from agentrooms.store import Store
from tests.helpers import in_line
from tests.server.support import bearer, client, make_app, token

WORKER_SCOPES = [
    "rooms:read",
    "plan:read",
    "lease:acquire",
    "docs:read",
    "docs:write",
    "events:read",
    "events:write",
    "presence:write",
    "locks:write",
]


async def worker(c: httpx.AsyncClient, room: str, auth: dict[str, str], name: str) -> list[str]:
    base = f"/v1/rooms/{room}"
    done: list[str] = []
    beat = await c.put(
        f"{base}/presence/{name}", json={"status": "working", "ttl": 30}, headers=auth
    )
    assert beat.status_code == 200
    idle = 0
    while idle < 20:
        claimed = await c.post(f"{base}/tasks/claim-next", json={"ttl": 30}, headers=auth)
        assert claimed.status_code == 200, claimed.text
        lease: dict[str, Any] | None = claimed.json()["lease"]
        if lease is None:
            tasks = (await c.get(f"{base}/tasks", headers=auth)).json()["tasks"]
            if all(t["status"] == "done" for t in tasks):
                return done
            idle += 1
            await asyncio.sleep(0.02)
            continue
        assert lease["agent"] == name
        renewed = await c.post(
            f"{base}/tasks/{lease['task_id']}/renew", json={**lease, "ttl": 60}, headers=auth
        )
        assert renewed.status_code == 200, renewed.text
        assert (
            renewed.json()["fence"] == lease["fence"]
            and renewed.json()["expires_at"] >= lease["expires_at"]
        )
        note = await c.put(
            f"{base}/docs/worker/{lease['task_id']}",
            json={
                "value": {"by": name},
                "guard": {"task": lease["task_id"], "fence": lease["fence"]},
            },
            headers={**auth, "If-None-Match": "*"},
        )
        assert note.status_code == 201, note.text
        result = {"by": name}
        completed = await c.post(
            f"{base}/tasks/{lease['task_id']}/complete",
            json={**renewed.json(), "result": result},
            headers={**auth, "Idempotency-Key": f"complete-{lease['task_id']}"},
        )
        assert completed.status_code == 200, completed.text
        assert completed.json()["status"] == "done"
        done.append(lease["task_id"])
    raise AssertionError(f"{name} gave up waiting")


async def test_full_agent_loop(store: Store, room: str) -> None:
    admin = bearer(await token(store, "lead", "*", ["admin"]))
    alice = bearer(await token(store, "alice", [room], WORKER_SCOPES, role="worker"))
    bob = bearer(await token(store, "bob", [room], WORKER_SCOPES, role="worker"))
    base = f"/v1/rooms/{room}"
    async with client(make_app(store)) as c:
        created = await c.post(
            "/v1/rooms", json={"name": room, "description": "loop"}, headers=admin
        )
        assert created.status_code == 201 and created.headers["Location"] == base
        plan = {
            "tasks": [
                {"id": "design", "title": "design it"},
                {"id": "build-a", "deps": ["design"]},
                {"id": "build-b", "deps": ["design"]},
                {"id": "ship", "deps": ["build-a", "build-b"], "payload": {"where": "prod"}},
            ]
        }
        added = await c.post(f"{base}/tasks", json=plan, headers=admin)
        assert added.status_code == 201 and added.json() == {"ready": ["design"]}

        lock = await c.post(f"{base}/locks/deploy/acquire", json={"ttl": 30}, headers=alice)
        assert lock.status_code == 200, lock.text
        held = await c.get(f"{base}/locks/deploy", headers=bob)
        assert held.json()["holder"]["owner"] == "alice"
        busy = await c.post(f"{base}/locks/deploy/acquire", json={}, headers=bob)
        assert busy.status_code == 409 and busy.json()["error"]["type"] == "lock_held"
        extended = await c.post(
            f"{base}/locks/deploy/extend", json={**_grant(lock.json()), "ttl": 60}, headers=alice
        )
        assert extended.status_code == 200 and extended.json()["fence"] == lock.json()["fence"]
        released = await c.post(
            f"{base}/locks/deploy/release", json=_grant(lock.json()), headers=alice
        )
        assert released.json() == {"released": True}

        finished = await asyncio.gather(
            worker(c, room, alice, "alice"), worker(c, room, bob, "bob")
        )
        assert sorted(finished[0] + finished[1]) == ["build-a", "build-b", "design", "ship"]

        tasks = (await c.get(f"{base}/tasks", headers=alice)).json()["tasks"]
        assert {t["id"]: t["status"] for t in tasks} == dict.fromkeys(
            ["build-a", "build-b", "design", "ship"], "done"
        )
        members = (await c.get(f"{base}/presence", headers=alice)).json()["members"]
        assert {m["agent"] for m in members} == {"alice", "bob"}
        docs = (await c.get(f"{base}/docs", params={"partition": "worker"}, headers=bob)).json()
        assert len(docs["documents"]) == 4

        seen: dict[str, list[int]] = {}
        for name, auth in (("alice", alice), ("bob", bob)):
            batch = await c.post(f"{base}/events/read-new", params={"limit": 1000}, headers=auth)
            seen[name] = [e["seq"] for e in batch.json()["events"]]
            types = [e["type"] for e in batch.json()["events"]]
            assert types.count("task.completed") == 4
            assert "lease.renewed" in types and "lock.released" in types
            again = await c.post(f"{base}/events/read-new", headers=auth)
            assert again.json() == {"events": []}  # each event once per cursor
            cursor = await c.get(f"{base}/events/cursor", headers=auth)
            assert cursor.json()["cursor"] == seen[name][-1]
        assert seen["alice"] == seen["bob"] == list(range(1, len(seen["alice"]) + 1))

        left = await c.delete(f"{base}/presence/bob", headers=bob)
        assert left.status_code == 204
        archived = await c.post(f"{base}/archive", headers=admin)
        assert archived.json()["archived"] is True
        refused = await c.post(f"{base}/events", json={"type": "late"}, headers=alice)
        assert (
            refused.status_code == 409 and refused.json()["error"]["type"] == "invalid_transition"
        )
        listed = await c.get("/v1/rooms", params={"archived": True}, headers=alice)
        assert [r["name"] for r in listed.json()["rooms"]] == [room]
        assert (await c.delete(base, headers=admin)).status_code == 204
        assert (await c.get(base, headers=admin)).status_code == 404


def _grant(lock: dict[str, Any]) -> dict[str, Any]:
    return {"token": lock["token"], "fence": lock["fence"]}


async def test_a_stale_holder_is_fenced_out(store: Store, room: str) -> None:
    admin = bearer(await token(store, "lead", "*", ["admin"]))
    alice = bearer(await token(store, "alice", [room], WORKER_SCOPES, role="worker"))
    bob = bearer(await token(store, "bob", [room], WORKER_SCOPES, role="worker"))
    base = f"/v1/rooms/{room}"
    async with client(make_app(store)) as c:
        await c.post("/v1/rooms", json={"name": room}, headers=admin)
        await c.post(f"{base}/tasks", json={"tasks": [{"id": "t"}]}, headers=admin)
        first = (await c.post(f"{base}/tasks/t/claim", json={"ttl": 0.05}, headers=alice)).json()
        await asyncio.sleep(0.2)
        second = await c.post(f"{base}/tasks/claim-next", json={}, headers=bob)
        assert second.json()["lease"]["fence"] == first["fence"] + 1
        late = await c.post(
            f"{base}/tasks/t/complete", json={**first, "result": "late"}, headers=alice
        )
        assert late.status_code == 409 and late.json()["error"]["type"] == "stale_fence"
        held = await c.post(f"{base}/tasks/t/claim", json={}, headers=alice)
        assert held.status_code == 409 and held.json()["error"]["type"] == "lease_held"
        task = (await c.get(f"{base}/tasks/t", headers=bob)).json()
        assert task["owner"] == "bob" and task["result"] is None


async def test_agents_take_turns_on_a_lock_with_requeue(store: Store, room: str) -> None:
    """``POST .../requeue``: the grant passes to the agent in line and the caller goes
    to the back of the line, in one request; its answer is the caller's next grant. A
    stale grant queues as acquire would; another agent's grant is refused."""
    admin = bearer(await token(store, "lead", "*", ["admin"]))
    alice = bearer(await token(store, "alice", [room], WORKER_SCOPES))
    bob = bearer(await token(store, "bob", [room], WORKER_SCOPES))
    base = f"/v1/rooms/{room}/locks/deploy"

    async with client(make_app(store)) as c:
        await c.post("/v1/rooms", json={"name": room}, headers=admin)
        a = (await c.post(f"{base}/acquire", json={"ttl": 30}, headers=alice)).json()
        b_waits = asyncio.create_task(c.post(f"{base}/acquire", json={"wait": 10}, headers=bob))
        await in_line(store, room, 1)
        a_next = asyncio.create_task(
            c.post(f"{base}/requeue", json={**_grant(a), "wait": 10}, headers=alice)
        )
        b = (await asyncio.wait_for(b_waits, 10)).json()
        assert (b["owner"], b["fence"]) == ("bob", a["fence"] + 1)
        await in_line(store, room, 1)  # alice, at the back of the line
        assert not a_next.done()
        b_next = asyncio.create_task(
            c.post(f"{base}/requeue", json={**_grant(b), "wait": 10}, headers=bob)
        )
        a2 = (await asyncio.wait_for(a_next, 10)).json()
        assert (a2["owner"], a2["fence"], a2["ttl"]) == ("alice", a["fence"] + 2, 30)
        foreign = await c.post(f"{base}/requeue", json=_grant(a2), headers=bob)
        assert foreign.status_code == 403 and foreign.json()["error"]["type"] == "forbidden"
        released = await c.post(f"{base}/release", json=_grant(a2), headers=alice)
        assert released.json() == {"released": True}
        b2 = (await asyncio.wait_for(b_next, 10)).json()
        assert (b2["owner"], b2["fence"]) == ("bob", a["fence"] + 3)
        # alice's first grant is long gone: she queues behind bob and times out
        stale = await c.post(f"{base}/requeue", json={**_grant(a), "wait": 0.2}, headers=alice)
        assert stale.status_code == 409 and stale.json()["error"]["type"] == "lock_held"
        await c.post(f"{base}/release", json=_grant(b2), headers=bob)
        assert (await c.get(base, headers=alice)).json()["holder"] is None
