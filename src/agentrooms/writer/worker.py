"""The applying side of a queue: :class:`Writer`, which serves it while it holds the
writer lock and waits in line for the lock otherwise."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from functools import partial
from typing import Any

from agentrooms.commit import Change, View
from agentrooms.errors import (
    BadRequest,
    InvalidTransition,
    LockHeld,
    NotFound,
    StaleFence,
    StoreUnavailable,
)
from agentrooms.metrics import WriterMetrics, default_writer_metrics
from agentrooms.rooms import keys as room_keys
from agentrooms.rooms.follow import tell
from agentrooms.rooms.locks import Lock, Locks, knowledge_of
from agentrooms.rooms.room import Room
from agentrooms.rooms.scope import Scope
from agentrooms.store.types import Delete, Event, Put, Record, Snapshot, appended
from agentrooms.writer.model import DEAD, OUTAGE_PAUSE, SUBMITTED, QueueKeys
from agentrooms.writer.queue import DEPTH_EVERY, _scope_of
from agentrooms.writer.transitions import (
    Poison,
    _apply_batch,
    _count_failure,
    _dead_letter,
    _field,
    _Limit,
    _Step,
)

__all__ = ["Writer"]

GUESS_FOR = 1.0  # seconds the records a writer last wrote stand in for a read
KNOWN_KEYS = 10_000  # records remembered for that, at most


class _Throughput:
    """Intents per second over the last ``size`` writes that settled some: from the
    start of the oldest to now (monotonic clock)."""

    def __init__(self, size: int = 64) -> None:
        self._ticks: collections.deque[tuple[float, int]] = collections.deque(maxlen=size)

    def tick(self, started: float, count: int = 1) -> None:
        self._ticks.append((started, count))

    def rate(self, pending: int = 0, started: float | None = None) -> float:
        """The rate, counting ``pending`` intents of a write begun at ``started``."""
        ticks = [*self._ticks, *([] if started is None else [(started, pending)])]
        if not ticks:
            return 0.0
        span = time.monotonic() - ticks[0][0]
        total = sum(count for _, count in ticks)
        return total / span if span > 0 and total else 0.0


class Writer:
    """The applying side: ``await Writer(room, owner="w1").run(stop)`` serves the queue
    while it holds the writer lock and waits in line for it otherwise.

    It settles up to ``batch`` intents (and ``batch_bytes`` of intent payload, and the
    store's ``limits.max_ops`` operations) in each write; a write the store refuses is
    retried with half as many, down to one intent, which then counts as a failure of
    that intent (``max_failures`` of them send it to the dead letters)."""

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
        batch_bytes: int = 1 << 20,
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
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise BadRequest("batch must be a positive integer")
        self.batch, self.batch_bytes = batch, batch_bytes
        self.idle, self.retention = idle, retention
        self._rate = _Throughput()
        self._lost: Lock | None = None
        self._depth_at = -DEPTH_EVERY  # when the depth gauge was last set
        self._ahead: tuple[int, asyncio.Future[list[Event]]] | None = None  # a page read ahead
        self._gauges: set[asyncio.Future[None]] = set()  # refreshes of the depth gauge
        self._stale = False  # intents settled since the gauge was last refreshed
        self._known: dict[str, Record | None] = {}  # records as last read or written
        self._known_at = (0.0, -GUESS_FOR)  # the store's clock then, and the local one

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
            self._drop_ahead()
            for gauge in list(self._gauges):
                await gauge  # a read, soon done; the gauge is forgotten after it
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            self.metrics.forget(self.scope.room, self.keys.name)

    async def apply_pending(self, lock: Lock) -> int:
        """Apply every intent queued now under ``lock`` (no waiting); how many settled."""
        position, total = await self.position(), 0
        try:
            while True:
                position, seen, settled = await self._consume(lock, position)
                total += settled
                if not seen:
                    return total
        finally:
            self._drop_ahead()
            for gauge in list(self._gauges):
                await gauge

    async def position(self) -> int:
        cursor = (await self.scope.read([self.keys.cursor])).value(self.keys.cursor)
        return 0 if cursor is None else int(cursor["seq"])

    async def _consume(self, lock: Lock, position: int) -> tuple[int, int, int]:
        """Settle the submissions among the next page of log events; returns the new
        read position, how many events were read and how many intents settled."""
        page = min(self.scope.store.limits.max_page, 2 * self.batch)
        events = await self._page(position, page)
        steps = [
            _Step(self.keys, event, lock, self.retention)
            for event in events
            if event.type == SUBMITTED and _field(event, "queue") == self.keys.name
        ]
        if events:
            position = events[-1].seq
        if steps:  # busy: read the next page while this batch is written
            ahead = self.scope.store.read_log(self.scope.room, position, page)
            self._ahead = (position, asyncio.ensure_future(ahead))
        try:
            settled = await self._settle(steps)
        except BaseException:
            self._drop_ahead()
            raise
        now, self._stale = time.monotonic(), self._stale or settled > 0
        # the gauge: every DEPTH_EVERY, and once idle after a batch, off the batches' path
        if now - self._depth_at >= DEPTH_EVERY or (not events and self._stale):
            self._depth_at, self._stale = now, False
            self._gauges.add(task := asyncio.ensure_future(self._gauge()))
            task.add_done_callback(self._gauges.discard)
        return position, len(events), settled

    async def _gauge(self) -> None:
        with contextlib.suppress(Exception):  # a gauge, not worth a failure
            depth = await self.scope.store.set_size(self.scope.room, self.keys.queued)
            self.metrics.depth(self.scope.room, self.keys.name, depth)

    async def _page(self, position: int, page: int) -> list[Event]:
        """The events after ``position``: the page read ahead for it, if there is one."""
        if self._ahead is not None and self._ahead[0] == position:
            task, self._ahead = self._ahead[1], None
            return await task
        self._drop_ahead()
        return await self.scope.store.read_log(self.scope.room, position, page)

    def _drop_ahead(self) -> None:
        if self._ahead is not None:
            task, self._ahead = self._ahead[1], None
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _settle(self, steps: list[_Step]) -> int:
        """Settle ``steps`` in order, as many per write as fit; how many settled."""
        settled, done, cap = 0, 0, self.batch
        while done < len(steps):
            self._check()
            chunk = self._chunk(steps[done:], cap)
            try:
                taken, count = await self._apply_batch(chunk)
            except Poison:
                taken, count = 1, await self._apply(chunk[0])
            except (StaleFence, InvalidTransition, NotFound):
                raise  # deposed, or the room was archived or deleted
            except StoreUnavailable:
                await asyncio.sleep(self.retry_delay)  # re-reading settled ones is harmless
                continue
            except Exception:
                if len(chunk) > 1:  # too big for the store, or one intent in it is bad
                    cap = max(1, len(chunk) // 2)
                    continue
                taken, count = 1, await self._apply(chunk[0])
            if taken < 1:
                raise RuntimeError("a batch write settled nothing")
            done, settled, cap = done + taken, settled + count, min(self.batch, cap * 2)
        return settled

    def _chunk(self, steps: list[_Step], cap: int) -> list[_Step]:
        """The first ``cap`` steps, fewer if their read keys would take more than half
        of the transact's operations (the rest are for writes and appends)."""
        budget, chunk = self.scope.store.limits.max_ops // 2, list[_Step]()
        for step in steps[:cap]:
            budget -= len(step.read_keys)
            if chunk and budget < 0:
                break
            chunk.append(step)
        return chunk

    async def _apply_batch(self, steps: list[_Step]) -> tuple[int, int]:
        """One write settling a prefix of ``steps``: how many steps it took and how many
        intents it settled. ``Poison`` if the first cannot be applied."""
        started = time.monotonic()
        limit = _Limit(len(steps), self.scope.store.limits.max_ops, self.batch_bytes)

        def stats(count: int) -> dict[str, Any]:
            return {"rate": self._rate.rate(count, started)}

        batch = partial(_apply_batch, steps=steps, limit=limit, stats=stats)
        seen: list[tuple[View, Change]] = []

        def apply(view: View, event: None) -> Change:
            change = batch(view, event)
            seen.append((view, change))
            return change

        read_keys = list(dict.fromkeys(k for step in steps for k in step.read_keys))
        try:
            committed = await self.scope.commit(
                apply, None, read_keys, guess=self._guess(read_keys)
            )
        except BaseException:
            self._known.clear()
            raise
        view, change = seen[-1]
        self._remember(view, change, committed.versions)
        done = committed.result
        appends = list(change.appends)
        if done.get("appends") == len(appends) == len(committed.seqs):
            # the batch's events, to this process's waiters without a read
            told = appended(committed.seqs, appends, done["at"])
            tell(self.scope.store, self.scope.room, told)
        elapsed = time.monotonic() - started
        if done["settled"]:
            self._rate.tick(started, len(done["settled"]))
        for outcome in done["settled"]:
            self.metrics.settled(outcome["status"], elapsed, done["at"] - outcome["time"])
        return int(done["taken"]), len(done["settled"])

    def _guess(self, read_keys: list[str]) -> Snapshot | None:
        """The records a batch reads, as this writer last wrote or read them, if it knows
        them all and recently (the store's clock advanced by the local one): a batch then
        needs no read. A wrong guess costs nothing but a refused transact: the commit
        compares every version, then reads and retries."""
        keys = [room_keys.META, room_keys.ARCHIVED, *read_keys]
        now, at = self._known_at
        elapsed = time.monotonic() - at
        if elapsed > GUESS_FOR or any(k not in self._known for k in keys):
            return None
        records = {k: r for k in keys if (r := self._known[k]) is not None}
        return Snapshot(records, now + elapsed)

    def _remember(self, view: View, change: Change, versions: dict[str, int]) -> None:
        """What a committed batch leaves: the records it read, then its writes."""
        now = view.now
        known = {k: view._snapshot.get(k) for k in view._keys}
        for w in change.writes:
            if isinstance(w, Put) and w.key in versions:
                expires = None if w.ttl is None else now + w.ttl
                known[w.key] = Record(w.key, w.value, versions[w.key], expires)
            elif isinstance(w, Delete):
                known[w.key] = None
        if len(known) > KNOWN_KEYS:
            self._known.clear()
        self._known.update(known)
        self._known_at = (now, time.monotonic())

    async def _wait(self, position: int, stop: asyncio.Event | None) -> None:
        """Until the log moves past ``position``, ``stop`` is set, or it is time to look
        at the lock again; the events that moved it become the next page (one round trip
        where the store's blocking read returns them)."""
        self._check()
        timeout = min(self.idle, self.lock_ttl / 3)
        page = min(self.scope.store.limits.max_page, 2 * self.batch)
        follow = self.scope.store.follow_log(self.scope.room, position, timeout, page)
        watch = asyncio.ensure_future(follow)
        waiting = {watch} if stop is None else {watch, asyncio.ensure_future(stop.wait())}
        done, pending = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for task in done:
            task.result()
        if watch in done:
            self._ahead = (position, watch)

    async def _apply(self, step: _Step) -> int:
        """Settle one submission alone: applied / rejected, or after ``max_failures``
        exceptions dead. Returns 1 if this call settled it, 0 if it already was."""
        failures = 0
        while True:
            self._check()
            try:
                return (await self._apply_batch([step]))[1]
            except Poison as exc:
                error = exc.error
            except (StaleFence, InvalidTransition, NotFound):
                raise  # deposed, or the room was archived or deleted
            except StoreUnavailable:
                await asyncio.sleep(self.retry_delay)  # not the intent's fault: not counted
                continue
            except Exception as exc:
                error = exc
            failures = await self._failed(step, error, failures + 1)
            if failures < self.max_failures:
                await asyncio.sleep(self.retry_delay * failures)
                continue
            started = time.monotonic()
            self._known.clear()  # these writes are not remembered
            bury = partial(_dead_letter, step=step, failures=failures, error=error)
            result = await self.scope.commit(bury, None, [self.keys.cursor, step.item])
            if result.result is None:
                return 0
            self._rate.tick(started)
            wait = result.result["at"] - step.event.time
            self.metrics.settled(DEAD, time.monotonic() - started, wait)
            return 1

    async def _failed(self, step: _Step, exc: Exception, local: int) -> int:
        """Count one failure on the intent's record (a restarted writer continues the
        count); returns the count."""
        self._known.clear()  # its write is not remembered
        try:
            result = await self.scope.commit(
                partial(_count_failure, step=step, error=exc), None, [step.item, self.keys.cursor]
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
