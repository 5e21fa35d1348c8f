"""The worker: claim a pending effect under a fenced lease, perform it, record the outcome.

``perform`` never records anything when it is cancelled or the process dies: the effect
stays ``claimed`` until its lease lapses and the reconciler asks the destination what
happened. A lease lost while the handler runs is not an interruption (a call torn off
mid-flight is the worst kind of unknown); the handler finishes and the record is refused
with ``StaleFence``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

from agentrooms.commit import Change, View
from agentrooms.effects import transitions
from agentrooms.effects.model import (
    PENDING_SET,
    Effect,
    OutcomeUnknown,
    PermanentFailure,
    describe_error,
    effect_key,
)
from agentrooms.effects.outbox import Outbox, check_ttl, effect_after
from agentrooms.effects.reconciler import Reconciler
from agentrooms.errors import BadRequest, InvalidTransition, NotFound, StaleFence, StoreUnavailable
from agentrooms.retry import Backoff, Exponential
from agentrooms.rooms import keys
from agentrooms.store.types import JSON, Append
from agentrooms.store.validation import encode_json

Handler = Callable[[Effect], Awaitable[JSON]]
"""Performs one effect, passing ``effect.id`` to the destination as the idempotency key.

Returns the result (JSON). Raises ``PermanentFailure`` for a refusal that no retry will
change, ``OutcomeUnknown`` when the call may have been applied, and anything else for a
failure worth retrying (the retry reuses the same id, so the destination deduplicates).
"""

Transition = Callable[[View, None], Change]


class Worker:
    def __init__(
        self,
        outbox: Outbox,
        handler: Handler,
        *,
        name: str,
        lease_ttl: float = 30.0,
        renew_every: float | None = None,
        backoff: Backoff | None = None,
        batch: int = 8,
        rng: random.Random | None = None,
    ) -> None:
        """``renew_every`` (default a third of ``lease_ttl``; ``0`` disables renewal)
        keeps the lease alive while the handler runs; ``backoff`` spaces the retries of a
        failed effect (by attempt number)."""
        self.outbox = outbox
        self.name = keys.check_name(name, "worker name")
        self.lease_ttl = check_ttl(lease_ttl, "lease_ttl")
        self.renew_every = self.lease_ttl / 3 if renew_every is None else float(renew_every)
        self._handler = handler
        self._backoff = backoff or Exponential(base=0.5, cap=60.0)
        self._batch = batch
        self._rng = rng or random.Random()

    async def claim(self) -> Effect | None:
        """Claim one pending effect that is due; ``None`` if there is none."""
        picked = await self.outbox.store.set_pick(self.outbox.room, PENDING_SET, self._batch)
        if not picked:
            await self.outbox.scope.read([])  # no work, or no room: say which
        for op_id in picked:
            take = partial(_claim, op_id=op_id, worker=self.name, ttl=self.lease_ttl)
            try:
                result = await self.outbox.scope.commit(take, None, [effect_key(op_id)])
            except transitions.Skip:
                continue
            claimed = effect_after(result, op_id)
            if claimed is not None:
                return claimed
        return None

    async def perform(self, effect: Effect) -> Effect:
        """Run the handler on a claimed ``effect`` and record its outcome; returns the
        effect as recorded. ``StaleFence`` if the lease was taken over meanwhile."""
        renewer = asyncio.create_task(self._keep_alive(effect)) if self.renew_every > 0 else None
        try:
            transition = await self._call(effect)
        finally:
            if renewer is not None:
                renewer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewer
        return await self._record(effect, transition)

    async def run_once(self) -> Effect | None:
        """Claim and perform one effect; ``None`` if nothing was due."""
        effect = await self.claim()
        if effect is None:
            return None
        with contextlib.suppress(StaleFence):
            return await self.perform(effect)
        return effect

    async def drain(self, limit: int = 1000) -> list[Effect]:
        """Perform effects until none is due (at most ``limit``)."""
        done: list[Effect] = []
        while len(done) < limit and (effect := await self.run_once()) is not None:
            done.append(effect)
        return done

    async def run(
        self,
        *,
        stop: asyncio.Event | None = None,
        idle: float = 1.0,
        reconciler: Reconciler | None = None,
        reconcile_every: float = 5.0,
    ) -> None:
        """Work until ``stop`` is set: perform due effects, wait on the room's log when
        there are none (at most ``idle`` seconds, so retries that come due are seen),
        and run ``reconciler`` every ``reconcile_every`` seconds."""
        store, room = self.outbox.store, self.outbox.room
        next_reconcile = 0.0
        while stop is None or not stop.is_set():
            try:
                seen = await store.last_seq(room)
                if reconciler is not None and time.monotonic() >= next_reconcile:
                    await reconciler.run_once()
                    next_reconcile = time.monotonic() + reconcile_every
                if await self.run_once() is None:
                    await watch_or_stop(store.watch(room, seen, idle), stop)
            except StoreUnavailable:  # an unrecorded claim is left to its lease
                await asyncio.sleep(idle)

    async def _call(self, effect: Effect) -> Transition:
        """Run the handler; the transition that records what happened."""
        try:
            result = await self._handler(effect)
        except PermanentFailure as exc:
            return partial(_fail, mine=effect, error=describe_error(exc), retry_in=None)
        except OutcomeUnknown as exc:
            return partial(_unknown, mine=effect, error=describe_error(exc))
        except Exception as exc:
            delay = self._backoff.delay(effect.attempts, 0.0, self._rng)
            return partial(_retry, mine=effect, error=describe_error(exc), retry_in=delay)
        try:
            encode_json(result, "an effect's result", self.outbox.store.limits.max_value_bytes)
        except BadRequest as exc:  # performed, but the result cannot be stored: ask later
            return partial(_unknown, mine=effect, error=describe_error(exc))
        return partial(_succeed, mine=effect, result=result)

    async def _record(self, effect: Effect, transition: Transition) -> Effect:
        try:
            result = await self.outbox.commit_for(transition, effect.id)
        except StaleFence:
            data = {"effect": effect.id, "by": self.name, "fence": effect.fence}
            with contextlib.suppress(Exception):
                fenced = Append("effect.fenced", data, self.name)
                await self.outbox.scope.transact(appends=[fenced])
            raise
        recorded = effect_after(result, effect.id)
        assert recorded is not None
        return recorded

    async def _keep_alive(self, effect: Effect) -> None:
        renew = partial(_renew, mine=effect, ttl=self.lease_ttl)
        while True:
            await asyncio.sleep(self.renew_every)
            try:
                await self.outbox.scope.commit(renew, None, [effect.key])
            except StoreUnavailable:
                continue
            except (StaleFence, InvalidTransition, NotFound):
                return  # lost: the record will be refused


async def watch_or_stop(watch: Coroutine[Any, Any, int], stop: asyncio.Event | None) -> None:
    """Await ``watch`` (a ``Store.watch``), cut short when ``stop`` is set."""
    if stop is None:
        await watch
        return
    waiting = {asyncio.ensure_future(watch), asyncio.ensure_future(stop.wait())}
    done, pending = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for task in done:
        task.result()


# Transitions with keyword arguments bound by ``partial`` (the commit loop passes the view
# and an unused event).


def _claim(view: View, _: None, *, op_id: str, worker: str, ttl: float) -> Change:
    return transitions.claim(view, op_id, worker, ttl)


def _renew(view: View, _: None, *, mine: Effect, ttl: float) -> Change:
    return transitions.renew(view, mine, ttl)


def _succeed(view: View, _: None, *, mine: Effect, result: JSON) -> Change:
    return transitions.succeed(view, mine, result)


def _fail(view: View, _: None, *, mine: Effect, error: JSON, retry_in: float | None) -> Change:
    return transitions.fail(view, mine, error, permanent=True, retry_in=retry_in)


def _retry(view: View, _: None, *, mine: Effect, error: JSON, retry_in: float | None) -> Change:
    return transitions.fail(view, mine, error, permanent=False, retry_in=retry_in)


def _unknown(view: View, _: None, *, mine: Effect, error: JSON) -> Change:
    return transitions.unknown(view, mine, error)
