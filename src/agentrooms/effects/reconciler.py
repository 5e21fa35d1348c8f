"""The reconciler: settle effects whose outcome nobody recorded.

It looks at the in-flight set (``set_pick``, so the cost does not grow with the room)
for effects whose worker's lease has lapsed (the worker died or stalled between claim
and record) and effects left ``unknown`` for ``unknown_after`` seconds. It takes each
over (a new fence: the old holder can no longer record anything), asks the destination
through ``check(effect)`` and records the :class:`Outcome`: ``succeeded`` with the found
result, back to ``pending`` (the same id, so the destination deduplicates a repeat),
``failed``, or ``compensated`` together with a new, linked compensating effect.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from functools import partial

from agentrooms.commit import Change, View
from agentrooms.effects import transitions
from agentrooms.effects.model import (
    INFLIGHT_SET,
    UNKNOWN,
    Effect,
    Outcome,
    describe_error,
    effect_key,
)
from agentrooms.effects.outbox import Outbox, check_ttl, effect_after
from agentrooms.errors import StaleFence, StoreUnavailable
from agentrooms.rooms import keys

Check = Callable[[Effect], Awaitable[Outcome]]
"""Asks the destination whether ``effect`` (by its id, the idempotency key) was applied."""


class Reconciler:
    def __init__(
        self,
        outbox: Outbox,
        check: Check,
        *,
        name: str = "reconciler",
        lease_ttl: float = 30.0,
        unknown_after: float = 30.0,
        batch: int = 16,
        max_candidates: int = 256,
    ) -> None:
        """``unknown_after``: how long an effect reported ``unknown`` is left alone
        before the destination is asked (give the remote side time to settle)."""
        self.outbox = outbox
        self.name = keys.check_name(name, "reconciler name")
        self.lease_ttl = check_ttl(lease_ttl, "lease_ttl")
        self.unknown_after = float(unknown_after)
        self._check = check
        self._batch = batch
        self._max_candidates = max_candidates

    async def take(self, tried: set[str] | None = None) -> Effect | None:
        """Take over one effect that needs settling; ``None`` if none does now.

        Candidates come from the in-flight set, least recently looked at first, at most
        ``max_candidates`` per call; each batch is read in one snapshot and only those
        that look due are taken (conditionally: a worker's renewal wins)."""
        tried = set() if tried is None else tried
        store, room = self.outbox.store, self.outbox.room
        while len(tried) < self._max_candidates:
            picked = [
                m for m in await store.set_pick(room, INFLIGHT_SET, self._batch) if m not in tried
            ]
            if not picked:
                return None
            tried.update(picked)
            snap = await self.outbox.scope.read([effect_key(m) for m in picked])
            for op_id in picked:
                record = snap.get(effect_key(op_id))
                if record is not None and not self._due(
                    Effect.from_value(record.value, 0), snap.now
                ):
                    continue
                take = partial(
                    _take,
                    op_id=op_id,
                    owner=self.name,
                    ttl=self.lease_ttl,
                    unknown_after=self.unknown_after,
                )
                try:
                    result = await self.outbox.scope.commit(take, None, [effect_key(op_id)])
                except transitions.Skip:
                    continue
                taken = effect_after(result, op_id)
                if taken is not None:
                    return taken
        return None

    def _due(self, effect: Effect, now: float) -> bool:
        if effect.lease_expires is not None and effect.lease_expires > now:
            return False
        return effect.status != UNKNOWN or (effect.since or 0.0) + self.unknown_after <= now

    async def settle(self, effect: Effect) -> Effect:
        """Ask ``check`` about a taken-over ``effect`` and record the outcome. A check
        that raises leaves the effect ``unknown`` for a later pass."""
        try:
            outcome = await self._check(effect)
        except Exception as exc:
            outcome = Outcome("wait", error=describe_error(exc))
        if not isinstance(outcome, Outcome):
            raise TypeError(f"check must return an Outcome, not {type(outcome).__name__}")
        resolve = partial(_resolve, mine=effect, outcome=outcome)
        result = await self.outbox.commit_for(resolve, effect.id)
        settled = effect_after(result, effect.id)
        assert settled is not None
        return settled

    async def run_once(self, limit: int = 1000) -> list[Effect]:
        """Settle every effect that needs it now (at most ``limit``); returns them."""
        settled: list[Effect] = []
        tried: set[str] = set()
        while len(settled) < limit and (effect := await self.take(tried)) is not None:
            with contextlib.suppress(StaleFence):  # taken over again meanwhile: theirs now
                settled.append(await self.settle(effect))
        return settled

    async def run(self, *, stop: asyncio.Event | None = None, every: float = 5.0) -> None:
        """Settle what needs it every ``every`` seconds until ``stop`` is set."""
        while stop is None or not stop.is_set():
            with contextlib.suppress(StoreUnavailable):
                await self.run_once()
            await asyncio.sleep(every)


def _take(
    view: View, _: None, *, op_id: str, owner: str, ttl: float, unknown_after: float
) -> Change:
    return transitions.take_over(view, op_id, owner, ttl, unknown_after)


def _resolve(view: View, _: None, *, mine: Effect, outcome: Outcome) -> Change:
    return transitions.resolve(view, mine, outcome, None)
