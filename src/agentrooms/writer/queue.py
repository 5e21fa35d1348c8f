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
from agentrooms.rooms.follow import follow
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
)

__all__ = ["IntentQueue"]


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

    async def submit(
        self, intent: Intent | JSON, *, intent_id: str | None = None, author: str | None = None
    ) -> str:
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
                [Append(SUBMITTED, data, author)],
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
