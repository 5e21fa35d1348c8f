"""The path tools (reserve_paths, release_paths, check_paths) through the SDK's client:
overlapping and disjoint reservations, the conflict naming holder and pattern, renewal by
id, and a reservation lost to expiry told to its holder. In process on every backend,
over stdio (a server subprocess per agent) and over streamable HTTP with bearer
tokens."""

from __future__ import annotations

import asyncio

from agentrooms.rooms import Rooms
from agentrooms.server import AuthConfig, mint
from agentrooms.store import Store
from tests.conftest import Backend
from tests.mcp.support import (
    Connect,
    agents,
    bearer,
    call,
    err,
    http_client,
    http_server,
    in_process,
    ok,
    over_stdio,
)


async def reserve_conflict_renew_release_and_loss(
    connect: Connect, store: Store, room: str
) -> None:
    async with agents(connect, alice=None, bob=None) as team:
        a, b = team["alice"], team["bob"]
        mine = ok(await call(a, "reserve_paths", room=room, paths=["src/**"], ttl=30))
        assert set(mine) == {"id", "fence", "expires_at"}
        ok(await call(b, "reserve_paths", room=room, paths=["docs/*.md"]))  # disjoint
        refused = err(
            await call(b, "reserve_paths", room=room, paths=["src/a.py"]), "paths_reserved"
        )
        assert refused["details"]["holder"] == "alice"
        assert refused["details"]["pattern"] == "src/**"
        assert "'src/a.py' overlaps 'src/**'" in refused["message"]
        checked = ok(await call(b, "check_paths", room=room, paths=["src/x/y.py", "README"]))
        assert checked["conflicts"] == [
            {"path": "src/x/y.py", "holder": "alice", "held": "src/**", "mode": "exclusive"}
        ]
        shared = ok(await call(b, "check_paths", room=room, paths=["**"]))
        assert [c["held"] for c in shared["conflicts"]] == ["src/**"]  # only others'
        renewed = ok(
            await call(a, "reserve_paths", room=room, paths=["-"], renew=mine["id"], ttl=0.3)
        )
        assert renewed["id"] == mine["id"] and renewed["fence"] == mine["fence"]
        await asyncio.sleep(0.5)
        lost = err(
            await call(a, "reserve_paths", room=room, paths=["src/**"], renew=mine["id"]),
            "paths_lost",
        )
        assert "lapsed" in lost["message"] and "reserve_paths again" in lost["message"]
        got = ok(await call(b, "reserve_paths", room=room, paths=["src/a.py"]))
        assert got["fence"] > mine["fence"]
        events = [e.type for e in await store.read_log(room, 0, 100)]
        assert "paths.expired" in events
        assert ok(await call(a, "release_paths", room=room, reservation=got["id"])) == {
            "released": False
        }
        assert ok(await call(b, "release_paths", room=room, reservation=got["id"])) == {
            "released": True
        }
        bad = err(await call(a, "reserve_paths", room=room, paths=["src/{a,b}"]), "bad_request")
        assert "only literal text" in bad["message"]


async def test_reserve_conflict_renew_release_and_loss_in_process(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with in_process(store, room) as connect:
        await reserve_conflict_renew_release_and_loss(connect, store, room)


async def test_reserve_conflict_renew_release_and_loss_over_stdio(
    sqlite_backend: Backend, room: str
) -> None:
    async with over_stdio(sqlite_backend, room) as (connect, store):
        await reserve_conflict_renew_release_and_loss(connect, store, room)


async def test_paths_over_streamable_http(sqlite_backend: Backend, room: str) -> None:
    store = await sqlite_backend.open()
    await Rooms(store).create(room)
    scopes = ["rooms:read", "locks:write"]
    alice = (await mint(store, "alice", rooms=[room], scopes=scopes)).token
    reader = (await mint(store, "bob", rooms=[room], scopes=["rooms:read"])).token
    async with (
        http_server(store, auth=AuthConfig()) as url,
        http_client(url, bearer(alice)) as a,
        http_client(url, bearer(reader)) as b,
    ):
        held = ok(await call(a, "reserve_paths", room=room, paths=["lib/*.py"]))
        found = ok(await call(b, "check_paths", room=room, paths=["lib/x.py"]))
        assert [c["holder"] for c in found["conflicts"]] == ["alice"]
        err(await call(b, "reserve_paths", room=room, paths=["doc"]), "forbidden")
        done = ok(await call(a, "release_paths", room=room, reservation=held["id"]))
        assert done == {"released": True}
