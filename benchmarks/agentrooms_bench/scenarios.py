"""The write policies a run compares, each as N agents updating one shared state.

Every policy does the same logical work: each agent, over and over, makes one *update*
(agent ``a<i>`` adds one to its own tally and to the total). An update is **acked** when
the policy told the agent it took effect; at the end of every cell the state is read back
and each agent's applied tally is compared with its acked updates:

* *lost*: acked but not in the state (``applied < acked``);
* *duplicated*: in the state more often than the agent made it (``applied > acked +
  in_doubt``; *in doubt* are operations that failed in a way that leaves their outcome
  unknown, e.g. a timeout while an intent was still queued).

The **think time** is what an agent spends between reading the state and writing what it
decided (an LLM call): policies whose write depends on a read pay it on every attempt
(a loser re-reads and must decide again); policies whose write does not depend on a read
(log, CRDT) pay it once before writing.

=================  ========================================================================
policy             one update
=================  ========================================================================
cas-none           ``commit()`` on the whole document: read, think, conditional write; on a
cas-exp            conflict re-read and re-think, after no backoff / exponential backoff /
cas-full           full jitter (the library default) / decorrelated jitter. Rejected: write
cas-decorrelated   attempts that lost (``VersionConflict``)
lock               whole-document lock (``try_acquire``, then the queued ``wait_acquire``);
                   read, think, fenced write, release. Rejected: the lock was held when
                   the agent asked (it then waits in line)
lease              per-task leases: ``claim_next`` a task (each task its own record), think
                   (the work, under the lease), ``complete``. Rejected: conflicting writes
                   of claim and completion (the plan is refilled in the background)
writer             designated writer: read, think, submit a *conditional* intent
                   (``doc.n == n read``), wait for its outcome; a rejected intent is
                   re-read, re-thought and resubmitted at once with ``retry_of`` (the
                   retry keeps the rejected one's place in the batch order). One ``Writer``
                   applies the queue, many intents per write, each predicate on the state
                   the intents before it left. Rejected: intents whose predicate no
                   longer held
writer-inc         designated writer, unconditional: think, submit an intent of two
                   increments (the total and the agent's tally; no predicate), wait
                   for its outcome. Rejected: none can be
log                append-only log: think, append one event (no compare, never rejected);
                   the state is the fold of the log (its cost is reported as ``fold_ms``)
crdt               CRDT G-counter: think, increment the local replica, ``push`` it to the
                   agent's own replica record (one unconditional write; the state is the
                   merge of the replica records, its cost reported as ``read_ms``).
                   Rejected: none can be
raw                the raw client's compare-and-set loop (see :mod:`.raw`) with full jitter:
                   the baseline every other policy is divided by
blind              BROKEN ON PURPOSE (hidden): read, think, unconditional write. It loses
                   updates, to show that the loss check catches it
=================  ========================================================================
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry

from agentrooms.commit import Change, CommitOptions, Intent, View, Where, commit
from agentrooms.crdt import GCounter, load, push
from agentrooms.errors import ContentionExhausted, LockHeld, StaleFence, VersionConflict
from agentrooms.metrics import Metrics
from agentrooms.reliability.stores import Target
from agentrooms.retry import (
    Backoff,
    Decorrelated,
    Exponential,
    FullJitter,
    NoBackoff,
    RetryPolicy,
)
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.store import Append, Put, Store
from agentrooms.store.types import Snapshot, TransactResult
from agentrooms.store.wrap import Forwarding
from agentrooms_bench.raw import RawDoc, open_raw

__all__ = [
    "HIDDEN",
    "POLICIES",
    "Applied",
    "CellEnv",
    "Outcome",
    "Scenario",
    "make_scenario",
]

# Backoff base and cap of the compare-and-swap policies: 2 ms, the library's default when
# BENCHMARKS.md section 7 was run (kept so reruns compare with it; the library's default is
# now retry.DEFAULT_BASE, 32 ms, which section 2 measures).
BASE, CAP = 0.002, 0.25
PAD = "x" * 256  # the document carries some text, as a real one would
DOC = "doc"
LOCK_TTL = 30.0
LEASE_TTL = 120.0


def new_doc() -> dict[str, Any]:
    return {"n": 0, "by": {}, "pad": PAD}


def bumped(doc: dict[str, Any], agent: str) -> dict[str, Any]:
    """The document after one update by ``agent``."""
    by = dict(doc["by"])
    by[agent] = by.get(agent, 0) + 1
    return {**doc, "n": doc["n"] + 1, "by": by}


def agent_name(i: int) -> str:
    return f"a{i}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one operation did: ``ok`` (acked), ``exhausted`` (gave up; nothing applied
    unless ``doubt``), with its write attempts and how many of them were rejected."""

    outcome: str
    attempts: int = 1
    rejected: int = 0
    doubt: bool = False  # the outcome is unknown: it may have been (or still be) applied


