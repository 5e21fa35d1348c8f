"""Idempotency-Key: a repeated command returns the original outcome and applies nothing;
the same key with another body is 422 idempotency_mismatch; keys are scoped per agent."""

from __future__ import annotations

import httpx

from agentrooms.store import Store
from tests.server.support import bearer, client, digest, error_of, make_app, token


async def _room(store: Store, c: httpx.AsyncClient, room: str) -> dict[str, str]:
    auth = bearer(await token(store, "alice", [room], ["admin"], role="writer"))
    assert (await c.post("/v1/rooms", json={"name": room}, headers=auth)).status_code == 201
    return auth


async def test_replay_and_mismatch(store: Store, room: str) -> None:
    async with client(make_app(store)) as c:
        alice = await _room(store, c, room)
        url = f"/v1/rooms/{room}/tasks"
        body = {"tasks": [{"id": "t1"}, {"id": "t2", "deps": ["t1"]}]}
        keyed = {**alice, "Idempotency-Key": "add-1"}
        first = await c.post(url, json=body, headers=keyed)
        assert first.status_code == 201 and first.json() == {"ready": ["t1"]}
        before = await digest(store, [room])
        again = await c.post(url, json=body, headers=keyed)
        assert again.status_code == 201 and again.json() == first.json()
        assert await digest(store, [room]) == before
        other = await c.post(url, json={"tasks": [{"id": "t3"}]}, headers=keyed)
        assert other.status_code == 422
        assert error_of(other)["type"] == "idempotency_mismatch"
        assert await digest(store, [room]) == before
        bob = bearer(await token(store, "bob", [room], ["admin"]))
        scoped = await c.post(
            url, json={"tasks": [{"id": "t3"}]}, headers={**bob, "Idempotency-Key": "add-1"}
        )
        assert scoped.status_code == 201  # the key is bob's own, not alice's


async def test_lease_commands_replay(store: Store, room: str) -> None:
    async with client(make_app(store)) as c:
        alice = await _room(store, c, room)
        await c.post(f"/v1/rooms/{room}/tasks", json={"tasks": [{"id": "t1"}]}, headers=alice)
        claim = {**alice, "Idempotency-Key": "claim-1"}
        lease = (await c.post(f"/v1/rooms/{room}/tasks/claim-next", json={}, headers=claim)).json()
        assert lease["lease"]["task_id"] == "t1"
        before = await digest(store, [room])
        replay = await c.post(f"/v1/rooms/{room}/tasks/claim-next", json={}, headers=claim)
        assert replay.json() == lease
        assert await digest(store, [room]) == before
        done_key = {**alice, "Idempotency-Key": "done-1"}
        body = {**lease["lease"], "result": {"ok": True}}
        done = await c.post(f"/v1/rooms/{room}/tasks/t1/complete", json=body, headers=done_key)
        assert done.status_code == 200 and done.json()["status"] == "done"
        before = await digest(store, [room])
        again = await c.post(f"/v1/rooms/{room}/tasks/t1/complete", json=body, headers=done_key)
        assert again.status_code == 200 and again.json()["status"] == "done"
        assert await digest(store, [room]) == before
        changed = {**body, "result": {"ok": False}}
        mismatch = await c.post(
            f"/v1/rooms/{room}/tasks/t1/complete", json=changed, headers=done_key
        )
        assert mismatch.status_code == 422
        assert await digest(store, [room]) == before


