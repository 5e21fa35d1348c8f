"""The submitting side of a queue: :class:`IntentQueue` (submit, wait, dead letters)."""

from __future__ import annotations

import itertools
import os
import time
import uuid

from agentrooms.commit import Intent
from agentrooms.errors import (
    BadRequest,
    IdempotencyMismatch,
    NotFound,
    RateLimited,
    VersionConflict,
)
from agentrooms.rooms import keys as room_keys
from agentrooms.rooms.follow import Subscription, follow, route_many
from agentrooms.rooms.room import Room
from agentrooms.rooms.scope import Scope
from agentrooms.store.types import (
    JSON,
    Absent,
    Append,
    Event,
    Present,
    Put,
    SetAdd,
)
from agentrooms.store.validation import prepare_transact
from agentrooms.writer import groups
from agentrooms.writer.model import (
    APPLIED,
    DEAD,
    DEFAULT_RETRY_AFTER,
    QUEUED,
    REJECTED,
    SETTLED,
    STALE_RATE,
    SUBMITTED,
    DeadLetter,
    IntentOutcome,
    QueueKeys,
    _digest,
    _outcome,
    check_targets,
    decode_intent,
    encode_intent,
    increments_of,
)

__all__ = ["IntentQueue"]


def _scope_of(room: Room | Scope) -> Scope:
    return room.scope if isinstance(room, Room) else room


DEPTH_EVERY = 0.1  # seconds a depth reading under half the limit is trusted
GENERATED = "q-"  # the prefix of the ids submit generates


def _new_prefix() -> None:
    """A generated id is this process's random prefix (96 bits, drawn again in a forked
    child) and a counter: unique without a random draw per id."""
    global _prefix, _counter
    _prefix, _counter = f"{GENERATED}{uuid.uuid4().hex[:24]}-", itertools.count()


_prefix, _counter = "", itertools.count()
_new_prefix()
os.register_at_fork(after_in_child=_new_prefix)


SETTLING = (APPLIED, REJECTED, DEAD)  # the statuses a waiter is told


def _outcomes(event: Event) -> dict[str, IntentOutcome]:
    """The outcomes a ``wq.settled`` event tells, by intent id (the writer wrote the same
    on each intent's record); remembered for the last event, since every waiter of its
    batch asks in turn."""
    global _last
    last = _last  # one read: another thread's event loop may replace it
    if last[0] is event:
        return last[1]
    found: dict[str, IntentOutcome] = {}
    data = event.data
    entries = data.get("outcomes") if isinstance(data, dict) else None
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, list) or len(entry) != 5:
            continue
        intent_id, status, seq, place, reason = entry
        if isinstance(intent_id, str) and status in SETTLING:
            seq = seq if isinstance(seq, int) else None
            place = place if isinstance(place, int) else seq
            found[intent_id] = IntentOutcome(intent_id, status, reason, seq, place)
    _last = (event, found)
    return found


_last: tuple[Event | None, dict[str, IntentOutcome]] = (None, {})


def _settles(event: Event) -> list[tuple[str, str, str]]:
    """The routes of a ``wq.settled`` event: its queue and each intent id it settles,
    in the event's order (the rejected first)."""
    queue = event.data.get("queue") if isinstance(event.data, dict) else None
    if not isinstance(queue, str):
        return []
    return [("wq", queue, intent_id) for intent_id in _outcomes(event)]


route_many(SETTLED, _settles)


