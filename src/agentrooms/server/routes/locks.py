"""Named locks: acquire (now, or queued for up to ``wait`` seconds), release, extend,
requeue (release and queue again in one write, for an agent taking turns), and who
holds one.

A grant's random ``token`` is its proof: release and extend take it back with the
``fence``. The holder record is checked before extending (the library's ``extend``
compares only the fence, which a caller could overstate), and the extend itself is then
conditional on exactly that fence, so a grant that changes hands in between is refused.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Request

from agentrooms.errors import StaleFence
from agentrooms.rooms import Lock
from agentrooms.rooms import keys as room_keys
from agentrooms.rooms.locks import DEFAULT_TTL
from agentrooms.server.deps import (
    IdempotencyKey,
    LocksWrite,
    RoomsRead,
    act_as,
    command_id,
    held_grant,
    limits_of,
)
from agentrooms.server.models import (
    NAME_PATTERN,
    AcquireIn,
    ExtendIn,
    HolderOut,
    LockOut,
    LockRef,
    LockState,
    Released,
    RequeueIn,
    WaiterOut,
)
from agentrooms.server.routes import COMMON, errors

router = APIRouter(prefix="/rooms/{room}/locks", tags=["locks"], responses=errors(*COMMON))

LockName = Annotated[str, Path(pattern=NAME_PATTERN, min_length=1, max_length=128)]


def _out(lock: Lock) -> LockOut:
    return LockOut(
        room=lock.room,
        name=lock.name,
        owner=lock.owner,
        token=lock.token,
        fence=lock.fence,
        expires_at=lock.expires_at,
        ttl=lock.ttl,
        granted_at=lock.granted_at,
        renewed_at=lock.renewed_at,
    )


@router.get("/{name}", summary="Who holds the lock, since when, and who waits in line")
async def holder(access: RoomsRead, name: LockName) -> LockState:
    info = await access.room.locks.holder(name)
    line = await access.room.locks.waiters(name)
    return LockState(
        name=name,
        holder=None if info is None else HolderOut.of(info),
        waiters=[WaiterOut.of(w) for w in line],
    )


@router.post(
    "/{name}/acquire",
    summary="Take the lock, or queue for it up to `wait`",
    responses=errors(409, 422),
)
async def acquire(
    request: Request,
    access: LocksWrite,
    name: LockName,
    body: Annotated[AcquireIn | None, Body()] = None,
    key: IdempotencyKey = None,
) -> LockOut:
    body = body or AcquireIn()
    agent = act_as(access.principal, body.agent)
    wait = min(body.wait, limits_of(request).max_lock_wait)
    locks, cmd = access.room.locks, command_id(access.principal, key)
    if wait > 0:
        return _out(
            await locks.wait_acquire(name, agent, ttl=body.ttl, timeout=wait, command_id=cmd)
        )
    return _out(await locks.try_acquire(name, agent, ttl=body.ttl, command_id=cmd))


@router.post("/{name}/release", summary="Release a grant (hand it to the next waiter)")
async def release(access: LocksWrite, name: LockName, body: LockRef) -> Released:
    """``released: false`` when the grant had expired or changed hands."""
    record = await held_grant(access.room, name, access.agent, body.token)
    if record is None:
        return Released(released=False)
    # the grant the token names (a release compares its fencing token, not the body's)
    fence = record.value["fence"]
    lock = Lock(access.room.name, name, access.agent, body.token, fence, 0.0, 0.0)
    return Released(released=await access.room.locks.release(lock))


@router.post("/{name}/extend", summary="Extend a grant still held", responses=errors(409))
async def extend(access: LocksWrite, name: LockName, body: ExtendIn) -> LockOut:
    record = await held_grant(access.room, name, access.agent, body.token)
    current = None if record is None else record.value.get("fence")
    if record is None or current != body.fence:
        raise StaleFence(room_keys.lock(name), body.fence, current)
    lock = Lock(
        access.room.name, name, access.agent, body.token, body.fence, 0.0, record.value["ttl"]
    )
    return _out(await access.room.locks.extend(lock, body.ttl))


@router.post(
    "/{name}/requeue",
    summary="Pass a grant on and queue for the lock again, in one write",
    responses=errors(409),
)
async def requeue(request: Request, access: LocksWrite, name: LockName, body: RequeueIn) -> LockOut:
    """For an agent that takes the lock turn after turn: the grant goes to the next agent
    in line, and this agent goes to the back of the line, in one write (or, with nobody
    waiting, takes the lock again at once). Answers with the next grant (same ttl) once
    it comes, within ``wait`` seconds, else ``409`` (lock_held). A grant that had expired
    or changed hands queues as ``acquire`` with ``wait`` would (ttl 30 s)."""
    wait = min(body.wait, limits_of(request).max_lock_wait)
    locks = access.room.locks
    record = await held_grant(access.room, name, access.agent, body.token)
    if record is None:
        return _out(await locks.wait_acquire(name, access.agent, ttl=DEFAULT_TTL, timeout=wait))
    value = record.value
    lock = Lock(access.room.name, name, access.agent, body.token, value["fence"], 0.0, value["ttl"])
    return _out(await locks.requeue(lock, timeout=wait))