async def test_document_and_event_replay(store: Store, room: str) -> None:
    async with client(make_app(store)) as c:
        alice = await _room(store, c, room)
        url = f"/v1/rooms/{room}/docs/writer/notes"
        created = await c.put(url, json={"value": 1}, headers={**alice, "If-None-Match": "*"})
        etag = created.headers["ETag"]
        keyed = {**alice, "If-Match": etag, "Idempotency-Key": "doc-1"}
        first = await c.put(url, json={"value": 2}, headers=keyed)
        assert first.status_code == 200
        before = await digest(store, [room])
        replay = await c.put(url, json={"value": 2}, headers=keyed)
        assert replay.status_code == 200  # replayed, although If-Match is now stale
        assert replay.json() == first.json()
        assert await digest(store, [room]) == before
        posted = await c.post(
            f"/v1/rooms/{room}/events",
            json={"type": "note", "data": {"n": 1}},
            headers={**alice, "Idempotency-Key": "ev-1"},
        )
        assert posted.status_code == 201
        before = await digest(store, [room])
        again = await c.post(
            f"/v1/rooms/{room}/events",
            json={"type": "note", "data": {"n": 1}},
            headers={**alice, "Idempotency-Key": "ev-1"},
        )
        assert again.status_code == 201 and again.json() == posted.json()
        assert await digest(store, [room]) == before


async def test_a_replay_after_another_writer_answers_the_first_outcome(
    store: Store, room: str
) -> None:
    """The replayed ETag is the first write's, not the current one, so a write made with
    it is refused (412) instead of overwriting the other agent's change."""
    async with client(make_app(store)) as c:
        alice = await _room(store, c, room)
        bob = bearer(await token(store, "bob", [room], ["admin"]))
        url = f"/v1/rooms/{room}/docs/notes"
        keyed = {**alice, "If-None-Match": "*", "Idempotency-Key": "w1"}
        first = await c.put(url, json={"value": "alice's"}, headers=keyed)
        assert first.status_code == 201
        other = await c.put(url, json={"value": "bob's"}, headers={**bob, "If-Match": "*"})
        assert other.status_code == 200 and other.headers["ETag"] != first.headers["ETag"]
        replay = await c.put(url, json={"value": "alice's"}, headers=keyed)
        assert replay.status_code == 201
        assert replay.headers["ETag"] == first.headers["ETag"]
        assert replay.json() == first.json()
        stale = await c.put(
            url,
            json={"value": "alice's again"},
            headers={**alice, "If-Match": replay.headers["ETag"]},
        )
        assert stale.status_code == 412
        assert (await c.get(url, headers=alice)).json()["value"] == "bob's"

        events = f"/v1/rooms/{room}/events"
        ev = {**alice, "Idempotency-Key": "e1"}
        posted = await c.post(events, json={"type": "note", "data": 1}, headers=ev)
        assert (await c.post(events, json={"type": "note"}, headers=bob)).status_code == 201
        again = await c.post(events, json={"type": "note", "data": 1}, headers=ev)
        assert again.json() == posted.json() and isinstance(posted.json()["seq"], int)


async def test_idempotency_scopes_cannot_collide(store: Store, room: str) -> None:
    """Agent ``x`` with key ``y:K`` and agent ``x:y`` with key ``K`` are two commands."""
    async with client(make_app(store)) as c:
        x = bearer(await token(store, "x", [room], ["admin"]))
        xy = bearer(await token(store, "x:y", [room], ["admin"]))
        assert (await c.post("/v1/rooms", json={"name": room}, headers=x)).status_code == 201
        url = f"/v1/rooms/{room}/tasks"
        one = await c.post(
            url, json={"tasks": [{"id": "a"}]}, headers={**x, "Idempotency-Key": "y:K"}
        )
        two = await c.post(
            url, json={"tasks": [{"id": "b"}]}, headers={**xy, "Idempotency-Key": "K"}
        )
        assert one.status_code == 201 and one.json() == {"ready": ["a"]}
        assert two.status_code == 201 and two.json() == {"ready": ["b"]}
        plan = (await c.get(url, headers=x)).json()
        assert sorted(t["id"] for t in plan["tasks"]) == ["a", "b"]


async def test_a_malformed_key_is_refused(store: Store, room: str) -> None:
    async with client(make_app(store)) as c:
        alice = await _room(store, c, room)
        before = await digest(store, [room])
        bad = await c.post(
            f"/v1/rooms/{room}/tasks",
            json={"tasks": [{"id": "t1"}]},
            headers={**alice, "Idempotency-Key": "x" * 65},
        )
        assert bad.status_code == 400 and error_of(bad)["type"] == "bad_request"
        assert await digest(store, [room]) == before
