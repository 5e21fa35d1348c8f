"""A tool call repeated with the same request_id answers what the first call answered
(the version, seq or grant the store assigned), not the state as it is now, and request
ids of two agents never collide, whatever their names contain."""

from __future__ import annotations

from agentrooms.rooms import Rooms
from agentrooms.store import Store
from tests.mcp.support import call, err, ok
from tests.mcp.test_errors import agents


async def test_replays_answer_the_first_outcome(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with agents(store, "alice", "bob") as (alice, bob):
        write = {"room": room, "name": "notes", "value": "alice's", "version": 0}
        first = ok(await call(alice, "write_document", **write, request_id="w1"))
        other = ok(
            await call(
                bob,
                "write_document",
                room=room,
                name="notes",
                value="bob's",
                version=first["version"],
            )
        )
        replay = ok(await call(alice, "write_document", **write, request_id="w1"))
        assert replay == first and other["version"] != first["version"]
        stale = await call(
            alice,
            "write_document",
            room=room,
            name="notes",
            value="again",
            version=replay["version"],
        )
        err(stale, "version_conflict")
        doc = ok(await call(alice, "read_document", room=room, name="notes"))
        assert doc["value"] == "bob's"

        posted = ok(await call(alice, "post_event", room=room, type="n", data=1, request_id="e1"))
        ok(await call(bob, "post_event", room=room, type="n", data=2))
        again = ok(await call(alice, "post_event", room=room, type="n", data=1, request_id="e1"))
        assert again == posted and isinstance(posted["seq"], int)

        grant = ok(await call(alice, "acquire_lock", room=room, name="deploy", request_id="g1"))
        assert (
            ok(await call(alice, "acquire_lock", room=room, name="deploy", request_id="g1"))
            == grant
        )
        ok(await call(alice, "release_lock", room=room, name="deploy", token=grant["token"]))
        ok(await call(bob, "acquire_lock", room=room, name="deploy"))
        late = ok(await call(alice, "acquire_lock", room=room, name="deploy", request_id="g1"))
        assert late == grant  # the first grant, not lock_held


async def test_request_ids_of_two_agents_never_collide(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with agents(store, "x", "x:y") as (x, xy):
        a = ok(await call(x, "post_event", room=room, type="n", data="x", request_id="y:K"))
        b = ok(await call(xy, "post_event", room=room, type="n", data="x:y", request_id="K"))
        assert a["seq"] != b["seq"]
        events = [e["data"] for e in ok(await call(x, "read_new_events", room=room))["events"]]
        assert events[-2:] == ["x", "x:y"]