class IntentQueue:
    """The submitting side of a room's queue ``name``."""

    def __init__(self, room: Room | Scope, name: str = "main", *, max_depth: int = 1000) -> None:
        self.scope = _scope_of(room)
        self.keys = QueueKeys(room_keys.check_name(name, "queue name"))
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise BadRequest("max_depth must be a positive integer")
        self.max_depth = max_depth
        self._depth, self._since, self._read_at = 0, 0, -DEPTH_EVERY  # the last depth read
        self._marked = False  # this object wrote the queue's marker record

    async def submit(
        self,
        intent: Intent | JSON,
        *,
        intent_id: str | None = None,
        author: str | None = None,
        retry_of: IntentOutcome | None = None,
    ) -> str:
        """Queue ``intent`` (an :class:`Intent`, a :class:`QueuedIntent` with increments,
        or the JSON form of either); returns its id. ``author``: the agent submitting, the
        author of the ``wq.submitted`` event. ``retry_of``: the rejected outcome this
        intent retries; it keeps that outcome's place in the batch order (see
        :mod:`agentrooms.writer`).

        One transact, O(1), ordered by the store, never conflicting with another
        submission, guarded by the room's existence and archive state (``NotFound``,
        ``RoomArchived``): without ``intent_id`` it is the ``wq.submitted`` append
        (carrying the intent) and the queued set's add (this object's first submission
        also writes the queue's marker record).
        With ``intent_id`` it also writes the intent's
        record, so it is idempotent: the same intent again returns the id and queues
        nothing; another one under that id raises ``IdempotencyMismatch``.
        ``RateLimited`` when the queue is full; ``BadRequest`` for an intent the store
        would refuse, or a ``retry_of`` that is not a settled outcome.
        """
        name, named = self._named(intent_id)
        await self._submit(intent, name, named, author, retry_of)
        return name

    async def submit_and_wait(
        self,
        intent: Intent | JSON,
        *,
        intent_id: str | None = None,
        timeout: float = 30.0,
        author: str | None = None,
        retry_of: IntentOutcome | None = None,
    ) -> IntentOutcome:
        """:meth:`submit`, then :meth:`wait`, one read cheaper: the wait is subscribed
        before the submission, so the settling event cannot be missed and the outcome is
        not read (unless the id was submitted before)."""
        name, named = self._named(intent_id)
        routes = (("wq", self.keys.name, name),)
        async with follow(self.scope.store, self.scope.room, routes=routes) as woken:
            fresh = await self._submit(intent, name, named, author, retry_of)
            queued = IntentOutcome(name, QUEUED)
            start = queued if fresh else await self.outcome(name)
            return await self._until_settled(woken, start, time.monotonic() + timeout)

    @staticmethod
    def _named(intent_id: str | None) -> tuple[str, bool]:
        """The id to submit under, and whether the caller named it."""
        if intent_id is None:
            return f"{_prefix}{next(_counter):x}", False
        return room_keys.check_name(intent_id, "intent id"), True

    async def _submit(
        self,
        intent: Intent | JSON,
        intent_id: str,
        named: bool,
        author: str | None,
        retry_of: IntentOutcome | None,
    ) -> bool:
        """Queue it under ``intent_id``; ``False`` if that (caller-named) id was queued
        already."""
        if isinstance(intent, Intent):
            payload, decoded = encode_intent(intent), intent
            check_targets(intent)
        else:
            payload, decoded = intent, decode_intent(intent)
        read = [*(p.key for p in decoded.when), *(i.key for i in increments_of(decoded))]
        prepare_transact(
            [Present(k) for k in read], decoded.writes, decoded.appends, self.scope.store.limits
        )
        data: dict[str, JSON] = {
            "queue": self.keys.name,
            "id": intent_id,
            "keys": sorted(set(read)),  # what the writer reads to apply it
            "intent": payload,  # so the writer reads no record to apply it
        }
        if retry_of is not None:
            if not isinstance(retry_of, IntentOutcome) or retry_of.place is None:
                raise BadRequest("retry_of is the settled outcome of an earlier intent")
            data["place"] = retry_of.place
        await self._check_depth()
        submitted = Append(SUBMITTED, data, author)
        if not named:  # the first one marks the queue in the room
            marker = None if self._marked else Put(self.keys.marker, {"queue": self.keys.name})
            one = groups.member(SetAdd(self.keys.queued, intent_id), submitted, marker)
            await groups.send(self.scope, self.keys.name, one)
            self._marked = True
            self._since += 1
            return True
        digest, size = _digest(payload)
        data["digest"] = digest  # the settled record keeps it, to tell a re-used id
        submitted = Append(SUBMITTED, data, author)
        item = {
            "id": intent_id,
            "status": QUEUED,
            "intent": payload,
            "digest": digest,
            "bytes": size,
            "failures": 0,
        }
        key = self.keys.item(intent_id)
        try:
            await self.scope.transact(
                [Absent(key)], [Put(key, item), SetAdd(self.keys.queued, intent_id)], [submitted]
            )
        except VersionConflict as exc:
            if key not in exc.conflicts:
                raise
            existing = (await self.scope.read([key])).value(key)
            if existing is not None and existing.get("digest") != item["digest"]:
                raise IdempotencyMismatch(
                    f"intent {intent_id!r} was submitted with another payload"
                ) from exc
            return False
        self._since += 1
        return True

    async def _check_depth(self) -> None:
        """``RateLimited`` if the queue is full. The depth is read before a submission
        unless the last reading in this process (by any ``IntentQueue`` of this queue on
        a handle of the same store), plus this object's submissions since, is under half
        the limit and younger than ``DEPTH_EVERY`` seconds (so others' submissions within
        that time can take the queue over the limit)."""
        now = time.monotonic()
        readings = self.scope.store.session.shared.depths
        place = (self.scope.room, self.keys.name)
        depth, read_at = readings.get(place, (0, -DEPTH_EVERY))
        if read_at > self._read_at:  # another object read it since: start from that
            self._depth, self._since, self._read_at = depth, 0, read_at
        if self._depth + self._since < self.max_depth / 2 and now - self._read_at < DEPTH_EVERY:
            return
        self._read_at = now  # the submitters of this process meanwhile trust the last one
        readings[place] = (self._depth + self._since, now)
        depth = await self.depth()
        self._depth, self._since = depth, 0
        readings[place] = (depth, now)
        if depth >= self.max_depth:
            raise RateLimited(
                await self._retry_after(depth), f"queue {self.keys.name!r} holds {depth} intents"
            )

    async def depth(self) -> int:
        return await self.scope.store.set_size(self.scope.room, self.keys.queued)

    async def outcome(self, intent_id: str) -> IntentOutcome:
        """The intent's outcome as recorded: ``queued`` until the writer settled it.
        ``NotFound`` for an id the submitter named that was never queued (or whose settled
        record is past its retention); an id :meth:`submit` generated has no record until
        it is settled, so it reads as ``queued`` until then (and after its retention)."""
        key = self.keys.item(room_keys.check_name(intent_id, "intent id"))
        item = (await self.scope.read([key])).value(key)
        if item is None and intent_id.startswith(GENERATED):
            return IntentOutcome(intent_id, QUEUED)
        if item is None:
            raise NotFound(f"no intent {intent_id!r} in queue {self.keys.name!r}")
        return _outcome(intent_id, item)

    async def wait(self, intent_id: str, timeout: float = 30.0) -> IntentOutcome:
        """The intent's outcome once it is settled, read from the ``wq.settled`` event
        that settles it (routed to this waiter by the process's one follower of the
        room's log, so many submitters waiting cost one log read per batch of events,
        not one read each); ``TimeoutError`` if it is still queued after ``timeout``
        seconds."""
        deadline = time.monotonic() + timeout
        routes = (("wq", self.keys.name, intent_id),)
        async with follow(self.scope.store, self.scope.room, routes=routes) as woken:
            start = await self.outcome(intent_id)  # subscribed first: none is missed
            return await self._until_settled(woken, start, deadline)

    async def _until_settled(
        self, woken: Subscription, outcome: IntentOutcome, deadline: float
    ) -> IntentOutcome:
        while not outcome.settled:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"intent {outcome.id!r} still queued")
            if not await woken.wait(min(remaining, 3600.0)):
                continue
            events, resync = woken.take()
            told = [_outcomes(e).get(outcome.id) for e in events]
            outcome = next((o for o in told if o is not None), outcome)
            if resync and not outcome.settled:
                outcome = await self.outcome(outcome.id)
        return outcome

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
