"""Peer libraries measured in the same run, side by side with agentrooms.

* **Locks** (every backend; peers on Redis): ``lock_agents`` agents (48 by default) take
  one lock for ``duration`` seconds, holding it 1 ms for a read-modify-write of a counter
  *without* any compare, so a lock that ever admits two holders loses an increment (the
  check). Ours: the polling ``acquire`` and the queued ``wait_acquire``, and the queued
  lock again with the increment committed by the release (``ours-queued-fused``:
  ``release(lock, writes=...)``, one round trip less per acquisition, and fenced), and
  the fused release that also gets the agent back in line (``ours-requeue``:
  ``requeue(lock, writes=...)``, one write where the release and the next
  ``wait_acquire`` cost two, for an agent that takes the lock turn after turn). The
  fused variants' grants come with the counter (``read=["counter"]``): the release that
  hands the lock over wrote it, and passes its value on with the grant, so the new holder
  does not read it (a second round trip less); peers:
  ``python-redis-lock`` (threads, a blocking ``BLPOP`` wake-up) and pottery's
  ``AIORedlock`` (asyncio, one master). Reported: acquisitions/s and the share of a solo
  agent's rate, agents served, Jain's fairness index over per-agent acquisitions
  (1 = perfectly even, 1/N = one agent got everything), p99 wait.
* **Event sourcing** (SQLite and PostgreSQL): one writer appends ``events`` events one
  per call to one stream, then reads the stream back (full replay, no snapshots) five
  times; then ``EVENT_WRITERS`` writers append the same number of events between them,
  concurrently, one event per call (no read-back timed; the check reads every stream).
  Ours: ``sourcing.Aggregates`` (append with ``expected_version``; one stream per
  writer) and the room log (``transact`` appends, ``read_log``; one log that all writers
  append to); peer: pyeventsourcing's ``eventsourcing`` (``Application.save`` /
  ``repository.get``; one aggregate per writer, each writer on its own thread) on the
  same database (SQLite: a file beside ours; PostgreSQL: the run's temporary database).
* **Checkpoints** (PostgreSQL): LangGraph's ``AsyncPostgresSaver.aput`` against our
  ``commit`` writing the same checkpoint payload, 1 and 8 writers, each on its own thread
  (LangGraph's unit of state), closed loop; the check counts the checkpoints stored.

A peer whose package is missing is skipped with a note (``pip install
agentrooms-bench``); nothing here is needed by the library itself.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from agentrooms.commit import Change, CommitOptions, View, commit
from agentrooms.errors import LockHeld
from agentrooms.reliability.stores import Target, unique, without_query
from agentrooms.retry import FullJitter, RetryPolicy
from agentrooms.rooms import Rooms
from agentrooms.sourcing import Aggregate, Aggregates, DomainEvent
from agentrooms.store import Append, Put
from agentrooms_bench.records import OpRecord
from agentrooms_bench.runner import Settings, summarize

__all__ = ["PeerSpec", "peer_specs", "run_peer"]

HOLD = 0.001  # seconds a lock is held
EVENT_WRITERS = 8  # the concurrent writers of the event-sourcing cells, besides one
POLL_STEP = 0.01  # our polling lock's first sleep (then 2x, 3x...)


@dataclass(frozen=True)
class PeerSpec:
    backend: str
    group: str  # locks | events | checkpoints
    impl: str
    agents: int
    rep: int

    @property
    def id(self) -> str:
        return f"{self.backend}/peer-{self.group}/{self.impl}/a{self.agents}/r{self.rep}"


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def peer_specs(
    target: Target, settings: Settings, isolated: bool
) -> tuple[list[PeerSpec], list[str]]:
    """The peer cells for ``target``, and notes on what is skipped and why."""
    specs: list[PeerSpec] = []
    notes: list[str] = []
    reps = range(settings.repetitions)
    name = target.name
    locks = ["ours-polling", "ours-queued", "ours-queued-fused", "ours-requeue"]
    if name == "redis":
        for impl, module, package in (
            ("python-redis-lock", "redis_lock", "python-redis-lock"),
            ("pottery-redlock", "pottery", "pottery"),
        ):
            if installed(module):
                locks.append(impl)
            else:
                notes.append(f"{impl}: {package} is not installed (agentrooms-bench)")
    for rep in reps:
        for impl in locks:
            for agents in dict.fromkeys((1, settings.lock_agents)):
                specs.append(PeerSpec(name, "locks", impl, agents, rep))
    if name in ("sqlite", "postgres"):
        events = ["ours-aggregate", "ours-log"]
        if not installed("eventsourcing"):
            notes.append("eventsourcing: not installed (agentrooms-bench)")
        elif name == "postgres" and not isolated:
            notes.append("eventsourcing: skipped on a given --url (it would create tables there)")
        else:
            events.append("eventsourcing")
        for rep in reps:
            for writers in (1, EVENT_WRITERS):
                specs += [PeerSpec(name, "events", impl, writers, rep) for impl in events]
    if name == "postgres":
        ckpt = ["ours-commit"]
        if not installed("langgraph.checkpoint.postgres"):
            notes.append("langgraph-checkpoint-postgres: not installed (agentrooms-bench)")
        elif not isolated:
            notes.append("langgraph: skipped on a given --url (it would create tables there)")
        else:
            ckpt.append("langgraph")
        for rep in reps:
            for impl in ckpt:
                specs += [PeerSpec(name, "checkpoints", impl, n, rep) for n in (1, 8)]
    return specs, notes


async def run_peer(
    spec: PeerSpec, target: Target, settings: Settings
) -> tuple[dict[str, Any], list[OpRecord]]:
    runners: dict[str, Callable[[PeerSpec, Target, Settings], Awaitable[_Peer]]] = {
        "locks": _locks,
        "events": _events,
        "checkpoints": _checkpoints,
    }
    result = await runners[spec.group](spec, target, settings)
    summary: dict[str, Any] = {
        "kind": "peer",
        "backend": spec.backend,
        "group": spec.group,
        "impl": spec.impl,
        "agents": spec.agents,
        "rep": spec.rep,
        "phases": {
            op: summarize([r for r in result.records if r.op == op], result.elapsed.get(op, 0.0))
            for op in dict.fromkeys(r.op for r in result.records)
        },
        "check": result.check,
        "extra": result.extra,
        "finished_at": time.time(),
    }
    return summary, result.records


@dataclass
class _Peer:
    records: list[OpRecord]
    elapsed: dict[str, float]
    check: dict[str, Any]
    extra: dict[str, Any]


def _check(acked: int, applied: int) -> dict[str, Any]:
    return {
        "acked": acked,
        "in_doubt": 0,
        "applied": applied,
        "lost": max(0, acked - applied),
        "duplicated": max(0, applied - acked),
        "problems": [],
    }


def jain(counts: list[int]) -> float:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2); 1 when all equal."""
    if not counts or not any(counts):
        return 0.0
    return float(sum(counts)) ** 2 / (len(counts) * sum(c * c for c in counts))


