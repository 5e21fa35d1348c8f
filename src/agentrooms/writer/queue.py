"""The submitting side of a queue: :class:`IntentQueue` (submit, wait, dead letters)."""

from __future__ import annotations

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
from agentrooms.rooms.follow import follow, route
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
from agentrooms.writer.model import (
    APPLIED,
    DEAD,
    DEFAULT_RETRY_AFTER,
    QUEUED,
    REJECTED,
    STALE_RATE,
    SUBMITTED,
    DeadLetter,
    IntentOutcome,
    QueueKeys,
    _digest,
    _outcome,
    decode_intent,
    encode_intent,
    increments_of,
)

__all__ = ["IntentQueue"]


def _scope_of(room: Room | Scope) -> Scope:
    return room.scope if isinstance(room, Room) else room


SETTLING = tuple(f"wq.{kind}" for kind in (APPLIED, REJECTED, DEAD))


def _settles(event: Event) -> tuple[str, str, str] | None:
    """The route of a settling event: its queue and intent id."""
    data = event.data
    if not isinstance(data, dict):
        return None
    queue, intent_id = data.get("queue"), data.get("id")
    if isinstance(queue, str) and isinstance(intent_id, str):
        return ("wq", queue, intent_id)
    return None


for _kind in SETTLING:
    route(_kind, _settles)


def _told(intent_id: str, event: Event) -> IntentOutcome:
    """The outcome a settling event tells (the writer wrote the same on the intent)."""
    data = event.data if isinstance(event.data, dict) else {}
    seq = data.get("seq")
    status = event.type.removeprefix("wq.")
    return IntentOutcome(
        intent_id, status, data.get("reason"), seq if isinstance(seq, int) else None
    )


class IntentQueue:
    """The submitting side of a room's queue ``name``."""

    def __init__(self, room: Room | Scope, name: str = "main", *, max_depth: int = 1000) -> None:
        self.scope = _scope_of(room)
        self.keys = QueueKeys(room_keys.check_name(name, "queue name"))
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise BadRequest("max_depth must be a positive integer")
        self.max_depth = max_depth

    async def submit(self, intent: Intent | JSON, *, intent_id: str | None = None) -> str:
        """Queue ``intent`` (an :class:`Intent`, a :class:`QueuedIntent` with increments,
        or the JSON form of either); returns its id.

        One append, O(1), ordered by the store. Idempotent by ``intent_id``: the same
        intent again returns the id and queues nothing; another one under that id raises
        ``IdempotencyMismatch``. ``RateLimited`` when the queue is full; ``BadRequest``
        for an intent the store would refuse.
        """
        intent_id = room_keys.check_name(intent_id or uuid.uuid4().hex, "intent id")
        payload = encode_intent(intent) if isinstance(intent, Intent) else intent
        decoded = decode_intent(payload)
        read = [*(p.key for p in decoded.when), *(i.key for i in increments_of(decoded))]
        prepare_transact(
            [Present(k) for k in read], decoded.writes, decoded.appends, self.scope.store.limits
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
            "keys": sorted(set(read)),  # what the writer reads to apply it
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
        """The intent's outcome once it is settled, read from the ``wq.<outcome>`` event
        that settles it (routed to this waiter by the process's one follower of the
        room's log, so many submitters waiting cost one log read per batch of events,
        not one read each, and no read of their own once the event came);
        ``TimeoutError`` if it is still queued after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        routes = (("wq", self.keys.name, intent_id),)
        async with follow(self.scope.store, self.scope.room, routes=routes) as woken:
            outcome = await self.outcome(intent_id)  # subscribed first: none is missed
            while not outcome.settled:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"intent {intent_id!r} still queued after {timeout}s")
                if not await woken.wait(min(remaining, 3600.0)):
                    continue
                events, resync = woken.take()
                told = [_told(intent_id, e) for e in events]
                outcome = next((o for o in told if o.settled), outcome)
                if resync:
                    outcome = await self.outcome(intent_id)
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
