"""The authorization matrix: token kind x room x operation, each refused with the right
status and envelope, and the store unchanged after every single request.

Token kinds: missing, malformed (scheme, token), unknown, wrong secret, expired, revoked,
a token in the query string (alone and beside a valid header), a token lacking the
operation's scope, a token for another room; plus acting as another agent, writing
another role's partition or an unpartitioned document, and using another agent's lock
grant. Rooms: the token's own room, another existing room, an absent room. A room the
token may not enter must answer exactly as an absent room does.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import pytest

from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.server import SCOPES, revoke
from agentrooms.store import Store
from tests.server.support import bearer, client, digest, error_of, make_app, token


@dataclass(frozen=True)
class Op:
    name: str
    method: str
    path: str  # "{room}" is filled in; "" room means the route names no room
    scope: str
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    agent_in: str | None = None  # "body" or "path": where the op names the acting agent


@dataclass(frozen=True)
class Kind:
    name: str
    headers: dict[str, str]
    params: dict[str, str] = field(default_factory=dict)
    expect: str = "401"  # "401", or "scope": 403 in the own room, 404 elsewhere


@dataclass
class World:
    alpha: str
    beta: str
    ghost: str
    fence: int
    lock_token: str
    lock_fence: int
    reservation: str = ""


async def seed(store: Store) -> World:
    tag = uuid.uuid4().hex[:8]
    alpha, beta, ghost = f"alpha-{tag}", f"beta-{tag}", f"ghost-{tag}"
    rooms = Rooms(store)
    fence, lock_token, lock_fence, reservation = 0, "", 0, ""
    for name in (alpha, beta):
        room = await rooms.create(name)
        await room.plan.add([TaskSpec("t1"), TaskSpec("t2")])
        lease = await room.plan.claim("t2", "alice")
        await room.docs.put("writer/d1", {"v": 1})
        await room.docs.put("shared", {"v": 1})
        lock = await room.locks.try_acquire("L", "alice", ttl=600)
        await room.events.post("note", {"n": 1})
        await room.presence.heartbeat("alice", ttl=600)
        reserved = await room.paths.reserve(["src/**"], "alice", ttl=600)
        if name == alpha:
            fence, lock_token, lock_fence = lease.fence, lock.token, lock.fence
            reservation = reserved.id
    return World(alpha, beta, ghost, fence, lock_token, lock_fence, reservation)


def operations(w: World) -> list[Op]:
    lease = {"task_id": "t2", "agent": "alice", "fence": w.fence}
    grant = {"token": w.lock_token, "fence": w.lock_fence}
    r = "/v1/rooms/{room}"
    return [
        Op("list rooms", "GET", "/v1/rooms", "rooms:read"),
        Op("create room", "POST", "/v1/rooms", "rooms:write", {"name": "{room}"}),
        Op("describe room", "GET", r, "rooms:read"),
        Op("archive room", "POST", f"{r}/archive", "rooms:write"),
        Op("delete room", "DELETE", r, "rooms:write"),
        Op("list tasks", "GET", f"{r}/tasks", "plan:read"),
        Op("get task", "GET", f"{r}/tasks/t1", "plan:read"),
        Op("add tasks", "POST", f"{r}/tasks", "plan:write", {"tasks": [{"id": "t9"}]}),
        Op("cancel", "POST", f"{r}/tasks/t1/cancel", "plan:write", {}),
        Op(
            "claim-next",
            "POST",
            f"{r}/tasks/claim-next",
            "lease:acquire",
            {"agent": "alice"},
            agent_in="body",
        ),
        Op(
            "claim",
            "POST",
            f"{r}/tasks/t1/claim",
            "lease:acquire",
            {"agent": "alice"},
            agent_in="body",
        ),
        Op("renew", "POST", f"{r}/tasks/t2/renew", "lease:acquire", lease, agent_in="body"),
        Op(
            "complete",
            "POST",
            f"{r}/tasks/t2/complete",
            "lease:acquire",
            {**lease, "result": 1},
            agent_in="body",
        ),
        Op("fail", "POST", f"{r}/tasks/t2/fail", "lease:acquire", lease, agent_in="body"),
        Op("list docs", "GET", f"{r}/docs", "docs:read"),
        Op("get doc", "GET", f"{r}/docs/writer/d1", "docs:read"),
        Op(
            "put own doc",
            "PUT",
            f"{r}/docs/writer/d1",
            "docs:write",
            {"value": 2},
            {"If-Match": '"1"'},
        ),
        Op(
            "create own doc",
            "PUT",
            f"{r}/docs/writer/new",
            "docs:write",
            {"value": 2},
            {"If-None-Match": "*"},
        ),
        Op(
            "delete own doc",
            "DELETE",
            f"{r}/docs/writer/d1",
            "docs:write",
            None,
            {"If-Match": '"1"'},
        ),
        Op("post event", "POST", f"{r}/events", "events:write", {"type": "note"}),
        Op("read events", "GET", f"{r}/events", "events:read"),
        Op("read-new", "POST", f"{r}/events/read-new", "events:read"),
        Op("ack", "POST", f"{r}/events/ack", "events:read", {"seq": 1}),
        Op("cursor", "GET", f"{r}/events/cursor", "events:read"),
        Op(
            "stream",
            "GET",
            f"{r}/events/stream",
            "events:read",
            params={"max_events": 1, "timeout": 0.05},
        ),
        Op("presence", "GET", f"{r}/presence", "rooms:read"),
        Op("heartbeat", "PUT", f"{r}/presence/alice", "presence:write", {}, agent_in="path"),
        Op("leave", "DELETE", f"{r}/presence/alice", "presence:write", agent_in="path"),
        Op("lock holder", "GET", f"{r}/locks/L", "rooms:read"),
        Op(
            "acquire",
            "POST",
            f"{r}/locks/L/acquire",
            "locks:write",
            {"agent": "alice"},
            agent_in="body",
        ),
        Op("release", "POST", f"{r}/locks/L/release", "locks:write", grant),
        Op("extend", "POST", f"{r}/locks/L/extend", "locks:write", grant),
        Op("requeue", "POST", f"{r}/locks/L/requeue", "locks:write", grant),
        Op("list paths", "GET", f"{r}/paths", "rooms:read"),
        Op("check paths", "POST", f"{r}/paths/check", "rooms:read", {"paths": ["src/a"]}),
        Op(
            "reserve paths",
            "POST",
            f"{r}/paths/reserve",
            "locks:write",
            {"paths": ["docs/*"], "agent": "alice"},
            agent_in="body",
        ),
        Op("renew paths", "POST", f"{r}/paths/{w.reservation}/renew", "locks:write", {}),
        Op("release paths", "POST", f"{r}/paths/{w.reservation}/release", "locks:write"),
    ]


def _fill(value: Any, room: str) -> Any:
    if isinstance(value, str):
        return value.replace("{room}", room)
    if isinstance(value, dict):
        return {k: _fill(v, room) for k, v in value.items()}
    return value


async def send(c: httpx.AsyncClient, op: Op, room: str, kind: Kind) -> httpx.Response:
    kwargs: dict[str, Any] = {
        "headers": {**op.headers, **kind.headers},
        "params": {**op.params, **kind.params},
    }
    if op.body is not None:
        kwargs["json"] = _fill(op.body, room)
    return await c.request(op.method, _fill(op.path, room), **kwargs)


def absent_body(store: Store, room: str) -> dict[str, Any]:
    """What the library answers for a room that does not exist."""
    message = str(Rooms(store).room(room).scope.missing())
    return {"error": {"type": "not_found", "message": message, "details": {}}}


@dataclass(frozen=True)
class Case:
    where: str  # own, other or absent room
    op: Op
    room: str
    kind: Kind
    status: int
    type: str

    @property
    def label(self) -> str:
        return f"{self.kind.name} x {self.where} room x {self.op.name}"


ALL_BUT_ADMIN = sorted(SCOPES - {"admin"})


def _room_bound(op: Op) -> bool:
    return "{room}" in op.path or op.body == {"name": "{room}"}


async def auth_failures(store: Store, w: World, full: str) -> list[Kind]:
    """Requests that never get past authentication."""
    expired = await token(store, "alice", [w.alpha], ["admin"], ttl=0.05)
    revoked = await token(store, "alice", [w.alpha], ["admin"])
    assert await revoke(store, revoked)
    await asyncio.sleep(0.2)
    token_id = full.split("_")[1]
    return [
        Kind("missing", {}),
        Kind("basic scheme", {"Authorization": "Basic YWxpY2U6c2VjcmV0"}),
        Kind("malformed", bearer("not-a-token")),
        Kind("unknown id", bearer(f"ar_{uuid.uuid4().hex[:16]}_{'0' * 64}")),
        Kind("wrong secret", bearer(f"ar_{token_id}_{'f' * 64}")),
        Kind("expired", bearer(expired)),
        Kind("revoked", bearer(revoked)),
        Kind("query token only", {}, {"access_token": full}),
        Kind("query token beside header", bearer(full), {"token": full}),
    ]


async def room_and_scope_cases(store: Store, w: World, ops: list[Op], full: str) -> list[Case]:
    """Valid tokens outside their rooms (404, as if absent) or scopes (403)."""
    rooms = {"own": w.alpha, "other": w.beta, "absent": w.ghost}
    other_room = Kind(
        "token for another room", bearer(await token(store, "alice", [w.beta], ["admin"]))
    )
    cases = []
    for op in ops:
        lacking = sorted(SCOPES - {op.scope, "admin"})
        kind = Kind(f"lacks {op.scope}", bearer(await token(store, "alice", [w.alpha], lacking)))
        for where, room in rooms.items():
            if _room_bound(op) or where == "own":
                denied = (403, "forbidden") if where == "own" else (404, "not_found")
                cases.append(Case(where, op, room, kind, *denied))
        if _room_bound(op):
            for where in ("other", "absent"):
                kind = Kind("full token, room not in it", bearer(full))
                cases.append(Case(where, op, rooms[where], kind, 404, "not_found"))
            cases.append(Case("own", op, w.alpha, other_room, 404, "not_found"))
    return cases


async def agent_and_partition_cases(store: Store, w: World, ops: list[Op], full: str) -> list[Case]:
    """Valid tokens acting as another agent or writing outside their partition (403)."""
    cases = []
    for op in ops:
        if op.agent_in is not None:
            mallory = replace(
                op,
                body={**op.body, "agent": "mallory"} if op.agent_in == "body" else op.body,
                path=op.path.replace("/alice", "/mallory"),
            )
            kind = Kind("acts as another agent", bearer(full))
            cases.append(Case("own", mallory, w.alpha, kind, 403, "forbidden"))
    r = "/v1/rooms/{room}/docs"
    star, one = {"If-None-Match": "*"}, {"If-Match": '"1"'}
    partition_ops = [
        Op("put other partition", "PUT", f"{r}/reader/x", "docs:write", {"value": 1}, star),
        Op("put unpartitioned", "PUT", f"{r}/shared", "docs:write", {"value": 2}, one),
        Op("delete unpartitioned", "DELETE", f"{r}/shared", "docs:write", None, one),
    ]
    roleless = await token(store, "carol", [w.alpha], ALL_BUT_ADMIN)
    for op in partition_ops:
        for name, tok in (("role writer", full), ("no role", roleless)):
            kind = Kind(f"writes outside its partition ({name})", bearer(tok))
            cases.append(Case("own", op, w.alpha, kind, 403, "forbidden"))
    grant = {"token": w.lock_token, "fence": w.lock_fence}
    bob = Kind(
        "bob holds alice's grant token", bearer(await token(store, "bob", [w.alpha], ALL_BUT_ADMIN))
    )
    for verb in ("release", "extend", "requeue"):
        path = f"/v1/rooms/{{room}}/locks/L/{verb}"
        op = Op(f"{verb} another's grant", "POST", path, "locks:write", grant)
        cases.append(Case("own", op, w.alpha, bob, 403, "forbidden"))
    return cases


async def check(c: httpx.AsyncClient, store: Store, case: Case) -> str | None:
    """What is wrong with the answer to ``case``, if anything."""
    response = await send(c, case.op, case.room, case.kind)
    if response.status_code != case.status:
        return f"{case.label}: {response.status_code} {response.text[:200]}"
    error = error_of(response)
    if error["type"] != case.type:
        return f"{case.label}: type {error['type']}"
    if case.status == 404 and response.json() != absent_body(store, case.room):
        return f"{case.label}: 404 body differs from an absent room's: {response.text}"
    if case.status == 401 and "WWW-Authenticate" not in response.headers:
        return f"{case.label}: 401 without WWW-Authenticate"
    return None


async def test_authorization_matrix(store: Store, request: pytest.FixtureRequest) -> None:
    w = await seed(store)
    full = await token(store, "alice", [w.alpha], ALL_BUT_ADMIN, role="writer")
    star = await token(store, "root", "*", ["admin"])
    ops = operations(w)
    rooms = {"own": w.alpha, "other": w.beta, "absent": w.ghost}
    cases = [
        Case(where, op, room, kind, 401, "unauthorized")
        for kind in await auth_failures(store, w, full)
        for op in ops
        for where, room in rooms.items()
        if _room_bound(op) or where == "own"
    ]
    cases += await room_and_scope_cases(store, w, ops, full)
    cases += await agent_and_partition_cases(store, w, ops, full)
    failures: list[str] = []
    async with client(make_app(store)) as c:
        # the baseline: what a room that truly does not exist answers
        absent = await c.get(f"/v1/rooms/{w.ghost}/tasks", headers=bearer(star))
        assert absent.status_code == 404 and absent.json() == absent_body(store, w.ghost)
        before = await digest(store, [w.alpha, w.beta, w.ghost], registered=False)
        for case in cases:
            problem = await check(c, store, case)
            if problem is not None:
                failures.append(problem)
            if await digest(store, [w.alpha, w.beta, w.ghost], registered=False) != before:
                failures.append(f"{case.label}: the store changed")
                before = await digest(store, [w.alpha, w.beta, w.ghost], registered=False)
        for op in ops:  # controls: the same token reads its own room
            if op.method == "GET":
                response = await send(c, op, w.alpha, Kind("full", bearer(full)))
                if response.status_code != 200:
                    failures.append(f"control {op.name}: {response.status_code} {response.text}")
    summary = f"authorization matrix: {len(cases)} cases, {len(failures)} failures"
    print(summary)
    request.node.user_properties.append(("authz_matrix_cases", len(cases)))
    assert not failures, "\n".join([summary, *failures[:50]])
    assert len(cases) > 1000