# ------------------------------------------------------------------------------ locks


@dataclass(frozen=True)
class LockOps:
    """What an agent does with the lock."""

    take: Callable[[], Awaitable[Any]]
    give: Callable[[Any], Awaitable[None]]  # release it
    bump: Callable[[Any], Awaitable[None]]  # increment the counter (given the grant)
    # release it and take it again (in line behind the others), if the library can
    again: Callable[[Any], Awaitable[Any]] | None = None


async def _locks(spec: PeerSpec, target: Target, settings: Settings) -> _Peer:
    if spec.impl == "python-redis-lock":
        return await asyncio.to_thread(_redis_lock_threads, spec, target, settings)
    deadline = time.perf_counter() + settings.duration

    def remaining() -> float:
        """Waits end near the deadline (an agent still waiting then gives up)."""
        return max(0.1, deadline - time.perf_counter())

    if spec.impl.startswith("ours"):
        return await _our_locks(spec, target, deadline, remaining)
    return await _pottery_locks(spec, target, deadline, remaining)


async def _our_locks(
    spec: PeerSpec, target: Target, deadline: float, remaining: Callable[[], float]
) -> _Peer:
    stores = await target.handles(spec.agents)
    room = (await Rooms(stores[0]).create(unique("bench-lock"))).name
    await stores[0].transact(room, writes=[Put("counter", 0)])
    requeue = spec.impl == "ours-requeue"
    fused = requeue or spec.impl == "ours-queued-fused"
    # the fused variants' grants come with the counter: their releases write it
    wanted = ["counter"] if fused else []
    holds: list[float] = []

    def agent_ops(i: int) -> LockOps:
        store = stores[i % len(stores)]
        locks = Rooms(store).room(room).locks
        name = f"a{i}"

        async def take() -> Any:
            if spec.impl != "ours-polling":
                return await locks.wait_acquire(
                    "one", name, ttl=10, timeout=remaining(), read=wanted
                )
            # sleeps grow step, 2*step, ...: as many tries as fit before the deadline
            tries = max(1, int((2 * remaining() / POLL_STEP) ** 0.5))
            return await locks.acquire("one", name, ttl=10, tries=tries, step=POLL_STEP)

        last: list[Put] = []  # the fused variant's write, committed by the release

        async def give(lock: Any) -> None:
            await locks.release(lock, writes=last)
            last.clear()

        async def again(lock: Any) -> Any:
            writes = last[:]
            last.clear()
            return await locks.requeue(lock, writes=writes, timeout=remaining(), read=wanted)

        async def bump(lock: Any) -> None:
            if wanted:  # the grant came with it (the release that handed it over wrote it)
                value = lock.values["counter"]
            else:
                value = (await store.read(room, ["counter"])).value("counter")
            await _hold(holds)
            if fused:
                last.append(Put("counter", value + 1))
            else:
                await store.transact(room, writes=[Put("counter", value + 1)])

        return LockOps(take, give, bump, again if requeue else None)

    async def final() -> int:
        value: int = (await stores[0].read(room, ["counter"])).value("counter")
        return value

    try:
        return await _contest(spec, deadline, agent_ops, final, holds)
    finally:
        await stores[0].delete_room(room)


