"""The dashboard's pages and stream tickets through HTTP: who gets the shell (401, 403, 404,
200), what the shell and its files are sent with, and that a stream ticket is single use,
bound to its room, short-lived and no better than its token."""

from __future__ import annotations

import asyncio
import re
from importlib import resources

import pytest

from agentrooms.errors import Unauthorized
from agentrooms.rooms import Rooms
from agentrooms.server import AuthConfig, HttpLimits, Principal, revoke
from agentrooms.server.auth import authenticate, parse_token
from agentrooms.server.tickets import mint_ticket, redeem
from agentrooms.server.ui import STATIC
from agentrooms.store import Store
from tests.server.support import bearer, client, error_of, make_app, token


async def test_pages_need_ops_read(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    app = make_app(store)
    reader = await token(store, "op", scopes=["ops:read"])
    planner = await token(store, "planner", scopes=["plan:read", "events:read", "rooms:read"])
    elsewhere = await token(store, "op2", rooms=["other-room"], scopes=["ops:read"])
    async with client(app) as c:
        for path in ("/ui", f"/ui/rooms/{room}"):
            anonymous = await c.get(path)  # the shell, to ask for a token
            assert anonymous.status_code == 401
            assert anonymous.headers["www-authenticate"].startswith("Bearer")
            assert 'id="login"' in anonymous.text
            lacking = await c.get(path, headers=bearer(planner))
            assert lacking.status_code == 403 and error_of(lacking)["type"] == "forbidden"
            allowed = await c.get(path, headers=bearer(reader))
            assert allowed.status_code == 200
            assert allowed.headers["content-type"].startswith("text/html")
            assert "script-src 'self'" in allowed.headers["content-security-policy"]
            assert '<script type="module" src="/ui/static/app.js">' in allowed.text
        outside = await c.get(f"/ui/rooms/{room}", headers=bearer(elsewhere))
        absent = await c.get("/ui/rooms/no-such-room-here", headers=bearer(elsewhere))
        assert outside.status_code == absent.status_code == 404
        assert (await c.get("/ui", headers=bearer(elsewhere))).status_code == 200
        bad = await c.get("/ui", headers={"Authorization": "Bearer nonsense"})
        assert bad.status_code == 401 and error_of(bad)["type"] == "unauthorized"


async def test_pages_in_dev_mode_and_static_files(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    async with client(make_app(store, dev=True)) as c:
        assert (await c.get("/ui")).status_code == 200
        assert (await c.get(f"/ui/rooms/{room}")).status_code == 200
        for name, media in STATIC.items():
            answer = await c.get(f"/ui/static/{name}")
            assert answer.status_code == 200 and answer.headers["content-type"] == media
            assert answer.headers["x-content-type-options"] == "nosniff"
        assert (await c.get("/ui/static/secrets.txt")).status_code == 404
        assert (await c.get("/ui/static/../__init__.py")).status_code == 404
        assert (await c.get("/ui/")).status_code == 404


def test_every_module_the_page_imports_is_served() -> None:
    static = resources.files("agentrooms.server.ui").joinpath("static")
    shipped = {f.name for f in static.iterdir()}
    assert shipped == set(STATIC)
    for name in STATIC:
        text = static.joinpath(name).read_text()
        for target in re.findall(r'from "\./([^"]+)"|(?:src|href)="/ui/static/([^"]+)"', text):
            assert "".join(target) in STATIC, (name, target)
        assert "http://" not in text and "https://" not in text, name  # nothing from elsewhere


async def test_stream_ticket_is_single_use_and_bound(store: Store, room: str) -> None:
    rooms = Rooms(store)
    await rooms.create(room)
    await rooms.create(f"{room}-b")
    app = make_app(store, limits=HttpLimits(rate=None, max_stream_seconds=0.2))
    reader = await token(store, "op", scopes=["ops:read"])
    planner = await token(store, "planner", scopes=["plan:read"])
    async with client(app) as c:
        refused = await c.post(f"/v1/ops/rooms/{room}/stream-tickets", headers=bearer(planner))
        assert refused.status_code == 403
        missing = await c.post("/v1/ops/rooms/no-such-room/stream-tickets", headers=bearer(reader))
        assert missing.status_code == 404
        minted = await c.post(f"/v1/ops/rooms/{room}/stream-tickets", headers=bearer(reader))
        assert minted.status_code == 201
        body = minted.json()
        assert body["url"] == f"/v1/ops/rooms/{room}/stream?ticket={body['ticket']}"
        assert "ar_" not in body["ticket"]
        # another room's stream does not take it, and does not use it up
        wrong = await c.get(f"/v1/ops/rooms/{room}-b/stream?ticket={body['ticket']}")
        assert wrong.status_code == 401
        opened = await c.get(body["url"])  # the stream ends after max_stream_seconds
        assert opened.status_code == 200
        assert opened.headers["content-type"].startswith("text/event-stream")
        assert "event: change" in opened.text
        again = await c.get(body["url"])
        assert again.status_code == 401 and error_of(again)["type"] == "unauthorized"
        second = await c.post(f"/v1/ops/rooms/{room}/stream-tickets", headers=bearer(reader))
    principal = await redeem(store, AuthConfig(), second.json()["ticket"], room)
    assert principal.agent == "op" and principal.has("ops:read")


async def test_stream_ticket_expires_and_follows_its_token(store: Store, room: str) -> None:
    await Rooms(store).create(room)
    reader = await token(store, "op", scopes=["ops:read"])
    who, _ = await authenticate(store, *parse_token(reader))
    short = await mint_ticket(store, who, room, ttl=0.3)
    await asyncio.sleep(0.6)
    with pytest.raises(Unauthorized, match="unknown, used or expired"):
        await redeem(store, AuthConfig(), short.ticket, room)
    kept = await mint_ticket(store, who, room)
    assert await revoke(store, reader)
    with pytest.raises(Unauthorized, match="revoked"):
        await redeem(store, AuthConfig(), kept.ticket, room)
    dev = await mint_ticket(store, Principal("dev", None, frozenset({"ops:read"}), None), room)
    with pytest.raises(Unauthorized, match="dev-mode stream ticket"):
        await redeem(store, AuthConfig(), dev.ticket, room)
