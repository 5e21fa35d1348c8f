"""GET /v1/rooms by page: only the token's rooms, chosen before any room is described."""

from __future__ import annotations

from agentrooms.store import Store
from agentrooms.store.types import Glance
from agentrooms.store.wrap import Forwarding
from tests.server.support import bearer, client, make_app, token


class Glances(Forwarding):
    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.described: list[str] = []

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        self.described += rooms
        return await self.inner._glance(rooms, keys, sets)


async def test_rooms_by_page_over_http(store: Store, room: str) -> None:
    names = [f"{room}-{i}" for i in range(5)]
    admin = bearer(await token(store, "lead", "*", ["admin"]))
    mine = names[1], names[3]
    alice = bearer(await token(store, "alice", list(mine), ["rooms:read"]))
    counted = Glances(store)
    async with client(make_app(counted)) as c:
        for name in names:
            assert (
                await c.post("/v1/rooms", json={"name": name}, headers=admin)
            ).status_code == 201
        counted.described = []
        first = (await c.get("/v1/rooms", params={"limit": 1}, headers=alice)).json()
        assert [r["name"] for r in first["rooms"]] == [mine[0]]
        assert first["next_after"] == mine[0]
        assert counted.described == [mine[0]]  # nothing else was described
        second = await c.get(
            "/v1/rooms", params={"limit": 1, "after": first["next_after"]}, headers=alice
        )
        assert [r["name"] for r in second.json()["rooms"]] == [mine[1]]
        assert set(counted.described) == set(mine)
        everything = (await c.get("/v1/rooms", params={"limit": 1000}, headers=alice)).json()
        assert ([r["name"] for r in everything["rooms"]], everything["next_after"]) == (
            list(mine),
            None,
        )
        bad = await c.get("/v1/rooms", params={"limit": 0}, headers=alice)
        assert bad.status_code in (400, 422)


async def test_presence_and_tasks_by_page_over_http(store: Store, room: str) -> None:
    admin = bearer(await token(store, "lead", "*", ["admin"]))
    base = f"/v1/rooms/{room}"
    async with client(make_app(store)) as c:
        assert (await c.post("/v1/rooms", json={"name": room}, headers=admin)).status_code == 201
        tasks = {"tasks": [{"id": "t1"}, {"id": "t2"}, {"id": "t3"}]}
        assert (await c.post(f"{base}/tasks", json=tasks, headers=admin)).status_code == 201
        page = (await c.get(f"{base}/tasks", params={"limit": 2}, headers=admin)).json()
        assert ([t["id"] for t in page["tasks"]], page["next_after"]) == (["t1", "t2"], "t2")
        page = (await c.get(f"{base}/tasks", params={"after": "t2"}, headers=admin)).json()
        assert ([t["id"] for t in page["tasks"]], page["next_after"]) == (["t3"], None)
        whole = (await c.get(f"{base}/tasks", headers=admin)).json()
        assert len(whole["tasks"]) == 3 and whole["next_after"] is None
        beat = await c.put(f"{base}/presence/lead", json={"ttl": 600}, headers=admin)
        assert beat.status_code == 200
        page = (await c.get(f"{base}/presence", params={"limit": 1}, headers=admin)).json()
        assert ([m["agent"] for m in page["members"]], page["next_after"]) == (["lead"], None)