async def _pottery_locks(
    spec: PeerSpec, target: Target, deadline: float, remaining: Callable[[], float]
) -> _Peer:
    import redis.asyncio as aioredis
    from pottery import AIORedlock

    assert target.redis_url is not None
    client = aioredis.Redis.from_url(target.redis_url)
    key = f"{target.raw_prefix}:{unique('redlock')}"
    counter = f"{target.raw_prefix}:{unique('counter')}"
    await client.set(counter, 0)
    holds: list[float] = []

    def agent_ops(i: int) -> LockOps:
        lock = AIORedlock(key=key, masters={client}, auto_release_time=10)

        async def take() -> Any:
            if not await lock.acquire(timeout=remaining()):
                raise LockHeld("redlock", None)
            return lock

        async def give(held: Any) -> None:
            await held.release()

        async def bump(_: Any) -> None:
            value = int(await client.get(counter) or 0)
            await _hold(holds)
            await client.set(counter, value + 1)

        return LockOps(take, give, bump)

    async def final() -> int:
        return int(await client.get(counter) or 0)

    try:
        return await _contest(spec, deadline, agent_ops, final, holds)
    finally:
        await client.delete(key, counter)
        await client.aclose()


async def _contest(
    spec: PeerSpec,
    deadline: float,
    agent_ops: Callable[[int], LockOps],
    final: Callable[[], Awaitable[int]],
    holds: list[float],
) -> _Peer:
    """``spec.agents`` agents take the lock back to back until ``deadline``."""
    records: list[OpRecord] = []
    per_agent = [0] * spec.agents
    origin = time.perf_counter()

    async def agent(i: int) -> None:
        ops = agent_ops(i)
        held: Any = None  # a grant that ``again`` passes on and takes back
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                if held is None:
                    held = await ops.take()
                else:
                    assert ops.again is not None
                    held = await ops.again(held)
            except LockHeld:
                held = None
                records.append(_acquire(i, t0, origin, "exhausted"))
                continue
            records.append(_acquire(i, t0, origin, "ok"))
            try:
                await ops.bump(held)
            except BaseException:
                await ops.give(held)
                raise
            per_agent[i] += 1
            if ops.again is None:
                await ops.give(held)
                held = None
                await asyncio.sleep(0)
        if held is not None:  # the last grant ``again`` would have passed on (its write too)
            await ops.give(held)

    began = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(spec.agents)))
    elapsed = time.perf_counter() - began
    return _lock_result(records, per_agent, elapsed, await final(), holds)


