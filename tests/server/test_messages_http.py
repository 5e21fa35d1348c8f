"""Addressed events over HTTP (issue #26 item 1): POST events takes ``to`` and
``to_roles``; ``read-new?inbox=true`` returns what is addressed to the token's agent or
its role, once, through the inbox cursor; explicit ack redelivers until acknowledged;
the OpenAPI document describes the new fields."""

from __future__ import annotations

from agentrooms.store import Store
from tests.server.support import bearer, client, make_app, token


async def test_addressed_events_reach_the_inbox_of_their_agent_and_role_once(
    store: Store, room: str
) -> None:
    ann = bearer(await token(store, "ann"))
    scopes = ["events:read", "events:write"]
    bob = bearer(await token(store, "bob", scopes=scopes))
    cy = bearer(await token(store, "cy", scopes=scopes, role="reviewer"))
    async with client(make_app(store)) as c:
        assert (await c.post("/v1/rooms", json={"name": room}, headers=ann)).status_code == 201
        events = f"/v1/rooms/{room}/events"
        posts = [
            {"type": "note", "data": 0},
            {"type": "msg", "data": 1, "to": ["bob"]},
            {"type": "msg", "data": 2, "to_roles": ["reviewer"]},
            {"type": "msg", "data": 3, "to": ["bob"], "to_roles": ["reviewer"]},
        ]
        seqs = []
        for body in posts:
            answer = await c.post(events, json=body, headers=ann)
            assert answer.status_code == 201, answer.text
            seqs.append(answer.json()["seq"])
        inbox = f"{events}/read-new?inbox=true"
        got = (await c.post(inbox, headers=bob)).json()
        assert [e["data"] for e in got["events"]] == [1, 3]
        assert got["events"][1]["to"] == ["bob"] and got["events"][1]["to_roles"] == ["reviewer"]
        assert got["events"][0]["author"] == "ann"
        assert (got["scanned"], got["more"]) == (seqs[-1], False)
        assert (await c.post(inbox, headers=bob)).json()["events"] == []  # exactly once
        assert [e["data"] for e in (await c.post(inbox, headers=cy)).json()["events"]] == [2, 3]
        # the full read has its own cursor: everything, once
        full = (await c.post(f"{events}/read-new", headers=bob)).json()
        assert [e["type"] for e in full["events"]] == ["room.created", "note", "msg", "msg", "msg"]
        assert "scanned" not in full and "more" not in full
        cursor = await c.get(f"{events}/cursor?inbox=true", headers=bob)
        assert cursor.json() == {"cursor": seqs[-1]}


async def test_explicit_inbox_reads_redeliver_until_acked(store: Store, room: str) -> None:
    ann = bearer(await token(store, "ann"))
    bob = bearer(await token(store, "bob", scopes=["events:read"]))
    async with client(make_app(store)) as c:
        await c.post("/v1/rooms", json={"name": room}, headers=ann)
        events = f"/v1/rooms/{room}/events"
        await c.post(events, json={"type": "noise"}, headers=ann)
        mine = (await c.post(events, json={"type": "m", "to": ["bob"]}, headers=ann)).json()
        inbox = f"{events}/read-new?inbox=true&ack=explicit"
        for _ in range(2):
            got = (await c.post(inbox, headers=bob)).json()["events"]
            assert [e["seq"] for e in got] == [mine["seq"]]
        acked = await c.post(f"{events}/ack", json={"seq": mine["seq"], "inbox": True}, headers=bob)
        assert acked.json() == {"cursor": mine["seq"]}
        assert (await c.post(inbox, headers=bob)).json()["events"] == []
        assert (await c.get(f"{events}/cursor", headers=bob)).json() == {"cursor": 0}


async def test_bad_addressees_are_400_and_the_schema_names_the_fields(
    store: Store, room: str
) -> None:
    ann = bearer(await token(store, "ann"))
    async with client(make_app(store)) as c:
        await c.post("/v1/rooms", json={"name": room}, headers=ann)
        events = f"/v1/rooms/{room}/events"
        for body in (
            {"type": "m", "to": "bob"},
            {"type": "m", "to": ["no spaces"]},
            {"type": "m", "to_roles": ["a/b"]},
            {"type": "m", "to": [f"a{i}" for i in range(101)]},
        ):
            assert (await c.post(events, json=body, headers=ann)).status_code == 400, body
        spec = (await c.get("/openapi.json")).json()
        schemas = spec["components"]["schemas"]
        assert {"to", "to_roles"} <= set(schemas["EventIn"]["properties"])
        assert {"to", "to_roles"} <= set(schemas["EventOut"]["properties"])
        assert {"scanned", "more"} <= set(schemas["InboxList"]["properties"])
        params = spec["paths"]["/v1/rooms/{room}/events/read-new"]["post"]["parameters"]
        assert "inbox" in {p["name"] for p in params}


async def test_room_created_and_archived_over_http_name_the_tokens_agent(
    store: Store, room: str
) -> None:
    ann = bearer(await token(store, "ann"))
    async with client(make_app(store)) as c:
        assert (await c.post("/v1/rooms", json={"name": room}, headers=ann)).status_code == 201
        assert (await c.post(f"/v1/rooms/{room}/archive", headers=ann)).status_code == 200
        listed = (await c.get(f"/v1/rooms/{room}/events", headers=ann)).json()["events"]
        assert [(e["type"], e["author"]) for e in listed] == [
            ("room.created", "ann"),
            ("room.archived", "ann"),
        ]
