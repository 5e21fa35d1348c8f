"""The writer's transitions, pure functions of a snapshot: apply a batch of intents,
count a failure, send a poison intent to the dead letters."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrooms.commit import Change, Intent, View
from agentrooms.errors import BadRequest
from agentrooms.rooms import keys as room_keys
from agentrooms.rooms.locks import Lock
from agentrooms.store.types import (
    JSON,
    Append,
    Delete,
    Event,
    Put,
    Record,
    SetAdd,
    SetRemove,
    Write,
)
from agentrooms.writer.model import (
    APPLIED,
    DEAD,
    QUEUED,
    REJECTED,
    SETTLED,
    SKIPPED,
    Increment,
    QueueKeys,
    decode_intent,
    increments_of,
)


def _field(event: Event, name: str) -> Any:
    return event.data.get(name) if isinstance(event.data, dict) else None


@dataclass(frozen=True, slots=True)
class _Step:
    """One submission, settled by one writer under one grant of the lock."""

    q: QueueKeys
    event: Event
    lock: Lock
    retention: float
    id: str = field(init=False)  # the intent id (a stray one without a usable id: seq-<n>)
    item: str = field(init=False)  # the intent's record
    read_keys: list[str] = field(init=False)  # what applying it reads
    carried: JSON = field(init=False)  # the intent, if the event carries it
    place: int = field(init=False)  # what it is ordered by in its batch

    def __post_init__(self) -> None:
        try:
            intent_id = room_keys.check_name(_field(self.event, "id"), "intent id")
        except BadRequest:
            intent_id = f"seq-{self.event.seq}"
        found = _field(self.event, "keys")
        keys = [k for k in found if isinstance(k, str)] if isinstance(found, list) else []
        item = self.q.item(intent_id)
        carried = _field(self.event, "intent")
        place = _field(self.event, "place")
        if isinstance(place, bool) or not isinstance(place, int) or place > self.event.seq:
            place = self.event.seq  # no place of an earlier intent: its own
        object.__setattr__(self, "id", intent_id)
        object.__setattr__(self, "item", item)
        object.__setattr__(self, "carried", carried if isinstance(carried, dict) else None)
        object.__setattr__(self, "place", place)
        # an intent the event carries needs no read of its record: the cursor's compare
        # alone makes it applied once (a submission is appended once per id)
        own = [self.q.cursor] if self.carried is not None else [self.q.cursor, item]
        object.__setattr__(self, "read_keys", [*own, *keys])

    def change(
        self,
        view: View,
        writes: list[Write],
        kind: str,
        *,
        appends: Sequence[Append] = (),
        stats: dict[str, Any] | None = None,
        reason: JSON = None,
    ) -> Change:
        """``writes`` plus the cursor's advance, under the lock's fence, with the
        ``wq.settled`` event of this one outcome (``kind``, ``reason``)."""
        cursor = view.get(self.q.cursor) or {"seq": 0}
        moved = {**cursor, **(stats or {}), "seq": self.event.seq, "at": view.now}
        told = settled_event(self.lock, self.q, [self.outcome(kind, reason)])
        return Change(
            writes=[*writes, Put(self.q.cursor, moved)],
            appends=[*appends, told],
            requires=[self.lock.guard()],
            result={"status": kind, "at": view.now},
        )

    def outcome(self, status: str, reason: JSON = None) -> list[JSON]:
        """Its entry in a ``wq.settled`` event."""
        return [self.id, status, self.event.seq, self.place, reason]

    def consumed(self, view: View) -> bool:
        return int((view.get(self.q.cursor) or {"seq": 0})["seq"]) >= self.event.seq

    def queued_item(self, state: View) -> JSON:
        """The intent's queued record: the one the event carries, or the one written."""
        if self.carried is None:
            return state.get(self.item)
        item = {"id": self.id, "status": QUEUED, "intent": self.carried}
        digest = _field(self.event, "digest")  # an id named by the submitter: kept, to
        return item if digest is None else {**item, "digest": digest}  # tell a re-use

    def settle(self, now: float, item: dict[str, Any], status: str, reason: JSON) -> list[Write]:
        kept = {k: v for k, v in item.items() if k != "intent"}  # settled: not needed again
        seq = self.event.seq
        settled = {**kept, "status": status, "reason": reason, "seq": seq, "place": self.place}
        return [
            Put(self.item, {**settled, "at": now}, ttl=self.retention),
            SetRemove(self.q.queued, self.id),
        ]