def _acquire(agent: int, t0: float, origin: float, outcome: str) -> OpRecord:
    return OpRecord("peer", "acquire", agent, t0 - origin, time.perf_counter() - t0, outcome)


async def _hold(spent: list[float]) -> None:
    """Hold the lock ``HOLD`` seconds, noting how long that took: an asyncio sleep can
    overrun (epoll waits in whole milliseconds, rounded up, after any earlier wake-up)
    more than a thread's ``time.sleep``, and that overrun is not the lock's."""
    t0 = time.perf_counter()
    await asyncio.sleep(HOLD)
    spent.append(time.perf_counter() - t0)


def _lock_result(
    records: list[OpRecord], per_agent: list[int], elapsed: float, final: int, holds: list[float]
) -> _Peer:
    acquisitions = sum(per_agent)
    hold = sum(holds) / len(holds) if holds else None
    # The lock is held by one agent at a time, so the run is a chain of holds: each
    # acquisition's share of the run, less its hold, is what the lock (the handoff, the
    # counter's read and write) adds to every hold. Timer precision is in the hold.
    overhead = elapsed / acquisitions - hold if acquisitions and hold is not None else None
    return _Peer(
        records,
        {"acquire": elapsed},
        _check(acquisitions, final),
        {
            "served": sum(1 for c in per_agent if c),
            "jain": round(jain(per_agent), 4),
            "acquisitions": acquisitions,
            "hold_ms": None if hold is None else round(1000 * hold, 4),
            "overhead_ms": None if overhead is None else round(1000 * overhead, 4),
        },
    )


def _redis_lock_threads(spec: PeerSpec, target: Target, settings: Settings) -> _Peer:
    import redis

    redis_lock: Any = importlib.import_module("redis_lock")  # untyped

    assert target.redis_url is not None
    key = unique("prl")
    counter_key = f"{target.raw_prefix}:{unique('counter')}"
    admin = redis.Redis.from_url(target.redis_url)
    admin.set(counter_key, 0)
    records: list[OpRecord] = []
    per_agent = [0] * spec.agents
    holds: list[float] = []  # list.append is atomic: threads share it
    guard = threading.Lock()
    origin = time.perf_counter()
    deadline = origin + settings.duration

    def agent(i: int) -> None:
        conn = redis.Redis.from_url(target.redis_url or "")
        mine: list[OpRecord] = []
        count = 0
        try:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                lock = redis_lock.Lock(conn, key, expire=10)
                if not lock.acquire(timeout=max(0.1, deadline - time.perf_counter())):
                    mine.append(
                        OpRecord(
                            "peer", "acquire", i, t0 - origin, time.perf_counter() - t0, "exhausted"
                        )
                    )
                    continue
                mine.append(
                    OpRecord("peer", "acquire", i, t0 - origin, time.perf_counter() - t0, "ok")
                )
                try:
                    value = int(conn.get(counter_key) or 0)
                    t1 = time.perf_counter()
                    time.sleep(HOLD)
                    holds.append(time.perf_counter() - t1)
                    conn.set(counter_key, value + 1)
                    count += 1
                finally:
                    lock.release()
        finally:
            conn.close()
            with guard:
                records.extend(mine)
                per_agent[i] = count

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(spec.agents)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    final = int(admin.get(counter_key) or 0)
    admin.delete(counter_key, f"lock:{key}", f"lock-signal:{key}")
    admin.close()
    return _lock_result(records, per_agent, elapsed, final, holds)


# ------------------------------------------------------------------------ event logs


def _counter_aggregate() -> Aggregate[int]:
    def fold(state: int, event: DomainEvent) -> int:
        return state + int(event.data["by"])

    return Aggregate(
        name="BenchCounter",
        initial=lambda: 0,
        fold=fold,
        events={"Incremented": 1},
        snapshot_every=0,
    )


def _event_count(settings: Settings) -> int:
    return 200 if settings.quick else 2000


