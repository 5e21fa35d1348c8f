"""The applying side of a queue: :class:`Writer`, which serves it while it holds the
writer lock and waits in line for the lock otherwise."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from functools import partial

from agentrooms.errors import InvalidTransition, LockHeld, NotFound, StaleFence, StoreUnavailable
from agentrooms.metrics import WriterMetrics, default_writer_metrics
from agentrooms.rooms import keys as room_keys
from agentrooms.rooms.locks import Lock, Locks, knowledge_of
from agentrooms.rooms.room import Room
from agentrooms.rooms.scope import Scope
from agentrooms.writer.model import OUTAGE_PAUSE, SUBMITTED, QueueKeys
from agentrooms.writer.queue import _scope_of
from agentrooms.writer.transitions import _apply_intent, _count_failure, _dead_letter, _field, _Step

__all__ = ["Writer"]


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
        self.locks = Locks(self.scope, knowledge_of(base.store))
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
