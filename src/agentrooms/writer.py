"""The designated writer: agents submit conditional intents to a room's queue;
one writer at a time applies them, in order, each as one conditional write.

Layout of queue ``<q>`` in the room (default ``main``)::

    event wq.submitted {queue, id, keys}  the queue's order: the room log's gapless seq,
                                          assigned by the store, so submitting is one
                                          append that never conflicts with another
    wq/<q>/i/<id>      the intent as submitted, then its outcome: queued -> applied |
                       rejected (a predicate did not hold) | dead (poison)
    wq/<q>/cursor      the writer's position: seq of the last submission consumed, and
                       its recent throughput (read by submitters told to back off)
    wq/<q>/dead/<id>   dead letters: the intent, why it failed, how often
    set wq:<q>:queued  ids submitted and not settled: the depth, O(1)
    lock writer.<q>    the writer's fenced lock (rooms.locks)

Rules:

* **In order, exactly once.** The intent's writes, its outcome, the removal from the
  queued set and the cursor's advance to its seq commit in *one* transact, which also
  compares the cursor's version: an intent is applied exactly when the cursor passes it,
  whoever the writer is and however often it restarts.
* **Fenced.** Every write of the writer carries ``lock.guard()``; a writer whose lock was
  taken over (``Locks.wait_acquire`` hands it to the standby once it expires) gets
  ``StaleFence`` and steps down.
* **Conditional intents.** Predicates (:class:`~agentrooms.commit.Where`) are evaluated
  on the snapshot the write is conditioned on. A predicate that fails is an *outcome*
  (``rejected``, with the failed predicates), never a crash.
* **Poison.** An intent whose application raises (it cannot be decoded, the store
  refuses its writes...) is retried; after ``max_failures`` it goes to the dead letters
  with its reason, and the queue moves on. A store outage is not counted against it.
* **Backpressure.** ``submit`` on a queue holding ``max_depth`` intents raises
  ``RateLimited`` with ``retry_after`` = the excess / the writer's recent throughput
  (depth is checked, then the append made: concurrent submitters can overshoot the limit
  by at most their number).
* **Observable.** Every outcome is a ``wq.<applied|rejected|dead|skipped>`` event naming
  the writer and its fence; ``wq.failed`` counts each exception of a poison intent.
* **Retention.** Settled intents are kept ``retention`` seconds (a re-submitted id is
  recognised meanwhile). Never trim the room log past :meth:`IntentQueue.position`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from agentrooms.commit import Change, Intent, View, Where
from agentrooms.errors import (
    BadRequest,
    IdempotencyMismatch,
    InvalidTransition,
    LockHeld,
    NotFound,
    RateLimited,
    StaleFence,
    StoreUnavailable,
    VersionConflict,
)
from agentrooms.metrics import WriterMetrics, default_writer_metrics
from agentrooms.rooms import keys as room_keys
from agentrooms.rooms.follow import follow
from agentrooms.rooms.locks import Lock, Locks
from agentrooms.rooms.room import Room
from agentrooms.rooms.scope import Scope
from agentrooms.store.base import (
    JSON,
    Absent,
    Append,
    Delete,
    Event,
    Present,
    Put,
    SetAdd,
    SetRemove,
    Write,
    prepare_transact,
)

__all__ = [
    "DeadLetter",
    "IntentOutcome",
    "IntentQueue",
    "Writer",
    "WriterMetrics",
    "decode_intent",
    "encode_intent",
]

QUEUED, APPLIED, REJECTED, DEAD = "queued", "applied", "rejected", "dead"
SUBMITTED = "wq.submitted"
RESERVED = ("wq/", "wq:", "_ar/", "lock/", "lockfence/", "lockq/", room_keys.META)
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
    def queued(self) -> str:
        return f"wq:{self.name}:queued"

    @property
    def lock(self) -> str:
        return f"writer.{self.name}"

    def item(self, intent_id: str) -> str:
        return f"wq/{self.name}/i/{intent_id}"

    def dead(self, intent_id: str = "") -> str:
        return f"wq/{self.name}/dead/{intent_id}"


# ------------------------------------------------------------------------------ codec


def encode_intent(intent: Intent) -> dict[str, Any]:
    """The JSON form of an intent (what is queued and sent over the wire)."""
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
    return {
        "when": [{"key": p.key, "path": p.path, "op": p.op, "value": p.value} for p in intent.when],
        "writes": writes,
        "appends": [{"type": a.type, "data": a.data} for a in intent.appends],
    }


def decode_intent(data: JSON) -> Intent:
    """The intent from its JSON form; ``BadRequest`` naming what is wrong with it
    (including writes to the keys the queue, the locks and the room reserve)."""
    try:
        when = [
            Where(p["key"], p.get("path"), p.get("op", "exists"), p.get("value"))
            for p in data["when"]
        ]
        writes = [_decode_write(w) for w in data["writes"]]
        appends = [Append(a["type"], a.get("data")) for a in data["appends"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise BadRequest(f"malformed intent: {type(exc).__name__}: {exc}") from exc
    for w in writes:
        target = w.name if isinstance(w, SetAdd | SetRemove) else w.key
        if (
            not isinstance(target, str)
            or target == room_keys.ARCHIVED
            or target.startswith(RESERVED)
        ):
            raise BadRequest(f"an intent may not write the reserved key {target!r}")
    return Intent(when, writes, appends)


def _decode_write(w: dict[str, Any]) -> Write:
    op = w["op"]
    if op == "put":
        return Put(w["key"], w.get("value"), w.get("ttl"))
    if op == "delete":
        return Delete(w["key"])
    if op in ("set_add", "set_remove"):
        return (SetAdd if op == "set_add" else SetRemove)(w["name"], w["member"])
    raise BadRequest(f"unknown write op {op!r}")


def _digest(payload: JSON) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------- outcomes


@dataclass(frozen=True, slots=True)
class IntentOutcome:
    id: str
    status: str  # queued | applied | rejected | dead
    reason: JSON = None  # the failed predicates, or why it went to the dead letters
    seq: int | None = None  # its place in the queue (the submission's log seq), once settled

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
    return IntentOutcome(intent_id, item["status"], item.get("reason"), item.get("seq"))


# ------------------------------------------------------------------------------ queue


def _scope_of(room: Room | Scope) -> Scope:
    return room.scope if isinstance(room, Room) else room


class IntentQueue:
    """The submitting side of a room's queue ``name``."""

    def __init__(self, room: Room | Scope, name: str = "main", *, max_depth: int = 1000) -> None:
        self.scope = _scope_of(room)
        self.keys = QueueKeys(room_keys.check_name(name, "queue name"))
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise BadRequest("max_depth must be a positive integer")
        self.max_depth = max_depth

    async def submit(self, intent: Intent | JSON, *, intent_id: str | None = None) -> str:
        """Queue ``intent`` (an :class:`Intent` or its JSON form); returns its id.

        One append, O(1), ordered by the store. Idempotent by ``intent_id``: the same
        intent again returns the id and queues nothing; another one under that id raises
        ``IdempotencyMismatch``. ``RateLimited`` when the queue is full; ``BadRequest``
        for an intent the store would refuse.
        """
        intent_id = room_keys.check_name(intent_id or uuid.uuid4().hex, "intent id")
        payload = encode_intent(intent) if isinstance(intent, Intent) else intent
        decoded = decode_intent(payload)
        prepare_transact(
            [Present(p.key) for p in decoded.when],
            decoded.writes,
            decoded.appends,
            self.scope.store.limits,
        )
        depth = await self.depth()
        if depth >= self.max_depth:
            raise RateLimited(
                await self._retry_after(depth), f"queue {self.keys.name!r} holds {depth} intents"
            )
        item = {
            "id": intent_id,
            "status": QUEUED,
            "intent": payload,
            "digest": _digest(payload),
            "failures": 0,
        }
        data = {
            "queue": self.keys.name,
            "id": intent_id,
            "keys": sorted({p.key for p in decoded.when}),
        }
        key = self.keys.item(intent_id)
        try:
            await self.scope.transact(
                [Absent(key)],
                [Put(key, item), SetAdd(self.keys.queued, intent_id)],
                [Append(SUBMITTED, data)],
            )
        except VersionConflict as exc:
            if key not in exc.conflicts:
                raise
            existing = (await self.scope.read([key])).value(key)
            if existing is not None and existing.get("digest") != item["digest"]:
                raise IdempotencyMismatch(
                    f"intent {intent_id!r} was submitted with another payload"
                ) from exc
        return intent_id

    async def depth(self) -> int:
        return await self.scope.store.set_size(self.scope.room, self.keys.queued)

    async def outcome(self, intent_id: str) -> IntentOutcome:
        key = self.keys.item(room_keys.check_name(intent_id, "intent id"))
        item = (await self.scope.read([key])).value(key)
        if item is None:
            raise NotFound(f"no intent {intent_id!r} in queue {self.keys.name!r}")
        return _outcome(intent_id, item)

    async def wait(self, intent_id: str, timeout: float = 30.0) -> IntentOutcome:
        """The intent's outcome once it is settled, woken by the ``wq.<outcome>`` event
        that settles it (through the process's one follower of the room's log, so many
        submitters waiting cost one log read per batch of events, not one read each);
        ``TimeoutError`` if it is still queued after ``timeout`` seconds."""
        settling = {f"wq.{kind}" for kind in (APPLIED, REJECTED, DEAD)}

        def settles(event: Event) -> bool:
            data = event.data
            return (
                event.type in settling
                and isinstance(data, dict)
                and data.get("queue") == self.keys.name
                and data.get("id") == intent_id
            )

        deadline = time.monotonic() + timeout
        async with follow(self.scope.store, self.scope.room, settles) as woken:
            while True:  # subscribed first: a settlement before it shows in the read
                outcome = await self.outcome(intent_id)
                remaining = deadline - time.monotonic()
                if outcome.settled:
                    return outcome
                if remaining <= 0:
                    raise TimeoutError(f"intent {intent_id!r} still queued after {timeout}s")
                if await woken.wait(min(remaining, 3600.0)):
                    woken.take()

    async def position(self) -> int:
        """The seq of the last submission the writer consumed: trim the log only below it."""
        cursor = (await self.scope.read([self.keys.cursor])).value(self.keys.cursor)
        return 0 if cursor is None else int(cursor["seq"])

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        page = await self.scope.store.scan(self.scope.room, self.keys.dead(), None, limit)
        return [DeadLetter(**r.value) for r in page.records]

    async def _retry_after(self, depth: int) -> float:
        """How long until the writer, at its recent pace, has made room: the excess over
        the limit divided by its throughput (published with the cursor). Unknown or stale
        (no intent settled for ``STALE_RATE`` s): ``DEFAULT_RETRY_AFTER``."""
        snap = await self.scope.read([self.keys.cursor])
        cursor = snap.value(self.keys.cursor) or {}
        rate = float(cursor.get("rate") or 0.0)
        if rate <= 0 or snap.now - float(cursor.get("at", 0.0)) > STALE_RATE:
            return DEFAULT_RETRY_AFTER
        return min(60.0, max(0.01, (depth - self.max_depth + 1) / rate))


