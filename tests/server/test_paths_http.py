"""Path reservations over HTTP: reserve, conflict naming holder and pattern, check for
another agent, renew and release by the owner only, lapse told by ``paths_lost``."""

from __future__ import annotations

import asyncio

from agentrooms.rooms import Rooms
from agentrooms.store import Store
from tests.server.support import bearer, client, error_of, make_app, token


async def test_paths_over_http(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    alice = bearer(await token(store, "alice", [room], ["rooms:read", "locks:write"]))
    bob = bearer(await token(store, "bob", [room], ["rooms:read", "locks:write"]))
    base = f"/v1/rooms/{room}/paths"
    async with client(make_app(store)) as c:
        got = await c.post(f"{base}/reserve", json={"paths": ["src/**"], "ttl": 60}, headers=alice)
        assert got.status_code == 200, got.text
        held = got.json()
        assert (held["owner"], held["mode"], held["paths"]) == ("alice", "exclusive", ["src/**"])
        refused = await c.post(f"{base}/reserve", json={"paths": ["src/a.py"]}, headers=bob)
        assert refused.status_code == 409
        error = error_of(refused)
        assert error["type"] == "paths_reserved"
        assert error["details"] == {
            "name": "src/a.py",
            "holder": "alice",
            "pattern": "src/**",
            "reservation": held["id"],
            "mode": "exclusive",
        }
        bad = await c.post(f"{base}/reserve", json={"paths": ["src/[ab]"]}, headers=bob)
        assert bad.status_code == 400 and error_of(bad)["type"] == "bad_request"
        checked = await c.post(f"{base}/check", json={"paths": ["src/x/y.py"]}, headers=bob)
        assert [(x["path"], x["holder"], x["held"]) for x in checked.json()["conflicts"]] == [
            ("src/x/y.py", "alice", "src/**")
        ]
        mine = await c.post(f"{base}/check", json={"paths": ["src/x/y.py"]}, headers=alice)
        assert mine.json() == {"conflicts": []}
        listed = await c.get(base, headers=bob)
        assert [r["id"] for r in listed.json()["reservations"]] == [held["id"]]
        theirs = await c.post(f"{base}/{held['id']}/renew", json={}, headers=bob)
        assert theirs.status_code == 409 and error_of(theirs)["type"] == "paths_lost"
        steal = await c.post(f"{base}/{held['id']}/release", headers=bob)
        assert steal.json() == {"released": False}
        renewed = await c.post(f"{base}/{held['id']}/renew", json={"ttl": 0.2}, headers=alice)
        assert renewed.status_code == 200 and renewed.json()["ttl"] == 0.2
        await asyncio.sleep(0.4)
        lost = await c.post(f"{base}/{held['id']}/renew", json={}, headers=alice)
        assert lost.status_code == 409 and error_of(lost)["type"] == "paths_lost"
        assert "lapsed" in error_of(lost)["message"]
        again = await c.post(f"{base}/reserve", json={"paths": ["src/a.py"]}, headers=bob)
        assert again.status_code == 200
        gone = await c.post(f"{base}/{again.json()['id']}/release", headers=bob)
        assert gone.json() == {"released": True}