@dataclass
class Applied:
    """The state read back: per-agent applied counts, or the applied operation ids."""

    counts: dict[int, int] | None = None
    ids: collections.Counter[str] | None = None
    problems: list[str] = field(default_factory=list)  # inconsistencies found in the state


@dataclass
class CellEnv:
    target: Target
    stores: list[Store]
    room: str
    writers: int
    think: float  # seconds
    budget: float  # seconds an update may take before the agent gives up
    metrics: Metrics = field(default_factory=lambda: Metrics(CollectorRegistry()))

    def store(self, i: int) -> Store:
        return self.stores[i % len(self.stores)]


Op = Callable[[str], Awaitable[Outcome | None]]
"""One update by one agent, given its operation id; ``None``: there was no work (yet)."""


class AgentStore(Forwarding):
    """One agent's view of a store handle: counts its conditional writes and their
    rejections, and (for the read-decide-write policies) thinks after every read."""

    def __init__(self, inner: Store, think: float = 0.0) -> None:
        super().__init__(inner)
        self.think = think
        self.writes = 0
        self.conflicts = 0

    def mark(self) -> tuple[int, int]:
        return self.writes, self.conflicts

    def since(self, mark: tuple[int, int]) -> tuple[int, int]:
        return self.writes - mark[0], self.conflicts - mark[1]

    async def read(self, room: str, keys: Sequence[str]) -> Snapshot:
        snapshot = await self.inner.read(room, keys)
        if self.think > 0:
            await asyncio.sleep(self.think)
        return snapshot

    async def transact(
        self,
        room: str,
        compares: Any = (),
        writes: Any = (),
        appends: Any = (),
    ) -> TransactResult:
        self.writes += 1
        try:
            return await self.inner.transact(room, compares, writes, appends)
        except (VersionConflict, StaleFence):
            self.conflicts += 1
            raise


async def _think(seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)


class Scenario(abc.ABC):
    """One policy in one cell: set up the shared state, hand out agents, read back."""

    name: ClassVar[str]
    uses_store: ClassVar[bool] = True  # False: runs without agentrooms' store handles

    def __init__(self, env: CellEnv) -> None:
        self.env = env
        self.extra: dict[str, Any] = {}

    async def setup(self) -> None:  # noqa: B027 - optional hook
        """Create the shared state (a fresh room per cell)."""

    @abc.abstractmethod
    def agent(self, i: int) -> Op: ...

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Stop background work (plan refill, the writer) before the state is read."""

    @abc.abstractmethod
    async def applied(self) -> Applied: ...

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``setup`` opened outside the store."""

    async def _put_doc(self) -> None:
        await self.env.stores[0].transact(self.env.room, writes=[Put(DOC, new_doc())])

    async def _doc_counts(self) -> Applied:
        doc = (await self.env.stores[0].read(self.env.room, [DOC])).value(DOC)
        return doc_counts(doc)


def doc_counts(doc: dict[str, Any]) -> Applied:
    by: dict[str, int] = doc["by"]
    counts = {int(name[1:]): n for name, n in by.items()}
    problems = []
    if sum(counts.values()) != doc["n"]:
        problems.append(f"document total {doc['n']} != sum of tallies {sum(counts.values())}")
    return Applied(counts=counts, problems=problems)


# ------------------------------------------------------------------- compare-and-swap


def _bump(view: View, agent: str) -> Change:
    return Change(writes=[Put(DOC, bumped(view.get(DOC), agent))])


class Cas(Scenario):
    @staticmethod
    def backoff() -> Backoff:
        return FullJitter(BASE, CAP)

    def __init__(self, env: CellEnv) -> None:
        super().__init__(env)
        self.policy = RetryPolicy(max_attempts=1_000_000, budget=env.budget, backoff=self.backoff())

    async def setup(self) -> None:
        await self._put_doc()

    def agent(self, i: int) -> Op:
        store, name = AgentStore(self.env.store(i), self.env.think), agent_name(i)

        async def op(op_id: str) -> Outcome:
            try:
                done = await commit(
                    store,
                    self.env.room,
                    _bump,
                    name,
                    keys=[DOC],
                    options=CommitOptions(policy=self.policy, metrics=self.env.metrics),
                )
            except ContentionExhausted as exc:
                return Outcome("exhausted", exc.attempts, exc.attempts)
            return Outcome("ok", done.attempts, done.attempts - 1)

        return op

    async def applied(self) -> Applied:
        return await self._doc_counts()


