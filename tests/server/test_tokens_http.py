"""``/v1/tokens`` and ``/v1/server`` on every backend, through the client's
:class:`~agentrooms.client.tokens.Tokens`: dev mode administers tokens; a page of tokens
leads to the next; a minted ``tokens:admin`` token administers within its reach; the
reach rules themselves (:func:`~agentrooms.server.token_admin.exceeds`)."""

from __future__ import annotations

import httpx
import pytest

from agentrooms.client import Client
from agentrooms.client.tokens import Tokens, server_info
from agentrooms.errors import BadRequest, Forbidden
from agentrooms.server.auth import Principal
from agentrooms.server.token_admin import exceeds
from agentrooms.store import Store
from tests.server.support import BASE, make_app, token


def _client(store: Store, secret: str | None, *, dev: bool = False) -> Client:
    transport = httpx.ASGITransport(app=make_app(store, dev=dev))
    return Client(BASE, secret, transport=transport, retries=0)


async def test_dev_mode_administers_tokens_and_pages_them(store: Store) -> None:
    async with _client(store, None, dev=True) as dev:
        tokens = Tokens(dev)
        made = [
            await tokens.mint(f"w{i}", rooms=["r"], scopes=["plan:read"], ttl=60) for i in range(3)
        ]
        boss = await tokens.mint("boss", rooms="*", scopes=["admin", "tokens:admin"])
        seen, after = [], None
        while True:
            page, after, now = await tokens.page(1, after)
            seen += [t.id for t in page]
            if after is None:
                break
        assert len(seen) == len(set(seen)) >= 4  # each token once, one per page
        assert {m.info.id for m in made} | {boss.info.id} <= set(seen)
        assert made[0].info.expires_at - now <= 60
        assert (await server_info(dev))["token"] is None
        with pytest.raises(BadRequest):
            await tokens.mint("w", rooms=["r"], scopes=["no:such"])
    async with _client(store, boss.token) as client:
        info = await server_info(client)
        assert info["token"]["id"] == boss.info.id and info["scopes"] == ["admin", "tokens:admin"]
        assert await Tokens(client).revoke(made[0].token)  # a whole token: only its id is sent
        assert not await Tokens(client).revoke(made[0].info.id)
        listed, _ = await Tokens(client).list()
        assert [t.revoked_at is not None for t in listed if t.id == made[0].info.id] == [True]


async def test_a_room_limited_administrator_sees_only_its_reach(store: Store) -> None:
    mine = await token(store, "op", ["a", "b"], ["tokens:admin", "plan:read"], ttl=600)
    other = await token(store, "x", ["c"], ["plan:read"])
    async with _client(store, mine) as client:
        tokens = Tokens(client)
        inside = await tokens.mint("w", rooms=["a"], scopes=["plan:read"], ttl=60)
        listed, _ = await tokens.list()
        assert {t.agent for t in listed} == {"op", "w"}
        assert not await tokens.revoke(other)
        with pytest.raises(Forbidden, match=r"rooms \['c'\]"):
            await tokens.mint("w", rooms=["c"], scopes=["plan:read"])
    async with _client(store, inside.token) as client:
        with pytest.raises(Forbidden, match="tokens:admin"):
            await Tokens(client).list()
    async with _client(store, mine) as client:
        assert await Tokens(client).revoke(inside.info.id)


def _principal(**given: object) -> Principal:
    fields: dict[str, object] = {
        "agent": "op",
        "rooms": frozenset({"a"}),
        "scopes": frozenset({"tokens:admin", "docs:write"}),
        "role": "ops",
        "expires_at": 100.0,
    }
    return Principal(**{**fields, **given})  # type: ignore[arg-type]


def test_reach_rules() -> None:
    op = _principal()
    assert exceeds(op, ["a"], ["docs:write", "tokens:admin"], "ops", 100.0) == []
    assert exceeds(op, ["a"], ["tokens:admin"], "legal", 100.0) == []  # a role it cannot write
    assert exceeds(op, ["a"], ["docs:write"], "legal") == [
        "role 'legal' (this token writes only its own partition 'ops')"
    ]
    assert exceeds(op, "*", ["admin"], None, 101.0) == [
        "rooms '*' (this token enters only its own rooms)",
        "scopes ['admin']",
        "an expiry after this token's own",
    ]
    admin = _principal(rooms=None, scopes=frozenset({"admin"}), role=None, expires_at=None)
    assert exceeds(admin, "*", ["docs:write", "ops:read"], "any", 1e12) == []
    assert exceeds(admin, "*", ["tokens:admin"], None) == ["scopes ['tokens:admin']"]
    assert not admin.has("tokens:admin") and admin.has("ops:read")
