"""The plan's transitions: pure functions from a view of the tasks to the change to commit
(add a batch, claim, complete, fail, cancel). :mod:`agentrooms.rooms.plan` runs them
through the commit loop; they raise ``InvalidTransition`` or ``StaleFence`` to refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrooms.commit import Change, CommitResult, View
from agentrooms.errors import (
    BadRequest,
    InvalidTransition,
    LeaseHeld,
    NotFound,
    StaleFence,
)
from agentrooms.rooms import keys
from agentrooms.rooms.tasks import (
    CANCELLED,
    CLAIMED,
    DONE,
    FAILED,
    PENDING,
    READY,
    TERMINAL,
    Lease,
    Task,
    TaskSpec,
)
from agentrooms.store.types import (
    JSON,
    Append,
    Put,
    SetAdd,
    SetRemove,
    Write,
)


@dataclass(frozen=True, slots=True)
class Command:
    """A command id and the payload it is checked against (for retried deliveries)."""

    id: str | None
    event: JSON


class Skip(Exception):
    """The candidate is not claimable (any more): try the next one."""


def task_in(view: View, task_id: str) -> Task | None:
    record = view.record(keys.task(task_id))
    return None if record is None else Task.from_value(record.value, record.version, view.now)


def add(view: View, batch: list[TaskSpec], external: list[str], author: str | None) -> Change:
    for spec in batch:
        if view.exists(keys.task(spec.id)):
            raise InvalidTransition(f"task {spec.id!r} already exists")
    existing: dict[str, Task] = {}
    for dep in external:
        task = task_in(view, dep)
        if task is None:
            needing = next(s.id for s in batch if dep in s.deps)
            raise BadRequest(
                f"task {needing!r} depends on missing task {dep!r}: {needing} -> {dep}"
            )
        existing[dep] = task
    writes: list[Write] = []
    appends: list[Append] = []
    ready: list[str] = []
    dependents: dict[str, list[str]] = {s.id: [] for s in batch}
    for spec in batch:
        for dep in spec.deps:
            if dep in dependents:
                dependents[dep].append(spec.id)
    for dep, task in existing.items():
        added = [s.id for s in batch if dep in s.deps]
        writes.append(
            Put(keys.task(dep), task.replace(dependents=[*task.dependents, *added]).to_value())
        )
    for spec in batch:
        waiting = [
            d for d in dict.fromkeys(spec.deps) if d not in existing or existing[d].status != DONE
        ]
        status = PENDING if waiting else READY
        task = Task(
            id=spec.id,
            title=spec.title,
            payload=spec.payload,
            status=status,
            deps=list(dict.fromkeys(spec.deps)),
            waiting_on=waiting,
            dependents=dependents[spec.id],
            max_attempts=spec.max_attempts,
        )
        writes.append(Put(keys.task(spec.id), task.to_value()))
        if status == READY:
            writes.append(SetAdd(keys.READY, spec.id))
            ready.append(spec.id)
        appends.append(Append("task.added", {"task": spec.id, "status": status}, author))
    return Change(writes=writes, appends=appends, result=ready)


def claim(
    view: View,
    task_id: str,
    agent: str,
    ttl: float,
    *,
    accept: Callable[[Task], bool] | None = None,
    named: bool = False,
    repair: bool = True,
) -> Change:
    """Grant ``agent`` a lease on the task, or reclaim it if its lease ran out (failing
    it instead on its last attempt). Not claimable: ``Skip`` for a drawn candidate, or
    the reason for a ``named`` one; a stray member of the ready set is removed
    (``repair``)."""
    task = task_in(view, task_id)
    if task is None:
        return _not_claimable(NotFound(f"no task {task_id!r}"), named, repair, task_id)
    expired = task.status == CLAIMED and (task.lease_expires or 0) <= view.now
    if task.status == CLAIMED and not expired:
        if named:
            raise LeaseHeld(task_id, task.owner)
        raise Skip
    if task.status != READY and not expired:
        wrong = InvalidTransition(f"task {task_id!r} is {task.status}, not ready")
        return _not_claimable(wrong, named, repair, task_id)
    if accept is not None and not accept(task):
        raise Skip
    for dep in task.deps:
        dep_task = task_in(view, dep)  # compared in the write: still done when we claim
        if dep_task is None or dep_task.status != DONE:
            raise InvalidTransition(f"task {task_id!r} waits for {dep!r}")
    if not expired:
        return _grant(view, task, agent, ttl, [])
    lapsed = {"task": task_id, "agent": task.owner, "fence": task.fence}
    appends = [Append("lease.expired", lapsed, agent)]
    if task.attempts < task.max_attempts:
        return _grant(view, task, agent, ttl, appends)
    if not repair:  # a state change of its own: leave it to a claim without a command id
        raise Skip
    return _fail_at_limit(task, agent, appends)


def _not_claimable(reason: Exception, named: bool, repair: bool, task_id: str) -> Change:
    """``reason`` for a named task; for a drawn candidate, the removal of the stray
    member of the ready set (``repair``), else ``Skip``."""
    if named:
        raise reason
    if not repair:
        raise Skip
    return Change(writes=[SetRemove(keys.READY, task_id)])


def _fail_at_limit(task: Task, agent: str, appends: list[Append]) -> Change:
    """The task's lease ran out on its last attempt: it fails."""
    failed = task.replace(
        status=FAILED,
        owner=None,
        lease_expires=None,
        lease_granted_at=None,
        lease_renewed_at=None,
        error="lease expired on the last attempt",
    )
    return Change(
        writes=[Put(keys.task(task.id), failed.to_value()), SetRemove(keys.LEASED, task.id)],
        appends=[*appends, Append("task.failed", {"task": task.id, "terminal": True}, agent)],
    )