class CasNone(Cas):
    name = "cas-none"

    @staticmethod
    def backoff() -> Backoff:
        return NoBackoff()


class CasExp(Cas):
    name = "cas-exp"

    @staticmethod
    def backoff() -> Backoff:
        return Exponential(BASE, CAP)


class CasFull(Cas):
    name = "cas-full"

    @staticmethod
    def backoff() -> Backoff:
        return FullJitter(BASE, CAP)


class CasDecorrelated(Cas):
    name = "cas-decorrelated"

    @staticmethod
    def backoff() -> Backoff:
        return Decorrelated(BASE, CAP)


# ------------------------------------------------------------------------------ lock


class WholeLock(Scenario):
    name = "lock"

    async def setup(self) -> None:
        await Rooms(self.env.stores[0]).create(self.env.room)
        await self._put_doc()

    def agent(self, i: int) -> Op:
        store, name = AgentStore(self.env.store(i)), agent_name(i)
        room = self.env.room
        locks = Rooms(store, metrics=self.env.metrics).room(room).locks

        async def op(op_id: str) -> Outcome:
            held = 0
            try:
                lock = await locks.try_acquire(DOC, name, ttl=LOCK_TTL)
            except LockHeld:
                held = 1
                try:
                    lock = await locks.wait_acquire(
                        DOC, name, ttl=LOCK_TTL, timeout=self.env.budget
                    )
                except LockHeld:
                    return Outcome("exhausted", 2, 2)
            try:
                doc = (await store.read(room, [DOC])).value(DOC)
                await _think(self.env.think)
                await store.transact(room, [lock.guard()], [Put(DOC, bumped(doc, name))])
            finally:
                await locks.release(lock)
            return Outcome("ok", 1 + held, held)

        return op

    async def applied(self) -> Applied:
        return await self._doc_counts()


# ----------------------------------------------------------------------------- leases


class Leases(Scenario):
    name = "lease"
    BATCH = 250

    async def setup(self) -> None:
        self.rooms = Rooms(self.env.stores[0])
        self.plan = (await self.rooms.create(self.env.room)).plan
        self.low = max(128, 8 * self.env.writers)
        self.next_id = 0
        await self._add(max(self.BATCH, 2 * self.low))
        self._stop = asyncio.Event()
        self._refill = asyncio.create_task(self._keep_full())

    async def _add(self, count: int) -> None:
        while count > 0:
            batch = min(count, self.BATCH)
            await self.plan.add(
                [TaskSpec(f"t{n:08}") for n in range(self.next_id, self.next_id + batch)]
            )
            self.next_id += batch
            count -= batch

    async def _keep_full(self) -> None:
        while not self._stop.is_set():
            if await self.plan.ready_count() < self.low:
                await self._add(self.BATCH)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.02)

    def agent(self, i: int) -> Op:
        store, name = AgentStore(self.env.store(i)), agent_name(i)
        plan = Rooms(store, metrics=self.env.metrics).room(self.env.room).plan

        async def op(op_id: str) -> Outcome | None:
            mark = store.mark()
            try:
                lease = await plan.claim_next(name, ttl=LEASE_TTL)
                if lease is None:
                    return None
                await _think(self.env.think)
                await plan.complete(lease, op_id)
            except ContentionExhausted:  # nothing completed (a claimed task's lease expires)
                writes, conflicts = store.since(mark)
                return Outcome("exhausted", writes, conflicts)
            writes, conflicts = store.since(mark)
            return Outcome("ok", writes, conflicts)

        return op

    async def stop(self) -> None:
        self._stop.set()
        await self._refill

    async def applied(self) -> Applied:
        done = await self.plan.tasks("done")
        ids = collections.Counter(str(t.result) for t in done)
        self.extra["tasks_added"] = self.next_id
        return Applied(ids=ids)


# --------------------------------------------------------------------- designated writer