# ----------------------------------------------------------------------------- writer


class _Throughput:
    """Intents per second over the last ``size`` applications (monotonic clock)."""

    def __init__(self, size: int = 64) -> None:
        self._times: collections.deque[float] = collections.deque(maxlen=size)

    def tick(self) -> None:
        self._times.append(time.monotonic())

    def rate(self) -> float:
        if len(self._times) < 2:
            return 0.0
        span = self._times[-1] - self._times[0]
        return (len(self._times) - 1) / span if span > 0 else 0.0


class Writer:
    """The applying side: ``await Writer(room, owner="w1").run(stop)`` serves the queue
    while it holds the writer lock and waits in line for it otherwise."""

    def __init__(
        self,
        room: Room | Scope,
        name: str = "main",
        *,
        owner: str,
        lock_ttl: float = 10.0,
        max_failures: int = 3,
        retry_delay: float = 0.05,
        batch: int = 100,
        idle: float = 5.0,
        retention: float = 24 * 3600.0,
        metrics: WriterMetrics | None = None,
    ) -> None:
        base = _scope_of(room)
        self.metrics = metrics or default_writer_metrics()
        self.scope = Scope(base.store, base.room, policy=base.policy, metrics=self.metrics.commit)
        self.keys = QueueKeys(room_keys.check_name(name, "queue name"))
        self.owner = room_keys.check_name(owner, "writer owner")
        self.locks = Locks(self.scope)
        self.lock_ttl, self.max_failures, self.retry_delay = lock_ttl, max_failures, retry_delay
        self.batch, self.idle, self.retention = batch, idle, retention
        self._rate = _Throughput()
        self._lost: Lock | None = None

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Queue for the lock, serve while holding it, queue again when deposed; release
        it when ``stop`` is set. (A cancelled or killed writer just lets it expire.)"""
        while stop is None or not stop.is_set():
            try:
                lock = await self.locks.wait_acquire(
                    self.keys.lock, self.owner, ttl=self.lock_ttl, timeout=self.lock_ttl * 3
                )
            except LockHeld:
                continue
            except StoreUnavailable:
                await asyncio.sleep(OUTAGE_PAUSE)
                continue
            try:
                await self.serve(lock, stop)
            except StaleFence:
                continue  # deposed: another writer holds the queue now
            with contextlib.suppress(StoreUnavailable):
                await self.locks.release(lock)

    async def serve(self, lock: Lock, stop: asyncio.Event | None = None) -> None:
        """Apply intents in order while ``lock`` is ours and ``stop`` is not set, waking
        on the room's log; ``StaleFence`` once the lock is not ours any more."""
        keeper = asyncio.create_task(self._keep(lock))
        try:
            position = await self.position()
            while stop is None or not stop.is_set():
                try:
                    position, seen, _ = await self._consume(lock, position)
                    if not seen:
                        await self._wait(position, stop)
                except StoreUnavailable:  # re-reading settled submissions is harmless
                    self._check()
                    await asyncio.sleep(OUTAGE_PAUSE)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            self.metrics.forget(self.scope.room, self.keys.name)

    async def apply_pending(self, lock: Lock) -> int:
        """Apply every intent queued now under ``lock`` (no waiting); how many settled."""
        position, total = await self.position(), 0
        while True:
            position, seen, settled = await self._consume(lock, position)
            total += settled
            if not seen:
                return total

    async def position(self) -> int:
        cursor = (await self.scope.read([self.keys.cursor])).value(self.keys.cursor)
        return 0 if cursor is None else int(cursor["seq"])

    async def _consume(self, lock: Lock, position: int) -> tuple[int, int, int]:
        """Settle the submissions among the next batch of log events; returns the new
        read position, how many events were read and how many intents settled."""
        events = await self.scope.store.read_log(self.scope.room, position, self.batch)
        settled = 0
        for event in events:
            if event.type == SUBMITTED and _field(event, "queue") == self.keys.name:
                settled += await self._apply(_Step(self.keys, event, lock, self.retention))
            position = event.seq
        depth = await self.scope.store.set_size(self.scope.room, self.keys.queued)
        self.metrics.depth(self.scope.room, self.keys.name, depth)
        return position, len(events), settled

    async def _wait(self, position: int, stop: asyncio.Event | None) -> None:
        """Until the log moves past ``position``, ``stop`` is set, or it is time to look
        at the lock again."""
        self._check()
        timeout = min(self.idle, self.lock_ttl / 3)
        watch = asyncio.ensure_future(self.scope.store.watch(self.scope.room, position, timeout))
        waiting = {watch} if stop is None else {watch, asyncio.ensure_future(stop.wait())}
        done, pending = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for task in done:
            task.result()

    async def _apply(self, step: _Step) -> int:
        """Settle one submission: applied / rejected, or after ``max_failures``
        exceptions dead. Returns 1 if this call settled it, 0 if it already was."""
        failures = 0
        while True:
            self._check()
            started = time.monotonic()
            apply = partial(_apply_intent, step=step, stats={"rate": self._rate.rate()})
            try:
                result = await self.scope.commit(apply, None, step.read_keys)
            except (StaleFence, InvalidTransition, NotFound):
                raise  # deposed, or the room was archived or deleted
            except StoreUnavailable:
                await asyncio.sleep(self.retry_delay)  # not the intent's fault: not counted
                continue
            except Exception as exc:
                failures = await self._failed(step, exc, failures + 1)
                if failures < self.max_failures:
                    await asyncio.sleep(self.retry_delay * failures)
                    continue
                bury = partial(_dead_letter, step=step, failures=failures, error=exc)
                result = await self.scope.commit(bury, None, [self.keys.cursor, step.item])
            if result.result is None:
                return 0
            self._rate.tick()
            wait = result.result["at"] - step.event.time
            self.metrics.settled(result.result["status"], time.monotonic() - started, wait)
            return 1

    async def _failed(self, step: _Step, exc: Exception, local: int) -> int:
        """Count one failure on the intent's record (a restarted writer continues the
        count); returns the count."""
        try:
            result = await self.scope.commit(
                partial(_count_failure, step=step, error=exc), None, [step.item]
            )
        except (StaleFence, InvalidTransition, NotFound):
            raise
        except Exception:
            return local  # nothing to count it on (a stray submission): count here
        return max(local, int(result.result))

    def _check(self) -> None:
        """``StaleFence`` once the keeper found the lock lost."""
        if self._lost is not None:
            lost, self._lost = self._lost, None
            raise StaleFence(room_keys.lock_fence(lost.name), lost.fence, None)

    async def _keep(self, lock: Lock) -> None:
        while True:
            await asyncio.sleep(self.lock_ttl / 3)
            try:
                lock = await self.locks.extend(lock)
            except StoreUnavailable:
                continue
            except (StaleFence, InvalidTransition, NotFound):
                self._lost = lock
                return


