"""Helpers for the HTTP tests: an app and client over a test store, tokens, and a digest
of everything the store holds (to prove a refused request changed nothing)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

from agentrooms.errors import CursorCompacted
from agentrooms.rooms import keys, registry
from agentrooms.server import AuthConfig, HttpLimits, create_app, mint
from agentrooms.server.auth import AUTH_ROOM, TOKEN_ROOMS
from agentrooms.store import Store
from agentrooms.store.types import Event, Prepared, ScanPage, Snapshot, TransactResult
from tests.helpers import Interposed

BASE = "http://agentrooms.test"
AUTH_ROOMS = frozenset({AUTH_ROOM, *TOKEN_ROOMS})


def make_app(store: Store, *, dev: bool = False, limits: HttpLimits | None = None) -> FastAPI:
    return create_app(store, auth=AuthConfig(dev=dev), limits=limits or HttpLimits(rate=None))


@asynccontextmanager
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as c:
        yield c


async def token(
    store: Store,
    agent: str,
    rooms: Iterable[str] | str = "*",
    scopes: Iterable[str] = ("admin",),
    role: str | None = None,
    ttl: float = 3600.0,
) -> str:
    return (await mint(store, agent, rooms=rooms, scopes=scopes, role=role, ttl=ttl)).token


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


async def _all_records(store: Store, room: str) -> list[list[Any]]:
    out: list[list[Any]] = []
    after: str | None = None
    while True:
        page = await store.scan(room, "", after, 1000)
        out += [[r.key, r.value, r.version, r.expires_at] for r in page.records]
        if page.next_after is None:
            return out
        after = page.next_after


async def _log(store: Store, room: str) -> list[Any]:
    out: list[Any] = []
    after = 0
    try:
        while events := await store.read_log(room, after, 1000):
            out += [[e.seq, e.type, e.data, e.time] for e in events]
            after = events[-1].seq
    except CursorCompacted as exc:
        out.append(["compacted", exc.first_available])
    return out


async def state(
    store: Store, rooms: Iterable[str] = (), *, registered: bool = False
) -> dict[str, Any]:
    """Every record, the log, the last sequence number and the plan's sets of the
    registry's shards, the token rooms, ``rooms`` and (with ``registered``) every registered room,
    by room, with the store clock (``now``) after they were read. On a store shared with
    other tests (Redis, PostgreSQL) pass ``registered=False`` and name the test's own
    rooms: other tests' records expire on their own clock."""
    names = {*registry.SHARD_ROOMS, AUTH_ROOM, *TOKEN_ROOMS, *rooms}
    if registered:
        for shard in registry.SHARD_ROOMS:
            names |= {r[1]["name"] for r in await _all_records(store, shard)}
    parts = {
        room: {
            "records": await _all_records(store, room),
            "log": await _log(store, room),
            "last_seq": await store.last_seq(room),
            "sets": [await store.set_size(room, s) for s in (keys.READY, keys.LEASED)],
        }
        for room in sorted(names)
    }
    return {"rooms": parts, "now": (await store.read(keys.REGISTRY, [])).now}


async def digest(store: Store, rooms: Iterable[str] = (), *, registered: bool = False) -> str:
    """SHA-256 over :func:`state` but its clock."""
    rooms_state = (await state(store, rooms, registered=registered))["rooms"]
    h = hashlib.sha256()
    for room, part in rooms_state.items():
        h.update(json.dumps({"room": room, **part}, sort_keys=True).encode())
    return h.hexdigest()


def changed(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether the store changed between two :func:`state` readings other than by
    records expiring: a record gone whose expiry had passed by the second reading."""
    for room, part in before["rooms"].items():
        now = after["rooms"][room]
        lasting = [
            r for r in part["records"] if r in now["records"] or r[3] is None or r[3] > after["now"]
        ]
        if {**part, "records": lasting} != now:
            return True
    return False


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The envelope's ``error`` member, asserting the envelope's shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"type", "message", "details"}, error
    assert isinstance(error["type"], str) and isinstance(error["message"], str)
    assert isinstance(error["details"], dict)
    return error


class Recording(Interposed):
    """A real store underneath that records the room of every operation sent to it."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.log: list[tuple[str, str]] = []

    def touched(self) -> list[tuple[str, str]]:
        """Operations on anything but the token rooms."""
        return [(op, room) for op, room in self.log if room not in AUTH_ROOMS]

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        self.log.append(("read", room))
        return await super()._read(room, keys)

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        self.log.append(("transact", room))
        return await super()._transact(room, ops)

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        self.log.append(("scan", room))
        return await super()._scan(room, prefix, after, limit)

    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]:
        self.log.append(("read_log", room))
        return await super()._read_log(room, after, limit)