def settled_event(lock: Lock, q: QueueKeys, outcomes: list[list[JSON]]) -> Append:
    """The one event settling a batch: its outcomes, ``[id, status, seq, place, reason]``
    each, the rejected and skipped ones first, then the applied ones, each part in the
    batch's order; and the writer that settled them, with its fence."""
    data = {"queue": q.name, "by": lock.owner, "fence": lock.fence, "outcomes": outcomes}
    return Append(SETTLED, data, lock.owner)


class Poison(Exception):
    """The first intent of a batch cannot be applied (``error`` says why): the writer
    applies it alone, counting failures towards the dead letters."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _Running(View):
    """The batch's running state: the snapshot as left by the intents applied so far
    (``writes``: the batch's last write per key, in order)."""

    __slots__ = ("writes",)

    def __init__(self, view: View) -> None:
        super().__init__(view._snapshot, view._keys)
        self.writes: dict[str, Put | Delete] = {}

    def record(self, key: str) -> Record | None:
        if key not in self.writes:
            return super().record(key)
        w = self.writes[key]
        return None if isinstance(w, Delete) else Record(key, w.value, 0)

    def ttl(self, key: str) -> float | None:
        """The TTL a rewrite of ``key`` keeps (``None``: it has none)."""
        if key in self.writes:
            w = self.writes[key]
            return w.ttl if isinstance(w, Put) else None
        record = super().record(key)
        if record is None or record.expires_at is None:
            return None
        return max(0.001, record.expires_at - self.now)


@dataclass(slots=True)
class _Batch:
    """What the intents settled so far in one batch write; ``ops`` and ``size``
    bound it."""

    state: _Running
    sets: dict[tuple[str, str], Write]
    appends: list[Append]  # the applied intents' own appends, in order
    told_first: list[list[JSON]]  # the outcomes of the rejected (and skipped) intents
    told: list[list[JSON]]  # the outcomes of the applied intents
    settled: list[dict[str, Any]]
    ops: int
    size: int
    last: _Step | None = None
    taken: int = 0  # steps taken (in the batch's order), settled by it or before
    seen: list[_Step] = field(default_factory=list)  # the steps it settles
    whole: bool = False  # all the steps it was given, in their place order

    def fits(self, writes: int, appends: int, size: int, limit: _Limit) -> bool:
        first = not self.settled and self.last is None
        written = len(self.state.writes) + len(self.sets) + 1  # + the cursor
        total = self.ops + written + len(self.appends) + 1 + writes + appends  # + wq.settled
        return first or (total <= limit.ops and self.size + size <= limit.size)

    def write(self, w: Write) -> None:
        if isinstance(w, SetAdd | SetRemove):
            self.sets.pop((w.name, w.member), None)  # the last op on a member wins
            self.sets[(w.name, w.member)] = w
        else:
            self.state.writes.pop(w.key, None)  # kept in the order of their last write
            self.state.writes[w.key] = w


@dataclass(frozen=True, slots=True)
class _Limit:
    count: int  # intents
    ops: int  # compares + writes + appends of the transact
    size: int  # bytes of intent payload


def _apply_batch(
    view: View,
    _: None,
    *,
    steps: Sequence[_Step],
    limit: _Limit,
    stats: Callable[[int], dict[str, Any]],
) -> Change:
    """Settle ``steps`` (consecutive submissions, in log order) in one change: each
    intent's predicates are evaluated on the state the intents before it left, its writes
    and outcome join the batch, and the cursor moves past the last one. The order is the
    steps' *place* (a retry's is the rejected intent's place, see ``_Step.place``), then
    their seq: the oldest waiter is evaluated first on each fresh state. If the whole
    batch does not fit ``limit`` in that order, or one of its intents cannot be applied,
    the batch is the longest prefix in log order that fits instead (raising ``Poison``
    when not even the first can be applied). The outcomes of rejected intents are
    appended first: their submitters, who must retry, learn it before the winners.
    ``result``: the steps taken and their outcomes; ``stats(settled)`` is merged into the
    cursor (the writer's throughput)."""
    view.need(k for step in steps for k in step.read_keys)
    steps = steps[: limit.count]
    ordered = sorted(steps, key=lambda step: (step.place, step.event.seq))
    batch = _settled(view, ordered, limit, whole=True) if ordered != steps else None
    batch = batch or _prefix(view, steps, limit)
    taken = len(steps) if batch.whole else batch.taken
    result = {"taken": taken, "settled": batch.settled, "at": view.now}
    if batch.last is None:
        return Change(result=result)
    last = max(batch.seen, key=lambda step: step.event.seq)  # the cursor's new place
    cursor = view.get(last.q.cursor) or {"seq": 0}
    moved = {**cursor, **stats(len(batch.settled)), "seq": last.event.seq, "at": view.now}
    writes = [*batch.state.writes.values(), *batch.sets.values(), Put(last.q.cursor, moved)]
    told = settled_event(last.lock, last.q, [*batch.told_first, *batch.told])
    appends = [*batch.appends, told]
    result["appends"] = len(appends)  # the writer tells them (rooms.follow.tell)
    return Change(writes, appends, [last.lock.guard()], result)


def _prefix(view: View, steps: Sequence[_Step], limit: _Limit) -> _Batch:
    batch = _settled(view, steps, limit, whole=False)
    if batch is None:
        raise AssertionError("a prefix batch is never refused")
    return batch


def _settled(view: View, steps: Sequence[_Step], limit: _Limit, *, whole: bool) -> _Batch | None:
    """The batch of ``steps`` in the given order. ``whole``: all of them or ``None``;
    otherwise the longest prefix that fits (``Poison`` if the first cannot be applied)."""
    batch = _Batch(_Running(view), {}, [], [], [], [], ops=len(view._keys) + 1, size=0)
    for step in steps:
        if step.consumed(view):
            batch.taken += 1  # another writer settled it already
            continue
        try:
            fits = _settle_one(batch, step, limit)
        except (BadRequest, KeyError, TypeError, ValueError, AttributeError) as exc:
            if whole:
                return None
            if batch.taken == 0:
                raise Poison(exc) from exc
            break
        if not fits:
            if whole:
                return None
            break
        batch.taken += 1
        batch.seen.append(step)
    batch.whole = whole
    return batch


def _apply_intent(view: View, _: None, *, step: _Step, stats: dict[str, Any]) -> Change:
    """One intent alone (a batch of one); ``result``: its status and the clock, ``None``
    when it was a duplicate or stray (skipped) or settled already."""
    limit = _Limit(1, 1 << 30, 1 << 62)
    change = _apply_batch(view, None, steps=[step], limit=limit, stats=lambda _: stats)
    settled = change.result["settled"]
    result = {"status": settled[0]["status"], "at": view.now} if settled else None
    return Change(change.writes, change.appends, change.requires, result)


def _settle_one(batch: _Batch, step: _Step, limit: _Limit) -> bool:
    """Add ``step``'s outcome to ``batch``; ``False`` (nothing added) if it does not fit."""
    state = batch.state
    item = step.queued_item(state)
    if not isinstance(item, dict) or item.get("status") != QUEUED:  # duplicate or stray
        if not batch.fits(0, 0, 0, limit):
            return False
        batch.told_first.append(step.outcome(SKIPPED))
        batch.last = step
        return True
    intent = decode_intent(item["intent"])
    failed = [str(p) for p in intent.when if not p.holds(state)] or None
    writes: list[Write] = []
    if failed is None:
        writes, failed = _effects(state, intent)
    status = REJECTED if failed else APPLIED
    appends = [] if failed else list(intent.appends)
    size = item.get("bytes")  # the submitter measured it
    if not isinstance(size, int):
        size = len(json.dumps(item["intent"], separators=(",", ":")))
    settle = step.settle(state.now, item, status, failed)
    if not batch.fits(len(writes) + len(settle), len(appends), size, limit):
        return False
    for w in [*writes, *settle]:
        batch.write(w)
    if failed:
        batch.told_first.append(step.outcome(status, failed))
    else:
        batch.appends += appends
        batch.told.append(step.outcome(status))
    batch.settled.append({"id": step.id, "status": status, "time": step.event.time})
    batch.size += size
    batch.last = step
    return True


def _effects(state: _Running, intent: Intent) -> tuple[list[Write], list[str] | None]:
    """The intent's writes then its increments, as writes of the running state, or
    (``[]``, why) when an increment meets a value that is not a number."""
    running = state.writes
    before: dict[str, Put | Delete | None] = {}  # what the batch held for the keys touched
    writes: list[Write] = list(intent.writes)
    failed: list[str] | None = None
    for w in intent.writes:
        if not isinstance(w, SetAdd | SetRemove):
            before.setdefault(w.key, running.get(w.key))
            running[w.key] = w
    try:
        for inc in increments_of(intent):
            put = Put(inc.key, _incremented(state.get(inc.key), inc), state.ttl(inc.key))
            before.setdefault(inc.key, running.get(inc.key))
            running[inc.key] = put
            writes.append(put)
    except _NotANumber as exc:
        writes, failed = [], [str(exc)]
    for key, held in before.items():  # as it was: the batch adds them once the intent fits
        if held is None:
            del running[key]
        else:
            running[key] = held
    merged: dict[Any, Write] = {}
    for w in writes:
        target = (w.name, w.member) if isinstance(w, SetAdd | SetRemove) else w.key
        merged.pop(target, None)
        merged[target] = w
    return list(merged.values()), failed


class _NotANumber(Exception):
    pass


def _incremented(value: JSON, inc: Increment) -> JSON:
    """``value`` with ``inc`` added (0 and ``{}`` for what is absent)."""
    if inc.path is None:
        return _add(0 if value is None else value, inc)
    root = {} if value is None else value
    if not isinstance(root, dict):
        raise _NotANumber(f"{inc.key} is not an object")
    out = dict(root)
    node = out
    *parents, leaf = inc.path.split(".")
    for part in parents:
        child = node.get(part, {})
        if not isinstance(child, dict):
            raise _NotANumber(f"{inc} is not a number")
        node[part] = dict(child)
        node = node[part]
    node[leaf] = _add(node.get(leaf, 0), inc)
    return out


def _add(current: JSON, inc: Increment) -> int | float:
    if isinstance(current, bool) or not isinstance(current, int | float):
        raise _NotANumber(f"{inc} is not a number")
    total = current + inc.by
    if not math.isfinite(total):
        raise _NotANumber(f"{inc} would not be a finite number")
    return total


def _dead_letter(view: View, _: None, *, step: _Step, failures: int, error: Exception) -> Change:
    if step.consumed(view):
        return Change()
    item = step.queued_item(view) or {"id": step.id, "intent": None}
    reason = _error(error)
    letter = {"id": step.id, "seq": step.event.seq, "intent": item.get("intent")}
    writes = [
        *step.settle(view.now, item, DEAD, reason),
        Put(step.q.dead(step.id), {**letter, "reason": reason, "failures": failures}),
    ]
    return step.change(view, writes, DEAD, reason=reason)


def _count_failure(view: View, _: None, *, step: _Step, error: Exception) -> Change:
    item = view.get(step.item)
    if item is None and step.carried is not None and not step.consumed(view):
        item = {"id": step.id, "status": QUEUED}  # the count's record, once it fails
    if item is None or item.get("status") != QUEUED:
        raise BadRequest("nothing to count the failure on")
    failures = int(item.get("failures", 0)) + 1
    data = {"queue": step.q.name, "id": step.id, "failures": failures, "error": _error(error)}
    return Change(
        writes=[Put(step.item, {**item, "failures": failures, "last_error": _error(error)})],
        appends=[Append("wq.failed", data, step.lock.owner)],
        requires=[step.lock.guard()],
        result=failures,
    )


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)[:1000]}