# ------------------------------------------------------------------ transitions (pure)


def _field(event: Event, name: str) -> Any:
    return event.data.get(name) if isinstance(event.data, dict) else None


@dataclass(frozen=True, slots=True)
class _Step:
    """One submission, settled by one writer under one grant of the lock."""

    q: QueueKeys
    event: Event
    lock: Lock
    retention: float

    @property
    def id(self) -> str:
        """The intent id (a stray submission without a usable one gets ``seq-<n>``)."""
        try:
            return room_keys.check_name(_field(self.event, "id"), "intent id")
        except BadRequest:
            return f"seq-{self.event.seq}"

    @property
    def item(self) -> str:
        return self.q.item(self.id)

    @property
    def read_keys(self) -> list[str]:
        found = _field(self.event, "keys")
        keys = [k for k in found if isinstance(k, str)] if isinstance(found, list) else []
        return [self.q.cursor, self.item, *keys]

    def change(
        self,
        view: View,
        writes: list[Write],
        kind: str,
        *,
        appends: Sequence[Append] = (),
        stats: dict[str, Any] | None = None,
        **data: JSON,
    ) -> Change:
        """``writes`` plus the cursor's advance, under the lock's fence, with a
        ``wq.<kind>`` event naming the writer and its fence."""
        cursor = view.get(self.q.cursor) or {"seq": 0}
        moved = {**cursor, **(stats or {}), "seq": self.event.seq, "at": view.now}
        head = {"queue": self.q.name, "id": self.id, "seq": self.event.seq}
        by = {"by": self.lock.owner, "fence": self.lock.fence}
        return Change(
            writes=[*writes, Put(self.q.cursor, moved)],
            appends=[*appends, Append(f"wq.{kind}", {**head, **data, **by})],
            requires=[self.lock.guard()],
            result={"status": kind, "at": view.now},
        )

    def consumed(self, view: View) -> bool:
        return int((view.get(self.q.cursor) or {"seq": 0})["seq"]) >= self.event.seq

    def settle(self, view: View, item: dict[str, Any], status: str, reason: JSON) -> list[Write]:
        settled = {**item, "status": status, "reason": reason, "seq": self.event.seq}
        return [
            Put(self.item, {**settled, "at": view.now}, ttl=self.retention),
            SetRemove(self.q.queued, self.id),
        ]