class DesignatedWriter(Scenario):
    name = "writer"

    async def setup(self) -> None:
        from agentrooms.writer import Writer, WriterMetrics

        room = await Rooms(self.env.stores[0]).create(self.env.room)
        await self._put_doc()
        metrics = WriterMetrics(CollectorRegistry())
        self.writer = Writer(room, owner="writer-0", metrics=metrics, idle=0.5)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.writer.run(self._stop))

    def agent(self, i: int) -> Op:
        from agentrooms.writer import IntentQueue
        from agentrooms.writer.model import APPLIED, REJECTED

        # the handle itself, not a wrapper: a wrapper has an identity of its own, so each
        # agent would run a follower of the room's log of its own (see rooms.follow)
        store, name = self.env.store(i), agent_name(i)
        room = Rooms(store, metrics=self.env.metrics).room(self.env.room)
        queue = IntentQueue(room, max_depth=1_000_000)

        async def op(op_id: str) -> Outcome:
            deadline = time.monotonic() + self.env.budget
            attempts = rejected = 0
            last = None  # the rejected outcome a resubmission retries: it keeps its place
            while True:
                doc = (await store.read(self.env.room, [DOC])).value(DOC)
                await _think(self.env.think)
                attempts += 1
                intent = Intent(
                    when=[Where(DOC, "n", "==", doc["n"])], writes=[Put(DOC, bumped(doc, name))]
                )
                remaining = max(0.01, deadline - time.monotonic())
                try:
                    outcome = await queue.submit_and_wait(intent, timeout=remaining, retry_of=last)
                except TimeoutError:  # still queued: the writer may apply it later
                    return Outcome("exhausted", attempts, rejected, doubt=True)
                if outcome.status == APPLIED:
                    return Outcome("ok", attempts, rejected)
                if outcome.status != REJECTED:
                    raise RuntimeError(f"intent {outcome.id} ended {outcome.status}")
                rejected, last = rejected + 1, outcome
                if time.monotonic() > deadline:
                    return Outcome("exhausted", attempts, rejected)
                # no backoff: the rejection is no contention on the store but the queue's
                # order, and the retry keeps its place in it (retry_of), so the agent
                # that waited longest is evaluated first on the next fresh state

        return op

    async def stop(self) -> None:
        self._stop.set()
        try:
            await asyncio.wait_for(self._task, 30)
        except TimeoutError:
            self.extra["writer_stop"] = "timed out"
        snap = self.writer.metrics.snapshot()
        self.extra["writer_apply_p99_ms"] = round(snap["apply_p99"] * 1000, 3)
        commits = self.writer.metrics.registry.get_sample_value(
            "agentrooms_commits_total", {"outcome": "ok"}
        )
        settled = sum(snap["outcomes"].values())
        if commits:
            self.extra["intents_per_write"] = round(settled / commits, 2)

    async def applied(self) -> Applied:
        return await self._doc_counts()


class WriterIncrements(DesignatedWriter):
    name = "writer-inc"

    def agent(self, i: int) -> Op:
        from agentrooms.writer import Increment, IntentQueue, QueuedIntent
        from agentrooms.writer.model import APPLIED

        store, name = self.env.store(i), agent_name(i)  # the handle: see DesignatedWriter
        room = Rooms(store, metrics=self.env.metrics).room(self.env.room)
        queue = IntentQueue(room, max_depth=1_000_000)
        intent = QueuedIntent(
            [], increments=[Increment(DOC, 1, "n"), Increment(DOC, 1, f"by.{name}")]
        )

        async def op(op_id: str) -> Outcome:
            await _think(self.env.think)
            try:
                outcome = await queue.submit_and_wait(intent, timeout=self.env.budget)
            except TimeoutError:  # still queued: the writer may apply it later
                return Outcome("exhausted", 1, 0, doubt=True)
            if outcome.status != APPLIED:
                raise RuntimeError(f"intent {outcome.id} ended {outcome.status}")
            return Outcome("ok", 1, 0)

        return op


# ------------------------------------------------------------------------ append-only


class AppendLog(Scenario):
    name = "log"
    EVENT = "bench.update"

    def agent(self, i: int) -> Op:
        store = AgentStore(self.env.store(i))

        async def op(op_id: str) -> Outcome:
            await _think(self.env.think)
            await store.transact(self.env.room, appends=[Append(self.EVENT, {"op": op_id})])
            return Outcome("ok", 1, 0)

        return op

    async def applied(self) -> Applied:
        store, room = self.env.stores[0], self.env.room
        started = time.perf_counter()
        ids: collections.Counter[str] = collections.Counter()
        problems: list[str] = []
        after = 0
        page = min(10_000, store.limits.max_page)
        while True:
            events = await store.read_log(room, after, page)
            for event in events:
                if event.seq != after + 1:
                    problems.append(f"log gap: {after} then {event.seq}")
                after = event.seq
                if event.type == self.EVENT:
                    ids[event.data["op"]] += 1
            if len(events) < page:
                break
        self.extra["fold_ms"] = round((time.perf_counter() - started) * 1000, 3)
        self.extra["events"] = after
        return Applied(ids=ids, problems=problems)


# ------------------------------------------------------------------------------ CRDT