READS = 5


async def _events(spec: PeerSpec, target: Target, settings: Settings) -> _Peer:
    count = _event_count(settings)
    writers = spec.agents
    per = count // writers
    if spec.impl == "eventsourcing":
        return await asyncio.to_thread(_eventsourcing, target, writers, per)
    records: list[OpRecord] = []
    store = (await target.handles(1))[0]
    room = unique("bench-events")
    origin = time.perf_counter()
    elapsed: dict[str, float] = {}
    aggs = Aggregates(store, room, _counter_aggregate())

    async def append(writer: int) -> None:
        for n in range(per):
            t0 = time.perf_counter()
            if spec.impl == "ours-aggregate":
                events = [DomainEvent("Incremented", 1, {"by": 1})]
                await aggs.append(f"c{writer}", events, expected_version=n)
            else:
                await store.transact(room, appends=[Append("Incremented/v1", {"by": 1})])
            records.append(
                OpRecord("peer", "append", writer, t0 - origin, time.perf_counter() - t0, "ok")
            )

    async def state() -> int:
        """Every increment stored: the streams replayed, or the log read through."""
        if spec.impl == "ours-aggregate":
            loads = [aggs.load(f"c{w}", snapshots=False) for w in range(writers)]
            return sum(loaded.state for loaded in await asyncio.gather(*loads))
        total, after = 0, 0
        while True:
            events = await store.read_log(room, after, 1000)
            total += sum(int(e.data["by"]) for e in events)
            if len(events) < 1000:
                return total
            after = events[-1].seq

    began = time.perf_counter()
    await asyncio.gather(*(append(w) for w in range(writers)))
    elapsed["append"] = time.perf_counter() - began
    if writers == 1:  # read-back is timed with one stream
        began = time.perf_counter()
        for _ in range(READS):
            t0 = time.perf_counter()
            total = await state()
            records.append(OpRecord("peer", "read", 0, t0 - origin, time.perf_counter() - t0, "ok"))
        elapsed["read"] = time.perf_counter() - began
    else:
        total = await state()
    return _Peer(records, elapsed, _check(per * writers, total), {"events": per * writers})


@functools.cache
def _es_counter() -> Any:
    """The peer's aggregate class, defined once: ``eventsourcing`` registers each
    class under its topic for the process, and refuses a second class of that name."""
    from eventsourcing.domain import Aggregate as EsAggregate
    from eventsourcing.domain import event

    class Counter(EsAggregate):
        @event("Created")
        def __init__(self) -> None:
            self.n = 0

        @event("Incremented")
        def increment(self, by: int) -> None:
            self.n += by

    return Counter