def _apply_intent(view: View, _: None, *, step: _Step, stats: dict[str, Any]) -> Change:
    if step.consumed(view):
        return Change()  # another writer settled it already
    item = view.get(step.item)
    if item is None or item.get("status") != QUEUED:  # a duplicate or stray submission
        skipped = step.change(view, [], "skipped", stats=stats)
        return Change(skipped.writes, skipped.appends, skipped.requires, None)
    intent = decode_intent(item["intent"])
    failed = [str(p) for p in intent.when if not p.holds(view)] or None
    status = REJECTED if failed else APPLIED
    writes = [*([] if failed else intent.writes), *step.settle(view, item, status, failed)]
    appends = [] if failed else list(intent.appends)
    return step.change(view, writes, status, reason=failed, stats=stats, appends=appends)


def _dead_letter(view: View, _: None, *, step: _Step, failures: int, error: Exception) -> Change:
    if step.consumed(view):
        return Change()
    item = view.get(step.item) or {"id": step.id, "intent": None}
    reason = _error(error)
    letter = {"id": step.id, "seq": step.event.seq, "intent": item.get("intent")}
    writes = [
        *step.settle(view, item, DEAD, reason),
        Put(step.q.dead(step.id), {**letter, "reason": reason, "failures": failures}),
    ]
    return step.change(view, writes, DEAD, reason=reason)


def _count_failure(view: View, _: None, *, step: _Step, error: Exception) -> Change:
    item = view.get(step.item)
    if item is None or item.get("status") != QUEUED:
        raise BadRequest("nothing to count the failure on")
    failures = int(item.get("failures", 0)) + 1
    data = {"queue": step.q.name, "id": step.id, "failures": failures, "error": _error(error)}
    return Change(
        writes=[Put(step.item, {**item, "failures": failures, "last_error": _error(error)})],
        appends=[Append("wq.failed", data)],
        requires=[step.lock.guard()],
        result=failures,
    )


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)[:1000]}