def _grant(view: View, task: Task, agent: str, ttl: float, appends: list[Append]) -> Change:
    """A new lease on ``task`` for ``agent``, with the next fencing token; ``appends``
    (non-empty: the lapsed lease's event) make it a reclaim."""
    task_id, fence, expires = task.id, task.fence + 1, view.now + ttl
    claimed = task.replace(
        status=CLAIMED,
        owner=agent,
        fence=fence,
        attempts=task.attempts + 1,
        lease_expires=expires,
        lease_granted_at=view.now,
        lease_renewed_at=None,
    )
    writes: list[Write] = [
        Put(keys.task(task_id), claimed.to_value()),
        SetRemove(keys.READY, task_id),
        SetAdd(keys.LEASED, task_id),
    ]
    lease = {
        "task_id": task_id,
        "agent": agent,
        "fence": fence,
        "expires_at": expires,
        "ttl": ttl,
        "granted_at": view.now,
    }
    kind = "lease.reclaimed" if appends else "lease.granted"
    data = {"task": task_id, "agent": agent, "fence": fence, "expires_at": expires}
    return Change(writes=writes, appends=[*appends, Append(kind, data, agent)], result=lease)


def lease_from(room: str, data: dict[str, Any]) -> Lease:
    return Lease(
        room,
        data["task_id"],
        data["agent"],
        data["fence"],
        data["expires_at"],
        data["ttl"],
        data.get("granted_at"),  # absent from a lease recorded before it was kept
    )


def task_after(result: CommitResult, task_id: str) -> Task:
    """The task as a commit left it (its value is the commit's result)."""
    return Task.from_value(result.result, result.versions.get(keys.task(task_id), 0))


def lease_data(lease: Lease, expires: float | None = None) -> dict[str, Any]:
    return {
        "task": lease.task_id,
        "agent": lease.agent,
        "fence": lease.fence,
        "expires_at": lease.expires_at if expires is None else expires,
    }


def held(view: View, lease: Lease) -> Task:
    """The task, if ``lease`` is still its current claim; else StaleFence."""
    task = task_in(view, lease.task_id)
    if task is None:
        raise NotFound(f"no task {lease.task_id!r}")
    if task.fence != lease.fence:
        raise StaleFence(keys.task(task.id), lease.fence, task.fence)
    if task.status != CLAIMED or task.owner != lease.agent:
        raise InvalidTransition(f"task {task.id!r} is {task.status}, not held by {lease.agent!r}")
    return task


def complete(view: View, lease: Lease, result: JSON) -> Change:
    task = held(view, lease)
    done = task.replace(
        status=DONE, result=result, lease_expires=None, lease_granted_at=None, lease_renewed_at=None
    )
    writes: list[Write] = [
        Put(keys.task(task.id), done.to_value()),
        SetRemove(keys.LEASED, task.id),
    ]
    appends = [
        Append(
            "task.completed",
            {"task": task.id, "agent": lease.agent, "fence": lease.fence},
            lease.agent,
        )
    ]
    for dependent_id in task.dependents:
        dependent = task_in(view, dependent_id)
        if dependent is None:
            continue
        waiting = [d for d in dependent.waiting_on if d != task.id]
        becomes_ready = not waiting and dependent.status == PENDING
        changed = dependent.replace(
            waiting_on=waiting, status=READY if becomes_ready else dependent.status
        )
        writes.append(Put(keys.task(dependent_id), changed.to_value()))
        if becomes_ready:
            writes.append(SetAdd(keys.READY, dependent_id))
            appends.append(Append("task.ready", {"task": dependent_id}, lease.agent))
    return Change(writes=writes, appends=appends, result=done.to_value())


def fail(view: View, lease: Lease, error: JSON) -> Change:
    task = held(view, lease)
    terminal = task.attempts >= task.max_attempts
    after = task.replace(
        status=FAILED if terminal else READY,
        owner=None,
        lease_expires=None,
        lease_granted_at=None,
        lease_renewed_at=None,
        error=error,
    )
    writes: list[Write] = [
        Put(keys.task(task.id), after.to_value()),
        SetRemove(keys.LEASED, task.id),
    ]
    if not terminal:
        writes.append(SetAdd(keys.READY, task.id))
    data = {
        "task": task.id,
        "agent": lease.agent,
        "error": error,
        "terminal": terminal,
        "attempts": task.attempts,
    }
    failed = Append("task.failed", data, lease.agent)
    return Change(writes=writes, appends=[failed], result=after.to_value())


def cancel(view: View, task_id: str, reason: JSON, author: str | None) -> Change:
    task = task_in(view, task_id)
    if task is None:
        raise NotFound(f"no task {task_id!r}")
    if task.status in TERMINAL:
        raise InvalidTransition(f"task {task_id!r} is already {task.status}")
    cancelled = task.replace(
        status=CANCELLED,
        fence=task.fence + 1,
        lease_expires=None,
        lease_granted_at=None,
        lease_renewed_at=None,
        error=reason,
    )
    return Change(
        writes=[
            Put(keys.task(task_id), cancelled.to_value()),
            SetRemove(keys.READY, task_id),
            SetRemove(keys.LEASED, task_id),
        ],
        appends=[Append("task.cancelled", {"task": task_id, "reason": reason}, author)],
        result=cancelled.to_value(),
    )
