"""What the outbox stores: the effect record, how a state change requests one, and the
verdicts a reconciler's check can return. Plain data and pure functions, no IO."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any, Literal

from agentrooms.commit import Change, View
from agentrooms.errors import BadRequest, IdempotencyMismatch
from agentrooms.rooms import keys
from agentrooms.store.types import JSON, Absent, Append, Compare, Put, SetAdd, Write

PENDING, CLAIMED, UNKNOWN = "pending", "claimed", "unknown"
SUCCEEDED, FAILED, COMPENSATED = "succeeded", "failed", "compensated"
TERMINAL = frozenset({SUCCEEDED, FAILED, COMPENSATED})

PENDING_SET = "effects:pending"
"""Ids of effects waiting for a worker (claimed through ``set_pick``)."""
INFLIGHT_SET = "effects:inflight"
"""Ids of claimed or unknown effects: where the reconciler looks."""
DEAD_SET = "effects:dead"
"""Ids of effects that failed for good (counted with ``set_size``)."""

DEFAULT_MAX_ATTEMPTS = 5


def effect_key(op_id: str) -> str:
    return f"effect/{op_id}"


@dataclass(frozen=True, slots=True)
class Effect:
    """One requested external operation. ``id`` is the idempotency key handed to the
    destination; ``fence`` grows with every claim and every reconciler take-over;
    ``holder`` is the worker or reconciler holding the lease (kept on success: who
    performed it)."""

    id: str
    kind: str
    params: JSON
    status: str
    attempts: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    fence: int = 0
    holder: str | None = None
    lease_expires: float | None = None  # store clock
    not_before: float | None = None  # a retry waits until then (store clock)
    since: float | None = None  # store time of the last status change
    result: JSON = None
    error: JSON = None
    compensates: str | None = None  # the effect this one undoes
    compensation: str | None = None  # the effect that undoes this one
    version: int = 0

    @property
    def key(self) -> str:
        return effect_key(self.id)

    @property
    def idempotency_key(self) -> str:
        return self.id

    @classmethod
    def from_value(cls, value: dict[str, Any], version: int) -> Effect:
        return cls(**value, version=version)

    def to_value(self) -> dict[str, Any]:
        value = asdict(self)
        del value["version"]
        return value

    def replace(self, **changes: Any) -> Effect:
        return Effect.from_value({**self.to_value(), **changes}, self.version)


def read_effect(view: View, op_id: str) -> Effect | None:
    record = view.record(effect_key(op_id))
    return None if record is None else Effect.from_value(record.value, record.version)


@dataclass(frozen=True, slots=True)
class EffectRequest:
    """An effect to record with a state change: ``id`` (the operation id, reused as the
    idempotency key), ``kind`` (which handler performs it) and the exact ``params``;
    ``author``, the agent requesting it, is the author of its ``effect.requested`` event."""

    id: str
    kind: str
    params: JSON = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    compensates: str | None = None
    author: str | None = None

    def __post_init__(self) -> None:
        keys.check_name(self.id, "effect id")
        keys.check_name(self.kind, "effect kind")
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 1000:
            raise BadRequest("max_attempts must be an integer from 1 to 1000")

    @property
    def key(self) -> str:
        return effect_key(self.id)

    def record(self, now: float | None = None) -> Effect:
        return Effect(
            self.id,
            self.kind,
            self.params,
            PENDING,
            max_attempts=self.max_attempts,
            since=now,
            compensates=self.compensates,
        )

    def writes(self, now: float | None = None) -> list[Write]:
        """The record (status ``pending``) and its entry in the pending set."""
        return [Put(self.key, self.record(now).to_value()), SetAdd(PENDING_SET, self.id)]

    def appends(self) -> list[Append]:
        data = {"effect": self.id, "kind": self.kind, "compensates": self.compensates}
        return [Append("effect.requested", data, self.author)]

    def compares(self) -> list[Compare]:
        """For a raw transact: fail (``VersionConflict`` on the key) if the id is taken."""
        return [Absent(self.key)]

    def same_as(self, effect: Effect) -> bool:
        return (effect.kind, effect.params) == (self.kind, self.params)


def request_effects(view: View, change: Change, *requests: EffectRequest) -> Change:
    """``change`` plus the records of ``requests``, for use inside a transition: the
    state change and the request for its effects commit together or not at all.

    Each effect's key is read through ``view`` (so the commit compares it). An id already
    recorded with the same kind and params adds nothing (a re-delivered request); with
    anything else it raises ``IdempotencyMismatch``.
    """
    writes, appends = list(change.writes), list(change.appends)
    for request in requests:
        existing = read_effect(view, request.id)
        if existing is not None:
            if not request.same_as(existing):
                raise IdempotencyMismatch(
                    f"effect {request.id!r} was already requested with another kind or params"
                )
            continue
        writes += request.writes(view.now)
        appends += request.appends()
    return Change(writes, appends, change.requires, change.result)


def compensation_id(op_id: str) -> str:
    """The default id of the effect that compensates ``op_id`` (deterministic)."""
    candidate = f"{op_id}.undo"
    if len(candidate) <= 128:
        return candidate
    return "undo-" + hashlib.sha256(op_id.encode()).hexdigest()[:40]


Action = Literal["complete", "retry", "compensate", "fail", "wait"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a reconciler's ``check(effect)`` found out at the destination.

    * ``applied(result)``: the destination did apply it; record ``succeeded``.
    * ``not_applied()``: it did not; send the effect back to the workers (same id).
    * ``compensate(kind, params)``: undo it with an effect of its own (a new id, linked
      to the original), recorded in the same write that marks the original ``compensated``.
    * ``failed(error)``: give up; record ``failed`` (dead).
    * ``undecided()``: the destination cannot tell yet; check again later.
    """

    action: Action
    result: JSON = None
    error: JSON = None
    compensation: EffectRequest | None = None

    @classmethod
    def applied(cls, result: JSON = None) -> Outcome:
        return cls("complete", result=result)

    @classmethod
    def not_applied(cls) -> Outcome:
        return cls("retry")

    @classmethod
    def failed(cls, error: JSON = None) -> Outcome:
        return cls("fail", error=error)

    @classmethod
    def undecided(cls) -> Outcome:
        return cls("wait")

    @classmethod
    def compensate(
        cls,
        original: Effect,
        kind: str,
        params: JSON = None,
        *,
        op_id: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> Outcome:
        request = EffectRequest(
            op_id or compensation_id(original.id),
            kind,
            params,
            max_attempts=max_attempts,
            compensates=original.id,
        )
        return cls("compensate", compensation=request)


class PermanentFailure(Exception):
    """Raised by a handler: the destination refused the operation for good (no retry)."""


class OutcomeUnknown(Exception):
    """Raised by a handler: the call may or may not have been applied (a timeout after
    sending, a dropped connection). The effect becomes ``unknown`` and is left to the
    reconciler, which asks the destination before anything is repeated."""


def describe_error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)[:1000]}