class CrdtCounter(Scenario):
    name = "crdt"
    KEY = "counter"

    def agent(self, i: int) -> Op:
        store, node = AgentStore(self.env.store(i)), agent_name(i)
        local = [GCounter()]

        async def op(op_id: str) -> Outcome:
            await _think(self.env.think)
            mark = store.mark()
            local[0] = local[0].increment(node)
            await push(store, self.env.room, self.KEY, local[0], replica=node)
            writes, conflicts = store.since(mark)
            return Outcome("ok", writes, conflicts)

        return op

    async def applied(self) -> Applied:
        store, room = self.env.stores[0], self.env.room
        started = time.perf_counter()
        counter = await load(store, room, self.KEY, GCounter, compact_above=None)
        self.extra["read_ms"] = round((time.perf_counter() - started) * 1000, 3)
        counter = counter or GCounter()
        self.extra["replicas"] = len(counter.counts)
        return Applied(counts={int(node[1:]): n for node, n in counter.counts.items()})


# ------------------------------------------------------------------------- raw client


class Raw(Scenario):
    name = "raw"
    uses_store = False

    async def setup(self) -> None:
        self.raw: RawDoc = await open_raw(self.env.target, self.env.writers, new_doc())
        self.extra["client"] = self.raw.label

    def agent(self, i: int) -> Op:
        name, backoff, rng = agent_name(i), FullJitter(BASE, CAP), random.Random()

        async def op(op_id: str) -> Outcome:
            deadline = time.monotonic() + self.env.budget
            attempts, delay = 0, 0.0
            while True:
                doc, version = await self.raw.read(i)
                await _think(self.env.think)
                attempts += 1
                if await self.raw.cas(i, bumped(doc, name), version):
                    return Outcome("ok", attempts, attempts - 1)
                delay = backoff.delay(attempts, delay, rng)
                if time.monotonic() + delay > deadline:
                    return Outcome("exhausted", attempts, attempts)
                await asyncio.sleep(delay)

        return op

    async def applied(self) -> Applied:
        doc, _ = await self.raw.read(0)
        return doc_counts(doc)

    async def close(self) -> None:
        await self.raw.close()


# -------------------------------------------------------------------- broken on purpose


class BlindWrite(Scenario):
    """Read, think, write without any compare: the classic lost update."""

    name = "blind"

    async def setup(self) -> None:
        await self._put_doc()

    def agent(self, i: int) -> Op:
        store, name = AgentStore(self.env.store(i), self.env.think), agent_name(i)

        async def op(op_id: str) -> Outcome:
            doc = (await store.read(self.env.room, [DOC])).value(DOC)
            await store.transact(self.env.room, writes=[Put(DOC, bumped(doc, name))])
            return Outcome("ok", 1, 0)

        return op

    async def applied(self) -> Applied:
        return await self._doc_counts()


_ALL: tuple[type[Scenario], ...] = (
    CasNone,
    CasExp,
    CasFull,
    CasDecorrelated,
    WholeLock,
    Leases,
    DesignatedWriter,
    WriterIncrements,
    AppendLog,
    CrdtCounter,
    Raw,
    BlindWrite,
)
SCENARIOS: dict[str, type[Scenario]] = {s.name: s for s in _ALL}
HIDDEN = frozenset({"blind"})
POLICIES: tuple[str, ...] = tuple(s.name for s in _ALL if s.name not in HIDDEN)

DESCRIPTIONS = {
    "cas-none": "whole-document compare-and-swap (commit), retried at once",
    "cas-exp": "whole-document compare-and-swap, exponential backoff (no jitter)",
    "cas-full": "whole-document compare-and-swap, full jitter (the default)",
    "cas-decorrelated": "whole-document compare-and-swap, decorrelated jitter",
    "lock": "whole-document lock (fenced; queued wait_acquire), read-think-write under it; "
    "rejection = acquisition tries that found it held",
    "lease": "per-task leases: claim_next, think under the lease, complete (2 writes)",
    "writer": "designated writer applying conditional intents in order, in batches; "
    "rejection = intents whose predicate no longer held",
    "writer-inc": "designated writer applying unconditional increments in order, in batches",
    "log": "append-only log, state as the fold of the log",
    "crdt": "CRDT G-counter, local increment + push to its own replica record",
    "raw": "raw client compare-and-set loop (full jitter): the ratio's denominator",
    "blind": "BROKEN on purpose: unconditional write (must be caught losing updates)",
}


def writer_available() -> bool:
    try:
        import agentrooms.writer  # noqa: F401
    except ImportError:
        return False
    return True


def uses_store(policy: str) -> bool:
    return SCENARIOS[policy].uses_store


def make_scenario(policy: str, env: CellEnv) -> Scenario:
    return SCENARIOS[policy](env)
