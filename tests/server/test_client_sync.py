"""The client's blocking facade: every public coroutine of the async client has its
blocking twin (so the two cannot drift), and the twins work against a real server; and
every library error survives the trip through the server's envelope."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
import time
import uuid

import pytest

from agentrooms.client import Client, SyncClient
from agentrooms.client import rooms as remote
from agentrooms.client import sync as blocking
from agentrooms.client.http import RemoteRequestError, error_from
from agentrooms.errors import (
    AgentroomsError,
    LockHeld,
    RequestError,
    StaleFence,
    StoreUnavailable,
    VersionConflict,
)
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.server import AuthConfig, HttpLimits, create_app, mint
from agentrooms.store import Store
from tests.mcp.support import serving

PAIRS = [
    (remote.Rooms, blocking.SyncRooms),
    (remote.Room, blocking.SyncRoom),
    (remote.Plan, blocking.SyncPlan),
    (remote.Documents, blocking.SyncDocuments),
    (remote.Events, blocking.SyncEvents),
    (remote.Presence, blocking.SyncPresence),
    (remote.Locks, blocking.SyncLocks),
]


def _public_async(kind: type) -> set[str]:
    names = set()
    for name, member in vars(kind).items():
        if name.startswith("_"):
            continue
        fn = getattr(member, "__wrapped__", member)  # an asynccontextmanager's function
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            names.add(name)
    return names


@pytest.mark.parametrize(("async_kind", "sync_kind"), PAIRS)
def test_every_coroutine_has_a_blocking_twin(async_kind: type, sync_kind: type) -> None:
    missing = {n for n in _public_async(async_kind) if not callable(getattr(sync_kind, n, None))}
    assert not missing, f"{sync_kind.__name__} lacks {sorted(missing)}"


def test_the_client_needs_no_server_stack() -> None:
    """The client imports neither FastAPI nor uvicorn nor the MCP SDK (its extra is
    httpx only)."""
    code = (
        "import sys, agentrooms.client; "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'mcp', 'starlette') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_blocking_client_over_a_server(store: Store) -> None:
    name = f"s-{uuid.uuid4().hex[:10]}"
    await Rooms(store).create(name)
    alice = (await mint(store, "alice", rooms=[name], scopes=["admin"])).token
    bob = (await mint(store, "bob", rooms=[name], scopes=["admin"])).token
    app = create_app(store, auth=AuthConfig(), limits=HttpLimits(rate=None))
    async with serving(app) as base:

        def work() -> None:
            with SyncClient(base, alice, agent="alice") as a, SyncClient(base, bob) as b:
                room, other = a.room(name), b.room(name)
                assert room.plan.add([TaskSpec("t")]) == ["t"]
                lease = room.plan.claim_next(ttl=0.6)
                assert lease is not None
                with room.plan.keep_alive(lease, every=0.1) as keeper:
                    time.sleep(1.0)  # longer than the ttl: only renewals keep it
                assert room.plan.complete(keeper.lease, "ok").status == "done"
                doc = room.docs.put("d", 1, create_only=True)
                with pytest.raises(VersionConflict):
                    other.docs.put("d", 2, create_only=True)
                assert other.docs.put("d", 2, if_match=doc.version).value == 2
                with room.locks.hold("l") as held:
                    with pytest.raises(LockHeld):
                        other.locks.try_acquire("l")
                    assert held.owner == "alice"
                seq = room.events.post("hello", {"x": 1})
                seen = []
                for event in other.events.subscribe(wait=2):
                    seen.append(event.seq)
                    if event.seq == seq:
                        break
                assert seen[-1] == seq and other.events.cursor() == seq
                assert [m.agent for m in [room.presence.heartbeat("alice")]] == ["alice"]
                assert [r.name for r in a.rooms.list()] == [name]
                room.plan.add([TaskSpec("u")])  # a lease lost: the block ends in StaleFence
                lost = room.plan.claim("u", ttl=30)
                other.plan.cancel("u")
                with pytest.raises(StaleFence), room.plan.keep_alive(lost, every=0.05) as kept:
                    time.sleep(0.5)
                assert kept.lost is not None

        await asyncio.to_thread(work)


def _instances() -> list[AgentroomsError]:
    from agentrooms import errors as e

    return [
        e.VersionConflict({"doc/a": 3, "doc/b": None}),
        e.StaleFence("task/t", 1, 2),
        e.InvalidTransition("not ready"),
        e.ContentionExhausted(5, 0.25, ["doc/a"]),
        e.IdempotencyMismatch("other payload"),
        e.LeaseHeld("t", "bob"),
        e.LockHeld("merge", "alice"),
        e.RateLimited(0.5),
        e.StoreUnavailable("down"),
        e.ClockSkew("clock off", 3.0, 1.0),
        e.CursorCompacted("r", 4, 10),
        e.BadRequest("bad"),
        e.PayloadTooLarge("big"),
        e.NotFound("none"),
        e.Unauthorized("who"),
        e.Forbidden("no"),
    ]


@pytest.mark.parametrize("exc", _instances(), ids=lambda e: type(e).__name__)
def test_every_error_comes_back_as_itself(exc: AgentroomsError) -> None:
    """The server's envelope of each library error, read by the client, is that error:
    its class, message and details."""
    from agentrooms.server.envelope import error_response

    response = error_response(exc)
    back = error_from(response.status_code, json.loads(bytes(response.body)), "r")
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert back.details() == exc.details()


def test_a_code_the_library_lacks_is_a_remote_error() -> None:
    back = error_from(428, {"error": {"type": "precondition_required", "message": "m"}})
    assert isinstance(back, RemoteRequestError) and isinstance(back, RequestError)
    assert (back.remote_code, back.status, str(back)) == ("precondition_required", 428, "m")
    assert isinstance(error_from(502, "<html>"), StoreUnavailable)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_rate_limited_call_is_waited_out_and_sent_again(store: Store) -> None:
    """A ``429`` did nothing: the client waits its ``retry_after`` and sends the call
    again, so a burst past the bucket still completes, each post once."""
    name = f"s-{uuid.uuid4().hex[:10]}"
    await Rooms(store).create(name)
    token = (await mint(store, "alice", rooms=[name], scopes=["admin"])).token
    app = create_app(store, auth=AuthConfig(), limits=HttpLimits(rate=20.0, burst=2))
    async with serving(app) as base, Client(base, token, retries=8) as client:
        room = client.room(name)
        before = _rate_limited()
        seqs = [await room.events.post("tick", i) for i in range(8)]
        assert _rate_limited() > before  # the bucket did refuse some
        assert len(set(seqs)) == 8
        assert [e.data for e in await Rooms(store).room(name).events.read(seqs[0] - 1)] == list(
            range(8)
        )


def _rate_limited() -> float:
    from prometheus_client import REGISTRY

    count = REGISTRY.get_sample_value("agentrooms_http_errors_total", {"type": "rate_limited"})
    return count or 0.0
