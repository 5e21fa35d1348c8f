"""The plan's data: tasks, their statuses and leases, and the checks on a batch to add.

Plain values with no IO: :mod:`agentrooms.rooms.plan` reads and writes them, and
:mod:`agentrooms.rooms.task_transitions` decides on them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from agentrooms.errors import (
    BadRequest,
)
from agentrooms.rooms import keys
from agentrooms.store.types import (
    JSON,
    FenceAtMost,
)

PENDING, READY, CLAIMED, DONE, FAILED, CANCELLED = (
    "pending",
    "ready",
    "claimed",
    "done",
    "failed",
    "cancelled",
)
TERMINAL = frozenset({DONE, FAILED, CANCELLED})
DEFAULT_LEASE = 60.0
PICK = 8  # candidates drawn per set_pick once a drawn candidate was not claimable
FIRST_PICK = 1  # candidates drawn first: each drawn one costs the store a write (its pick
# mark), and the fair pick hands concurrent claimers different candidates, so the first
# is claimable unless the ready set is nearly empty or another claimer raced for it
MAX_BATCH = 1000  # tasks per add (each takes about four store operations)
LEASE_HELD = "held"
LEASE_EXPIRED = "expired, reclaimable"
LEASE_EXPIRED_LAST = "expired, last attempt"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task to add: its id, what it is, and the ids of the tasks it waits for."""

    id: str
    title: str = ""
    payload: JSON = None
    deps: Sequence[str] = ()
    max_attempts: int = 3


@dataclass(frozen=True, slots=True)
class TaskList:
    """Tasks in id order; ``next_after`` is the ``after`` of the next page, ``None``
    when no task follows."""

    tasks: list[Task]
    next_after: str | None


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    title: str
    payload: JSON
    status: str
    deps: list[str]
    waiting_on: list[str]
    dependents: list[str]
    owner: str | None = None
    result: JSON = None
    error: JSON = None
    attempts: int = 0
    max_attempts: int = 3
    fence: int = 0
    lease_expires: float | None = None
    lease_granted_at: float | None = None  # store clock: the claim that granted the lease
    lease_renewed_at: float | None = None  # store clock: its last renewal (None: never)
    version: int = 0
    # As of the read's store time, not stored (and not compared): for a claimed task
    # LEASE_HELD, LEASE_EXPIRED (claim_next reclaims it) or LEASE_EXPIRED_LAST (its
    # attempts are used up: the next claim fails it); None for a task not claimed. And
    # the seconds left on the lease (0 once expired; None when not claimed).
    lease_state: str | None = field(default=None, compare=False)
    lease_remaining: float | None = field(default=None, compare=False)

    @classmethod
    def from_value(cls, value: dict[str, Any], version: int, now: float | None = None) -> Task:
        """The task a stored value holds; with ``now`` (the read's store time) its
        ``lease_state`` and ``lease_remaining`` as of then."""
        task = cls(**value, version=version)
        if now is None or task.status != CLAIMED:
            return task
        remaining = max(0.0, (task.lease_expires or 0.0) - now)
        if remaining > 0:
            state = LEASE_HELD
        else:
            state = LEASE_EXPIRED if task.attempts < task.max_attempts else LEASE_EXPIRED_LAST
        return dataclasses.replace(task, lease_state=state, lease_remaining=remaining)

    @property
    def state(self) -> str:
        """What to show: the status, except ``lease_state`` for a claimed task whose
        lease expired as of the read."""
        if self.lease_state in (LEASE_EXPIRED, LEASE_EXPIRED_LAST):
            return self.lease_state
        return self.status

    def to_value(self) -> dict[str, Any]:
        """The stored value: every field but ``version`` and the read-time ``lease_state``
        and ``lease_remaining``, copied one level deep (values are immutable here, and the
        store serializes what it is given)."""
        return {name: getattr(self, name) for name in _TASK_FIELDS}

    def replace(self, **changes: Any) -> Task:
        return Task.from_value({**self.to_value(), **changes}, self.version)


_TASK_FIELDS = tuple(
    f.name for f in fields(Task) if f.name not in ("version", "lease_state", "lease_remaining")
)


@dataclass(frozen=True, slots=True)
class Lease:
    """An agent's exclusive, expiring claim on one task, with its fencing token."""

    room: str
    task_id: str
    agent: str
    fence: int
    expires_at: float  # store clock
    ttl: float = DEFAULT_LEASE
    granted_at: float | None = None  # store clock: the claim that granted it

    def guard(self) -> FenceAtMost:
        """A compare that lets a write commit only while this lease's token is current."""
        return FenceAtMost(keys.task(self.task_id), self.fence)


@dataclass
class LeaseKeeper:
    """What :meth:`Plan.keep_alive` yields: the current lease, and whether it was lost."""

    lease: Lease
    lost: BaseException | None = None
    lost_event: asyncio.Event = field(default_factory=asyncio.Event)


def check_ttl(ttl: object) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86_400:
        raise BadRequest(f"a lease ttl must be between 0 and 86400 seconds, got {ttl!r}")
    return float(ttl)


def validate_specs(specs: Sequence[TaskSpec]) -> None:
    """Ids well-formed and unique, attempt limits sane, no cycle within the batch
    (existing tasks cannot depend on new ones, so every cycle lies inside it)."""
    ids: dict[str, TaskSpec] = {}
    for spec in specs:
        if not isinstance(spec, TaskSpec):
            raise BadRequest(f"not a TaskSpec: {spec!r}")
        keys.check_name(spec.id, "task id")
        if spec.id in ids:
            raise BadRequest(f"task {spec.id!r} appears twice")
        for dep in spec.deps:
            keys.check_name(dep, "dependency id")
        if not isinstance(spec.title, str) or len(spec.title) > 1000:
            raise BadRequest("a task title is a string of at most 1000 characters")
        if (
            isinstance(spec.max_attempts, bool)
            or not isinstance(spec.max_attempts, int)
            or not (1 <= spec.max_attempts <= 1000)
        ):
            raise BadRequest("max_attempts must be an integer from 1 to 1000")
        ids[spec.id] = spec
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in ids[node].deps:
            if dep not in ids:
                continue
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep] if dep in path else [node, dep]
                raise BadRequest(f"dependency cycle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for spec_id in ids:
        if spec_id not in state:
            visit(spec_id, [spec_id])
