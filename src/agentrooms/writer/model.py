"""The queue's keys, the intent codec and the outcomes a submitter reads back."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrooms.commit import Intent, Where
from agentrooms.errors import BadRequest
from agentrooms.rooms import keys as room_keys
from agentrooms.store.types import JSON, Append, Delete, Put, SetAdd, SetRemove, Write

__all__ = [
    "APPLIED",
    "DEAD",
    "QUEUED",
    "REJECTED",
    "RESERVED",
    "SETTLED",
    "SKIPPED",
    "SUBMITTED",
    "DeadLetter",
    "Increment",
    "IntentOutcome",
    "QueueKeys",
    "QueuedIntent",
    "decode_intent",
    "encode_intent",
]

QUEUED, APPLIED, REJECTED, DEAD = "queued", "applied", "rejected", "dead"
SKIPPED = "skipped"  # a submission settled already, or without an intent (never waited on)
SUBMITTED = "wq.submitted"
SETTLED = "wq.settled"  # one per batch: its outcomes
RESERVED = (
    "wq/",
    "wq:",
    "_ar/",
    "lock/",
    "lockfence/",
    "lockgrant/",
    "lockq/",
    "paths/",
    "pathx/",
    room_keys.PATH_FENCE,
    room_keys.META,
)
DEFAULT_RETRY_AFTER = 1.0  # when the writer's throughput is not known (or stale)
STALE_RATE = 30.0  # seconds without a settled intent after which the throughput is stale
OUTAGE_PAUSE = 0.5  # seconds a writer waits after the store failed before trying again


# ------------------------------------------------------------------------------- keys


@dataclass(frozen=True, slots=True)
class QueueKeys:
    name: str

    @property
    def cursor(self) -> str:
        return f"wq/{self.name}/cursor"

    @property
    def marker(self) -> str:
        """A record naming the queue, so that it is found by a scan of ``wq/`` before
        anything in it is settled."""
        return f"wq/{self.name}/queue"

    @property
    def queued(self) -> str:
        return f"wq:{self.name}:queued"

    @property
    def lock(self) -> str:
        return f"writer.{self.name}"

    def item(self, intent_id: str) -> str:
        return f"wq/{self.name}/i/{intent_id}"

    def dead(self, intent_id: str = "") -> str:
        return f"wq/{self.name}/dead/{intent_id}"


# ----------------------------------------------------------------------- increments


@dataclass(frozen=True, slots=True)
class Increment:
    """Add ``by`` to a counter: the number that is record ``key``'s value (``path``
    ``None``), or the number at dotted ``path`` in the object that is its value. An
    absent record, field or intermediate object counts as 0 (as ``{}``). Commutative: it
    needs no predicate, so concurrent increments are never rejected. A value in the way
    that is not a number (or not an object, along ``path``) makes the intent
    ``rejected``. The record keeps its TTL."""

    key: str
    by: int | float = 1
    path: str | None = None

    def __post_init__(self) -> None:
        by = self.by
        if isinstance(by, bool) or not isinstance(by, int | float) or not math.isfinite(by):
            raise BadRequest(f"an increment adds a finite number, not {by!r}")
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise BadRequest("an increment's path is a non-empty dotted string or None")

    def __str__(self) -> str:
        return self.key + (f".{self.path}" if self.path else "")


@dataclass(frozen=True, slots=True)
class QueuedIntent(Intent):
    """An :class:`~agentrooms.commit.Intent` with increments, for the queue only: the
    writer applies its ``writes``, then its ``increments`` (on the state its writes
    left), then its ``appends``, if every predicate holds."""

    increments: Sequence[Increment] = ()


def increments_of(intent: Intent) -> Sequence[Increment]:
    return intent.increments if isinstance(intent, QueuedIntent) else ()


# ------------------------------------------------------------------------------ codec


def encode_intent(intent: Intent) -> dict[str, Any]:
    """The JSON form of an intent (what is queued and sent over the wire); a
    :class:`QueuedIntent`'s increments are its ``increments`` field."""
    writes: list[dict[str, Any]] = []
    for w in intent.writes:
        if isinstance(w, Put):
            writes.append({"op": "put", "key": w.key, "value": w.value, "ttl": w.ttl})
        elif isinstance(w, Delete):
            writes.append({"op": "delete", "key": w.key})
        elif isinstance(w, SetAdd | SetRemove):
            op = "set_add" if isinstance(w, SetAdd) else "set_remove"
            writes.append({"op": op, "name": w.name, "member": w.member})
        else:
            raise BadRequest(f"not a write: {w!r}")
    encoded: dict[str, Any] = {
        "when": [{"key": p.key, "path": p.path, "op": p.op, "value": p.value} for p in intent.when],
        "writes": writes,
        "appends": [{"type": a.type, "data": a.data} for a in intent.appends],
    }
    increments = increments_of(intent)
    if increments:
        encoded["increments"] = [{"key": i.key, "by": i.by, "path": i.path} for i in increments]
    return encoded


