"""The outbox of one room: request effects, read them back, count them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

from agentrooms.commit import Change, CommitResult, View
from agentrooms.effects.model import (
    DEAD_SET,
    INFLIGHT_SET,
    PENDING_SET,
    Effect,
    EffectRequest,
    effect_key,
    request_effects,
)
from agentrooms.errors import BadRequest, NotFound, StoreUnavailable
from agentrooms.rooms import keys
from agentrooms.rooms.room import Room
from agentrooms.rooms.scope import Scope
from agentrooms.store.base import Store
from agentrooms.store.types import JSON

RECORD_RETRIES = 30  # transport failures tolerated while recording one outcome
RECORD_BACKOFF = 2.0  # seconds, the longest wait between those retries


def scope_of(room: Room | Scope) -> Scope:
    return room.scope if isinstance(room, Room) else room


class Outbox:
    """Effects requested in one room (``Outbox(room)`` with a :class:`Room` or its scope)."""

    def __init__(self, room: Room | Scope) -> None:
        self.scope = scope_of(room)

    @property
    def store(self) -> Store:
        return self.scope.store

    @property
    def room(self) -> str:
        return self.scope.room

    async def request(
        self,
        op_id: str,
        kind: str,
        params: JSON = None,
        *,
        max_attempts: int = 5,
        author: str | None = None,
    ) -> Effect:
        """Record one effect on its own (no other state change). Idempotent by ``op_id``:
        the same request again returns the recorded effect; another kind or params under
        the same id raises ``IdempotencyMismatch``. ``author``: the agent requesting it
        (the author of its ``effect.requested`` event)."""
        if author is not None:
            keys.check_name(author, "author")
        request = EffectRequest(op_id, kind, params, max_attempts, author=author)

        def add(view: View, _: None) -> Change:
            return request_effects(view, Change(), request)

        await self.scope.commit(add, None, [request.key])
        return await self.get(op_id)

    async def get(self, op_id: str) -> Effect:
        key = effect_key(keys.check_name(op_id, "effect id"))
        record = (await self.scope.read([key])).get(key)
        if record is None:
            raise NotFound(f"no effect {op_id!r} in room {self.room!r}")
        return Effect.from_value(record.value, record.version)

    async def effects(self, status: str | None = None) -> list[Effect]:
        """Every effect of the room in id order (optionally only those with ``status``)."""
        await self.scope.read([])
        out: list[Effect] = []
        after: str | None = None
        while True:
            page = await self.store.scan(self.room, "effect/", after, 1000)
            out += [Effect.from_value(r.value, r.version) for r in page.records]
            if page.next_after is None:
                break
            after = page.next_after
        return [e for e in out if status is None or e.status == status]

    async def counts(self) -> dict[str, int]:
        """Pending, in-flight (claimed or unknown) and dead effects, O(1) each."""
        size = partial(self.store.set_size, self.room)
        return {
            "pending": await size(PENDING_SET),
            "inflight": await size(INFLIGHT_SET),
            "dead": await size(DEAD_SET),
        }

    async def commit_for(
        self, transition: Callable[[View, None], Change], op_id: str
    ) -> CommitResult:
        """Commit a holder's transition on one effect, riding out transport failures.

        Safe to resend: a holder's transitions recognise their own earlier write (same
        fence, status already moved) and then change nothing.
        """
        for attempt in range(1, RECORD_RETRIES + 1):
            try:
                return await self.scope.commit(transition, None, [effect_key(op_id)])
            except StoreUnavailable:
                if attempt == RECORD_RETRIES:
                    raise
                await asyncio.sleep(min(RECORD_BACKOFF, 0.05 * 2**attempt))
        raise AssertionError("unreachable")


def effect_after(result: CommitResult, op_id: str) -> Effect | None:
    """The effect as a transition left it (its value is the commit's result)."""
    if result.result is None:
        return None
    return Effect.from_value(result.result, result.versions.get(effect_key(op_id), 0))


def check_ttl(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86_400:
        raise BadRequest(f"{what} must be between 0 and 86400 seconds, got {value!r}")
    return float(value)
