"""What the operator read model returns: plain frozen dataclasses whose :func:`as_json`
is the JSON of the operator API (docs/operations.md). Times are store-clock epoch
seconds, durations seconds. No IO here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from agentrooms.store.types import JSON

EXPIRED = "expired, reclaimable"
"""The state of a claimed task whose lease ran out by the store's clock (the next
``claim_next`` hands it out)."""
EXPIRED_LAST = "expired, last attempt"
"""The same, on the task's last attempt: the next claim fails it instead."""

# stuck kinds, most urgent first (their order in the stuck list)
EXPIRED_LEASE = "expired_lease"
WAITER_WAITING = "waiter_waiting"
EFFECT_UNKNOWN = "effect_unknown"
FAILED_AT_LIMIT = "failed_at_limit"
CURSOR_LAGGING = "cursor_lagging"
URGENCY = (EXPIRED_LEASE, WAITER_WAITING, EFFECT_UNKNOWN, FAILED_AT_LIMIT, CURSOR_LAGGING)


def as_json(value: Any) -> Any:
    """A read model value (dataclasses nested in lists and dicts) as plain JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When something counts as stuck: an unknown effect older than ``effect_unknown``
    seconds, a lock waiter in line longer than ``waiter_waiting`` seconds, a cursor more
    than ``cursor_lag`` events behind the log's head. Expired leases and tasks failed at
    their attempt limit are stuck at once."""

    effect_unknown: float = 60.0
    waiter_waiting: float = 60.0
    cursor_lag: int = 1000


@dataclass(frozen=True, slots=True)
class Stuck:
    kind: str
    subject: str
    detail: str
    since: float | None


@dataclass(frozen=True, slots=True)
class TaskRow:
    id: str
    status: str
    state: str
    owner: str | None
    lease_remaining: float | None
    fence: int | None
    attempts: int
    deps: list[str]
    title: str = ""
    max_attempts: int = 0
    lease_expires: float | None = None
    lease_granted_at: float | None = None
    lease_renewed_at: float | None = None
    waiting_on: list[str] = field(default_factory=list)
    error: JSON = None


@dataclass(frozen=True, slots=True)
class PlanPage:
    counts: dict[str, int]  # by status
    total: int
    tasks: list[TaskRow]
    next_after: str | None
    states: dict[str, int] = field(default_factory=dict)  # by state (expired shown apart)


@dataclass(frozen=True, slots=True)
class TaskPage:
    tasks: list[TaskRow]
    next_after: str | None


@dataclass(frozen=True, slots=True)
class Waiter:
    owner: str
    waited: float | None  # None: the entry does not say when it joined
    joined_at: float | None = None
    waiter: str = ""


@dataclass(frozen=True, slots=True)
class LockRow:
    name: str
    holder: str | None
    since: float | None
    expires_at: float | None
    remaining: float | None
    fence: int
    waiters: list[Waiter]
    queued: int = 0  # waiters in line (``waiters`` lists the first of them)
    renewed_at: float | None = None


@dataclass(frozen=True, slots=True)
class PresenceRow:
    agent: str
    last_seen: float
    age: float
    online: bool
    status: str = ""


@dataclass(frozen=True, slots=True)
class CursorRow:
    agent: str
    position: int
    lag: int


@dataclass(frozen=True, slots=True)
class DocRow:
    name: str
    version: int
    last_writer: str | None


@dataclass(frozen=True, slots=True)
class EffectRow:
    id: str
    state: str
    since: float | None
    attempts: int
    error: JSON
    kind: str = ""
    holder: str | None = None


@dataclass(frozen=True, slots=True)
class Effects:
    counts: dict[str, int]
    unknown: list[EffectRow]
    failed: list[EffectRow]
    dead_letters: list[EffectRow]


@dataclass(frozen=True, slots=True)
class WriterQueue:
    name: str
    queued: int
    dead_letters: int
    position: int


@dataclass(frozen=True, slots=True)
class Writer:
    queued: int
    dead_letters: int
    queues: list[WriterQueue]
    dead: list[dict[str, Any]]  # the first dead letters: queue, id, seq, reason, failures


@dataclass(frozen=True, slots=True)
class Conflicts:
    prefix: str
    conflicts: int


@dataclass(frozen=True, slots=True)
class EventRow:
    seq: int
    type: str
    author: str | None
    time: float
    data: JSON


@dataclass(frozen=True, slots=True)
class EventPage:
    events: list[EventRow]
    next_before: int | None


@dataclass(frozen=True, slots=True)
class RoomPage:
    """One room's first screen (``GET /v1/ops/rooms/{room}``)."""

    room: str
    now: float
    last_seq: int
    archived: bool
    stuck: list[Stuck]
    stuck_total: int
    plan: PlanPage
    locks: list[LockRow]
    presence: list[PresenceRow]
    cursors: list[CursorRow]
    documents: list[DocRow]
    effects: Effects
    writer: Writer
    contention: list[Conflicts]
    events: list[EventRow]


@dataclass(frozen=True, slots=True)
class RoomSummary:
    room: str
    tasks: dict[str, int]
    stuck: int
    locks_held: int
    online: int
    last_seq: int
    archived: bool


@dataclass(frozen=True, slots=True)
class RoomsPage:
    now: float
    rooms: list[RoomSummary]
    next_after: str | None