def decode_intent(data: JSON) -> Intent:
    """The intent from its JSON form (a :class:`QueuedIntent` when it has increments);
    ``BadRequest`` naming what is wrong with it (including writes to the keys the queue,
    the locks and the room reserve)."""
    try:
        when = [
            Where(p["key"], p.get("path"), p.get("op", "exists"), p.get("value"))
            for p in data["when"]
        ]
        writes = [_decode_write(w) for w in data["writes"]]
        appends = [Append(a["type"], a.get("data")) for a in data["appends"]]
        increments = [
            Increment(i["key"], i.get("by", 1), i.get("path")) for i in data.get("increments", [])
        ]
    except (KeyError, TypeError, AttributeError) as exc:
        raise BadRequest(f"malformed intent: {type(exc).__name__}: {exc}") from exc
    intent = (
        QueuedIntent(when, writes, appends, increments)
        if increments
        else Intent(when, writes, appends)
    )
    check_targets(intent)
    return intent


def check_targets(intent: Intent) -> None:
    """``BadRequest`` if the intent writes a key the queue, the locks or the room
    reserve."""
    targets = [w.name if isinstance(w, SetAdd | SetRemove) else w.key for w in intent.writes]
    for target in [*targets, *(i.key for i in increments_of(intent))]:
        if (
            not isinstance(target, str)
            or target == room_keys.ARCHIVED
            or target.startswith(RESERVED)
        ):
            raise BadRequest(f"an intent may not write the reserved key {target!r}")


def _decode_write(w: dict[str, Any]) -> Write:
    op = w["op"]
    if op == "put":
        return Put(w["key"], w.get("value"), w.get("ttl"))
    if op == "delete":
        return Delete(w["key"])
    if op in ("set_add", "set_remove"):
        return (SetAdd if op == "set_add" else SetRemove)(w["name"], w["member"])
    raise BadRequest(f"unknown write op {op!r}")


def _digest(payload: JSON) -> tuple[str, int]:
    """The payload's digest (to tell a re-submission from another intent under the
    same id) and the size of its JSON text in bytes."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(text).hexdigest(), len(text)


# ---------------------------------------------------------------------------- outcomes


@dataclass(frozen=True, slots=True)
class IntentOutcome:
    """An intent's outcome: ``queued`` until the writer settled it, then ``applied``,
    ``rejected`` (``reason``: the failed predicates) or ``dead``. ``seq``: its submission's
    log seq; ``place``: the place it was ordered by in its batch (its ``seq``, or for a
    retry the place of the outcome it retried). Pass a rejected outcome as
    ``IntentQueue.submit(..., retry_of=outcome)`` to keep that place."""

    id: str
    status: str  # queued | applied | rejected | dead
    reason: JSON = None  # the failed predicates, or why it went to the dead letters
    seq: int | None = None  # the submission's log seq, once settled
    place: int | None = None  # the place it was ordered by, once settled

    @property
    def settled(self) -> bool:
        return self.status != QUEUED


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: str
    seq: int
    intent: JSON
    reason: JSON
    failures: int


def _outcome(intent_id: str, item: dict[str, Any]) -> IntentOutcome:
    seq = item.get("seq")
    return IntentOutcome(intent_id, item["status"], item.get("reason"), seq, item.get("place", seq))