def _eventsourcing(target: Target, writers: int, per: int) -> _Peer:
    from eventsourcing.application import Application

    Counter = _es_counter()
    if target.name == "sqlite":
        env = {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": str(target.scratch / f"{unique('eventsourcing')}.db"),
        }
    else:
        parts = urlsplit(without_query(target.postgres_dsn or ""))
        env = {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": parts.path.lstrip("/"),
            "POSTGRES_HOST": parts.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(parts.port or 5432),
            "POSTGRES_USER": unquote(parts.username or "postgres"),
            "POSTGRES_PASSWORD": unquote(parts.password or ""),
            "POSTGRES_SCHEMA": "public",
        }
    app: Application[uuid.UUID] = Application(env=env)
    records: list[OpRecord] = []
    elapsed: dict[str, float] = {}
    origin = time.perf_counter()
    guard = threading.Lock()
    try:
        counters = [Counter() for _ in range(writers)]
        for counter in counters:
            app.save(counter)

        def append(writer: int) -> None:
            counter, mine = counters[writer], []
            for _ in range(per):
                t0 = time.perf_counter()
                counter.increment(1)
                app.save(counter)
                mine.append(
                    OpRecord("peer", "append", writer, t0 - origin, time.perf_counter() - t0, "ok")
                )
            with guard:
                records.extend(mine)

        threads = [threading.Thread(target=append, args=(w,)) for w in range(writers)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed["append"] = time.perf_counter() - began

        def state() -> int:
            return sum(int(app.repository.get(c.id).n) for c in counters)

        if writers == 1:
            began = time.perf_counter()
            for _ in range(READS):
                t0 = time.perf_counter()
                total = state()
                records.append(
                    OpRecord("peer", "read", 0, t0 - origin, time.perf_counter() - t0, "ok")
                )
            elapsed["read"] = time.perf_counter() - began
        else:
            total = state()
    finally:
        app.close()
    return _Peer(records, elapsed, _check(per * writers, total), {"events": per * writers})


# ------------------------------------------------------------------------ checkpoints


def _checkpoint_payload(step: int) -> dict[str, Any]:
    return {
        "step": step,
        "channel_values": {"doc": {"n": step, "pad": "x" * 256}, "messages": [f"m{step}"]},
        "channel_versions": {"doc": step + 1, "messages": step + 1},
    }


async def _checkpoints(spec: PeerSpec, target: Target, settings: Settings) -> _Peer:
    if spec.impl == "langgraph":
        return await _langgraph(spec, target, settings)
    stores = await target.handles(spec.agents)
    room = unique("bench-ckpt")
    records: list[OpRecord] = []
    acked = [0] * spec.agents
    origin = time.perf_counter()
    deadline = origin + settings.duration
    policy = RetryPolicy(max_attempts=1000, budget=settings.budget, backoff=FullJitter())

    def put(view: View, payload: tuple[str, dict[str, Any]]) -> Change:
        return Change(writes=[Put(payload[0], payload[1])])

    async def agent(i: int) -> None:
        store, key = stores[i % len(stores)], f"ckpt/thread-{i}"
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            done = await commit(
                store,
                room,
                put,
                (key, _checkpoint_payload(acked[i])),
                keys=[key],
                options=CommitOptions(policy=policy),
            )
            acked[i] += 1
            records.append(
                OpRecord(
                    "peer",
                    "put",
                    i,
                    t0 - origin,
                    time.perf_counter() - t0,
                    "ok",
                    done.attempts,
                    done.attempts - 1,
                )
            )

    began = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(spec.agents)))
    elapsed = time.perf_counter() - began
    snap = await stores[0].read(room, [f"ckpt/thread-{i}" for i in range(spec.agents)])
    applied = sum(
        (snap.value(f"ckpt/thread-{i}") or {"step": -1})["step"] + 1 for i in range(spec.agents)
    )
    return _Peer(records, {"put": elapsed}, _check(sum(acked), applied), {})


async def _langgraph(spec: PeerSpec, target: Target, settings: Settings) -> _Peer:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    dsn = without_query(target.postgres_dsn or "")
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=max(1, spec.agents),
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    await pool.open()
    records: list[OpRecord] = []
    acked = [0] * spec.agents
    run = unique("lg")
    try:
        await AsyncPostgresSaver(pool).setup()
        origin = time.perf_counter()
        deadline = origin + settings.duration

        async def agent(i: int) -> None:
            saver = AsyncPostgresSaver(pool)  # one per agent: a saver serialises its calls
            config: Any = {"configurable": {"thread_id": f"{run}-{i}", "checkpoint_ns": ""}}
            checkpoint: Any = empty_checkpoint()
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                payload = _checkpoint_payload(acked[i])
                checkpoint = {
                    **checkpoint,
                    "id": str(uuid6(clock_seq=acked[i])),
                    "channel_values": payload["channel_values"],
                    "channel_versions": payload["channel_versions"],
                }
                config = await saver.aput(
                    config,
                    checkpoint,
                    {"source": "loop", "step": acked[i]},
                    payload["channel_versions"],
                )
                acked[i] += 1
                records.append(
                    OpRecord("peer", "put", i, t0 - origin, time.perf_counter() - t0, "ok")
                )

        began = time.perf_counter()
        await asyncio.gather(*(agent(i) for i in range(spec.agents)))
        elapsed = time.perf_counter() - began
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM checkpoints WHERE thread_id LIKE %s", (f"{run}-%",)
            )
            row = await cur.fetchone()
        applied = int(row["n"]) if row is not None else 0
    finally:
        await pool.close()
    return _Peer(records, {"put": elapsed}, _check(sum(acked), applied), {"threads": spec.agents})
