"""RFC 9110 conditional requests on documents: strong ETags on reads, 428 without a
precondition, 412 with the current ETag and representation, If-None-Match: * creates."""

from __future__ import annotations

import asyncio

import httpx

from agentrooms.store import Store
from tests.server.support import bearer, client, digest, error_of, make_app, token


async def _setup(store: Store, c: httpx.AsyncClient, room: str) -> dict[str, str]:
    headers = bearer(await token(store, "alice", [room], ["admin"], role="writer"))
    assert (await c.post("/v1/rooms", json={"name": room}, headers=headers)).status_code == 201
    return headers


async def test_writes_need_a_precondition(store: Store, room: str) -> None:
    async with client(make_app(store)) as c:
        auth = await _setup(store, c, room)
        before = await digest(store, [room])
        missing = await c.put(f"/v1/rooms/{room}/docs/writer/plan", json={"value": 1}, headers=auth)
        assert missing.status_code == 428
        assert error_of(missing)["type"] == "precondition_required"
        gone = await c.delete(f"/v1/rooms/{room}/docs/writer/plan", headers=auth)
        assert gone.status_code == 428
        assert await digest(store, [room]) == before


async def test_create_only_and_etags(store: Store, room: str) -> None:
    async with client(make_app(store)) as c:
        auth = await _setup(store, c, room)
        url = f"/v1/rooms/{room}/docs/writer/plan"
        created = await c.put(url, json={"value": {"v": 1}}, headers={**auth, "If-None-Match": "*"})
        assert created.status_code == 201
        version = created.json()["version"]
        assert created.headers["ETag"] == f'"{version}"'
        read = await c.get(url, headers=auth)
        assert read.status_code == 200 and read.headers["ETag"] == f'"{version}"'
        assert read.json() == {
            "name": "writer/plan",
            "value": {"v": 1},
            "version": version,
            "writer": "alice",  # the token's agent, recorded with the version
        }
        cached = await c.get(url, headers={**auth, "If-None-Match": f'"{version}"'})
        assert cached.status_code == 304 and cached.headers["ETag"] == f'"{version}"'
        before = await digest(store, [room])
        again = await c.put(url, json={"value": {"v": 9}}, headers={**auth, "If-None-Match": "*"})
        assert again.status_code == 412
        assert again.headers["ETag"] == f'"{version}"'
        assert error_of(again)["details"]["current"] == read.json()
        assert await digest(store, [room]) == before


async def test_stale_if_match_gets_412_with_the_current_representation(
    store: Store, room: str
) -> None:
    async with client(make_app(store)) as c:
        auth = await _setup(store, c, room)
        url = f"/v1/rooms/{room}/docs/writer/plan"
        first = await c.put(url, json={"value": "a"}, headers={**auth, "If-None-Match": "*"})
        v1 = first.headers["ETag"]
        second = await c.put(url, json={"value": "b"}, headers={**auth, "If-Match": v1})
        assert second.status_code == 200
        v2 = second.headers["ETag"]
        assert v2 != v1 and second.json()["value"] == "b"
        before = await digest(store, [room])
        stale = await c.put(url, json={"value": "c"}, headers={**auth, "If-Match": v1})
        assert stale.status_code == 412
        error = error_of(stale)
        assert error["type"] == "version_conflict"
        assert stale.headers["ETag"] == v2
        assert error["details"]["current"] == {
            "name": "writer/plan",
            "value": "b",
            "version": int(v2.strip('"')),
            "writer": "alice",
        }
        weak = await c.put(url, json={"value": "c"}, headers={**auth, "If-Match": f"W/{v2}"})
        assert weak.status_code == 412  # If-Match compares strongly
        stale_delete = await c.delete(url, headers={**auth, "If-Match": v1})
        assert stale_delete.status_code == 412 and stale_delete.headers["ETag"] == v2
        assert await digest(store, [room]) == before
        listed = await c.put(url, json={"value": "d"}, headers={**auth, "If-Match": f'"1", {v2}'})
        assert listed.status_code == 200
        star = await c.put(url, json={"value": "e"}, headers={**auth, "If-Match": "*"})
        assert star.status_code == 200
        deleted = await c.delete(url, headers={**auth, "If-Match": star.headers["ETag"]})
        assert deleted.status_code == 204
        assert (await c.get(url, headers=auth)).status_code == 404


async def test_if_match_on_an_absent_document_and_bad_headers(store: Store, room: str) -> None:
    async with client(make_app(store)) as c:
        auth = await _setup(store, c, room)
        url = f"/v1/rooms/{room}/docs/writer/none"
        before = await digest(store, [room])
        star = await c.put(url, json={"value": 1}, headers={**auth, "If-Match": "*"})
        assert star.status_code == 412 and "ETag" not in star.headers
        assert error_of(star)["details"]["current"] is None
        bad = await c.put(url, json={"value": 1}, headers={**auth, "If-Match": "seven"})
        assert bad.status_code == 400 and error_of(bad)["type"] == "bad_request"
        assert await digest(store, [room]) == before


async def test_tasks_carry_an_etag(store: Store, room: str) -> None:
    async with client(make_app(store)) as c:
        auth = await _setup(store, c, room)
        await c.post(f"/v1/rooms/{room}/tasks", json={"tasks": [{"id": "t1"}]}, headers=auth)
        task = await c.get(f"/v1/rooms/{room}/tasks/t1", headers=auth)
        assert task.headers["ETag"] == f'"{task.json()["version"]}"'


async def test_if_match_any_never_fails_while_the_document_exists(store: Store, room: str) -> None:
    """``If-Match: *`` holds whenever the document exists (RFC 9110): concurrent writers
    change its version under one another, but never make it fail."""
    async with client(make_app(store)) as c:
        auth = await _setup(store, c, room)
        url = f"/v1/rooms/{room}/docs/d"
        created = await c.put(url, json={"value": 0}, headers={**auth, "If-None-Match": "*"})
        assert created.status_code == 201

        async def put(i: int) -> int:
            answer = await c.put(url, json={"value": i}, headers={**auth, "If-Match": "*"})
            return answer.status_code

        assert await asyncio.gather(*(put(i) for i in range(1, 41))) == [200] * 40
        final = await c.get(url, headers=auth)
        assert final.status_code == 200 and final.json()["value"] in range(1, 41)

        async def delete() -> int:
            return (await c.delete(url, headers={**auth, "If-Match": "*"})).status_code

        codes = await asyncio.gather(delete(), *(put(i) for i in range(5)))
        assert codes[0] == 204 and set(codes[1:]) <= {200, 412}
        assert (await c.delete(url, headers={**auth, "If-Match": "*"})).status_code in (204, 412)
        assert (await c.get(url, headers=auth)).status_code in (200, 404)
        gone = await c.delete(url, headers={**auth, "If-Match": "*"})
        if gone.status_code == 204:
            gone = await c.delete(url, headers={**auth, "If-Match": "*"})
        assert gone.status_code == 412 and error_of(gone)["type"] == "version_conflict"
