"""The plan: add and read tasks; claim, renew, complete and fail them under leases.

A lease travels as the body a claim returned (``task_id``, ``agent``, ``fence``, ...);
its holder sends it back to renew, complete or fail. The acting agent is always the
token's: a lease body naming another agent is ``403``, and a holder whose fence is no
longer current gets ``409 stale_fence`` and its result is not recorded.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Path, Query, Request, Response

from agentrooms.errors import BadRequest
from agentrooms.rooms import Lease, TaskSpec
from agentrooms.rooms.plan import DEFAULT_LEASE
from agentrooms.server.conditional import etag
from agentrooms.server.deps import (
    Access,
    IdempotencyKey,
    LeaseAcquire,
    PlanRead,
    PlanWrite,
    act_as,
    command_id,
    limits_of,
)
from agentrooms.server.models import (
    NAME_PATTERN,
    CancelIn,
    ClaimIn,
    ClaimNextOut,
    CompleteIn,
    FailIn,
    LeaseIn,
    LeaseOut,
    TaskList,
    TaskOut,
    TasksAdd,
    TasksAdded,
)
from agentrooms.server.routes import COMMON, ETAG, errors

router = APIRouter(prefix="/rooms/{room}/tasks", tags=["tasks"], responses=errors(*COMMON))

TaskPath = Annotated[str, Path(pattern=NAME_PATTERN, min_length=1, max_length=128)]
Status = Literal["pending", "ready", "claimed", "done", "failed", "cancelled"]
COMMAND = errors(409, 422)


@router.get("", summary="Every task, in id order")
async def list_tasks(
    access: PlanRead,
    status: Status | None = None,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    after: Annotated[str | None, Query(max_length=128)] = None,
) -> TaskList:
    """Every task in id order; with ``limit`` (or ``after``), one page of them and the
    next page's ``after`` in ``next_after``."""
    if limit is None and after is None:
        tasks = await access.room.plan.tasks(status)
        return TaskList(tasks=[TaskOut.of(t) for t in tasks])
    page = await access.room.plan.page(100 if limit is None else limit, after, status)
    return TaskList(tasks=[TaskOut.of(t) for t in page.tasks], next_after=page.next_after)


@router.post("", status_code=201, summary="Add tasks atomically", responses=COMMAND)
async def add_tasks(
    request: Request, access: PlanWrite, body: TasksAdd, key: IdempotencyKey = None
) -> TasksAdded:
    limit = limits_of(request).max_batch
    if len(body.tasks) > limit:
        raise BadRequest(f"add at most {limit} tasks in one request")
    specs = [TaskSpec(t.id, t.title, t.payload, tuple(t.deps), t.max_attempts) for t in body.tasks]
    ready = await access.room.plan.add(
        specs, command_id=command_id(access.principal, key), author=access.agent
    )
    return TasksAdded(ready=ready)


@router.post("/claim-next", summary="Claim a ready task, if any", responses=COMMAND)
async def claim_next(
    request: Request,
    access: LeaseAcquire,
    body: Annotated[ClaimIn | None, Body()] = None,
    key: IdempotencyKey = None,
) -> ClaimNextOut:
    body = body or ClaimIn()
    agent = act_as(access.principal, body.agent)
    cmd = command_id(access.principal, key)
    plan = access.room.plan
    wait = min(body.wait, limits_of(request).max_wait)
    lease = await plan.claim_next(agent, ttl=body.ttl, command_id=cmd, wait=wait)
    if lease is None:
        return ClaimNextOut(lease=None, finished=await plan.finished())
    return ClaimNextOut(lease=LeaseOut.of(lease))


@router.get("/{task}", summary="One task", responses={200: {"headers": ETAG}})
async def get_task(access: PlanRead, task: TaskPath, response: Response) -> TaskOut:
    found = await access.room.plan.get(task)
    response.headers["ETag"] = etag(found.version)
    return TaskOut.of(found)


@router.post("/{task}/claim", summary="Claim one named task", responses=COMMAND)
async def claim(
    request: Request,
    access: LeaseAcquire,
    task: TaskPath,
    body: Annotated[ClaimIn | None, Body()] = None,
    key: IdempotencyKey = None,
) -> LeaseOut:
    body = body or ClaimIn()
    agent = act_as(access.principal, body.agent)
    cmd = command_id(access.principal, key)
    wait = min(body.wait, limits_of(request).max_wait)
    lease = await access.room.plan.claim(task, agent, ttl=body.ttl, command_id=cmd, wait=wait)
    return LeaseOut.of(lease)


def _lease(access: Access, task: str, body: LeaseIn) -> Lease:
    if body.task_id is not None and body.task_id != task:
        raise BadRequest(f"the lease is for task {body.task_id!r}, the path names {task!r}")
    if body.room is not None and body.room != access.room.name:
        raise BadRequest(
            f"the lease is for room {body.room!r}, the path names {access.room.name!r}"
        )
    agent = act_as(access.principal, body.agent)
    ttl = body.ttl if body.ttl is not None else DEFAULT_LEASE
    return Lease(access.room.name, task, agent, body.fence, body.expires_at, ttl)


@router.post("/{task}/renew", summary="Extend a lease from now", responses=COMMAND)
async def renew(
    access: LeaseAcquire, task: TaskPath, body: LeaseIn, key: IdempotencyKey = None
) -> LeaseOut:
    lease = _lease(access, task, body)
    renewed = await access.room.plan.renew(
        lease, lease.ttl, command_id=command_id(access.principal, key)
    )
    return LeaseOut.of(renewed)


@router.post("/{task}/complete", summary="Record the result of a held task", responses=COMMAND)
async def complete(
    access: LeaseAcquire, task: TaskPath, body: CompleteIn, key: IdempotencyKey = None
) -> TaskOut:
    done = await access.room.plan.complete(
        _lease(access, task, body), body.result, command_id=command_id(access.principal, key)
    )
    return TaskOut.of(done)


@router.post("/{task}/fail", summary="Give a held task back", responses=COMMAND)
async def fail(
    access: LeaseAcquire, task: TaskPath, body: FailIn, key: IdempotencyKey = None
) -> TaskOut:
    failed = await access.room.plan.fail(
        _lease(access, task, body), body.error, command_id=command_id(access.principal, key)
    )
    return TaskOut.of(failed)


@router.post("/{task}/cancel", summary="Cancel an unfinished task", responses=COMMAND)
async def cancel(
    access: PlanWrite,
    task: TaskPath,
    body: Annotated[CancelIn | None, Body()] = None,
    key: IdempotencyKey = None,
) -> TaskOut:
    reason = None if body is None else body.reason
    cancelled = await access.room.plan.cancel(
        task, reason, command_id=command_id(access.principal, key), author=access.agent
    )
    return TaskOut.of(cancelled)
