"""Cursors: each agent's cursor delivers every event once across consumer kills.

A producer (the run itself) appends events to a room while consumers read them with
``read_new(agent, ack="explicit")``, record each event as processed (flushed) and then
``ack`` it. One consumer per agent, and two consumers that share one agent's cursor.
Each consumer life may be killed at one point: before processing an event, after
processing it (before its ack), in the middle of its ack, or after it (a slot's first
life at the slot's own point, in that order; later lives at a seeded one);
``kill -9`` of its own process (a task is ended instead on ``memory://``), then the
run starts it again. Journal: ``read`` (the seqs delivered), ``process`` (one event),
``ack`` (its seq; the cursor's position it answered), ``kill`` (where).

:func:`check_cursors` asserts, per agent: every event of the log was processed; each
read delivered consecutive events starting right after a position some ack had asked
for (no skip) and after every position an acknowledged ack answered before the read
began (an event comes again only if its ack was not acknowledged); an acknowledged ack
answered a position at or past its seq; the cursor ends at the log's last event.

Through MCP there is no ack tool: ``read_new_events`` moves the cursor past what it
returns (``ack="auto"``). There the consumers (:func:`auto_consumer`) only read and
process, a life may be killed in the middle of a read, before processing what a read
returned or after it, and ``check_cursors(..., ack="auto")`` asserts the auto ack's
promise instead: per agent, no event is delivered twice; each read delivered
consecutive events starting right after where an earlier read ended (or where a read
whose answer was lost may have ended); an event that no answered read delivered is
allowed only where a read's answer was lost (it may have taken it: at most once); the
cursor ends at the log's last event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from agentrooms.errors import StoreUnavailable
from agentrooms.reliability.history import Operation
from agentrooms.reliability.properties.common import (
    UNKNOWN,
    Closer,
    Journal,
    Processes,
    PropertyReport,
    die,
    die_at,
    kill_point,
    life,
    load_journals,
    prepare,
    settled,
    supervised,
    surface_of,
    task_life,
    touch,
    worker_main,
    worker_process,
)
from agentrooms.reliability.properties.http import HttpEvents
from agentrooms.rooms import Rooms
from agentrooms.rooms.events import Events
from agentrooms.store import open_store

__all__ = ["CursorWork", "check_cursors", "run_cursors"]

POINTS = ("before_process", "after_process", "mid_ack", "after_ack")
AUTO_POINTS = ("mid_read", "before_process", "after_process")
SURFACES = ("library", "http", "mcp")
SHARED = "shared"


@dataclass(frozen=True, slots=True)
class CursorWork:
    """``events`` appended by the producer; each consumer reads at most ``batch`` at a
    time; its first ``kills`` lives each end at a seeded point (with ``faults``)."""

    events: int = 30
    batch: int = 5
    kills: int = 2


class HasSeq(Protocol):
    @property
    def seq(self) -> int: ...


class Reads(Protocol):
    """What an :func:`auto_consumer` calls: :class:`~agentrooms.rooms.events.Events`,
    or :class:`~agentrooms.reliability.properties.mcp.McpEvents` through MCP."""

    async def read_new(
        self, agent: str, limit: int = 100, *, ack: Literal["auto", "explicit"] = "auto"
    ) -> Sequence[HasSeq]: ...


class CursorCalls(Reads, Protocol):
    """What a :func:`consumer` calls: :class:`~agentrooms.rooms.events.Events`, or
    :class:`~agentrooms.reliability.properties.http.HttpEvents` over HTTP."""

    async def ack(self, agent: str, seq: int) -> int: ...


def _agent(slot: int, workers: int) -> str:
    """Slots below ``workers`` each have an agent; the two after share one."""
    return f"a{slot}" if slot < workers else SHARED


async def consumer(
    events: CursorCalls,
    agent: str,
    journal: Journal,
    rng: random.Random,
    work: CursorWork,
    kill_at: tuple[int, str] | None,
    stopped: Callable[[], bool],
    in_process: bool,
) -> None:
    """Read, process and ack until the producer has stopped and nothing is left;
    ``kill_at``: (the how-many-th event this life handles, the point) to die at."""
    handled = 0
    while True:
        n = journal.call("read", agent, {"limit": work.batch})
        stop = stopped()  # read before the call: an empty read after it means the end
        try:
            got = await events.read_new(agent, rng.randint(1, work.batch), ack="explicit")
        except UNKNOWN:
            continue
        journal.ret(n, {"seqs": [e.seq for e in got]})
        if not got:
            if stop:
                return
            await asyncio.sleep(0.01)
            continue
        for event in got:
            here = kill_at if kill_at is not None and kill_at[0] == handled else None
            handled += 1
            if here and here[1] == "before_process":
                die_at(journal, agent, here[1], in_process)
            journal.note("process", agent, {"seq": event.seq})
            if here and here[1] == "after_process":
                die_at(journal, agent, here[1], in_process)
            n = journal.call("ack", agent, {"seq": event.seq})
            if here and here[1] == "mid_ack":
                journal.note("kill", agent, {"point": here[1]})
                await _ack_cut_short(events, agent, event.seq, rng, in_process)
            try:
                position = await events.ack(agent, event.seq)
            except UNKNOWN:
                continue
            journal.ret(n, {"position": position})
            if here and here[1] == "after_ack":
                die_at(journal, agent, here[1], in_process)


async def _ack_cut_short(
    events: CursorCalls, agent: str, seq: int, rng: random.Random, in_process: bool
) -> None:
    """Die while the ack is in flight: it may or may not have been applied."""
    await _cut_short(events.ack(agent, seq), rng, in_process)


async def _cut_short(call: Awaitable[object], rng: random.Random, in_process: bool) -> None:
    """Die while ``call`` is in flight (after a few steps of the event loop, or a few
    milliseconds for a process)."""
    flight = asyncio.ensure_future(call)
    if in_process:
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)
        flight.cancel()
    else:
        await asyncio.wait([flight], timeout=rng.uniform(0.0, 0.01))
    die(in_process)


async def auto_consumer(
    events: Reads,
    agent: str,
    journal: Journal,
    rng: random.Random,
    work: CursorWork,
    kill_at: tuple[int, str] | None,
    stopped: Callable[[], bool],
    in_process: bool,
) -> None:
    """Read with the auto ack and process until the producer has stopped and nothing is
    left; ``kill_at``: (the how-many-th read of this life, a point of
    :data:`AUTO_POINTS`) to die at."""
    reads = 0
    while True:
        here = kill_at[1] if kill_at is not None and kill_at[0] == reads else None
        reads += 1
        n = journal.call("read", agent, {"limit": work.batch, "ack": "auto"})
        stop = stopped()  # read before the call: an empty read after it means the end
        call = events.read_new(agent, rng.randint(1, work.batch), ack="auto")
        if here == "mid_read":
            journal.note("kill", agent, {"point": here})
            await _cut_short(call, rng, in_process)
        try:
            got = await call
        except UNKNOWN:
            continue
        journal.ret(n, {"seqs": [e.seq for e in got]})
        if here == "before_process":
            die_at(journal, agent, here, in_process)
        for event in got:
            journal.note("process", agent, {"seq": event.seq})
        if here == "after_process":
            die_at(journal, agent, here, in_process)
        if not got:
            if stop:
                return
            await asyncio.sleep(0.01)


def check_cursors(
    ops: list[Operation],
    last: int,
    cursors: dict[str, int],
    *,
    ack: Literal["auto", "explicit"] = "explicit",
) -> tuple[list[str], dict[str, int]]:
    """The anomalies of a cursors history (``last``: the log's last seq at the end;
    ``cursors``: each agent's final position; ``ack``: how its consumers read), and
    counts of what it did."""
    if ack == "auto":
        return _check_auto(ops, last, cursors)
    found: list[str] = []
    counts: Counter[str] = Counter()
    per_agent: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        per_agent[op.key].append(op)
    for agent in sorted(set(per_agent) | set(cursors)):
        mine = per_agent[agent]
        processed = Counter(op.input["seq"] for op in mine if op.op == "process")
        missing = [s for s in range(1, last + 1) if s not in processed]
        if missing:
            found.append(f"agent {agent} never processed events {missing[:10]}")
        counts["processed"] += sum(processed.values())
        counts["redelivered"] += sum(processed.values()) - len(processed)
        acks = [op for op in mine if op.op == "ack"]
        for op in acks:
            if not op.unknown and op.output["position"] < op.input["seq"]:
                found.append(
                    f"agent {agent}: ack of {op.input['seq']} answered {op.output['position']}"
                )
        for read in mine:
            if read.op != "read" or read.unknown or not read.output["seqs"]:
                continue
            counts["reads"] += 1
            seqs = read.output["seqs"]
            if seqs != list(range(seqs[0], seqs[0] + len(seqs))):
                found.append(f"agent {agent}: a read delivered {seqs}, not consecutive")
            after = seqs[0] - 1
            acked = max(
                (a.output["position"] for a in acks if a.ret is not None and a.ret < read.call),
                default=0,
            )
            asked = max(
                (a.input["seq"] for a in acks if read.ret is not None and a.call < read.ret),
                default=0,
            )
            if after < acked:
                found.append(
                    f"agent {agent}: events {seqs[0]}..{min(acked, seqs[-1])} delivered again "
                    f"after an ack of {acked} was acknowledged"
                )
            if after > asked:
                found.append(
                    f"agent {agent}: a read started after {after}, "
                    f"but no ack had asked past {asked}"
                )
        if cursors.get(agent) != last:
            found.append(f"agent {agent}: cursor ends at {cursors.get(agent)}, not {last}")
    counts["events"] = last
    counts["agents"] = len(cursors)
    counts["kills"] = sum(op.op == "kill" for op in ops)
    return found, dict(counts)


def _check_auto(
    ops: list[Operation], last: int, cursors: dict[str, int]
) -> tuple[list[str], dict[str, int]]:
    """:func:`check_cursors` for consumers that read with the auto ack."""
    found: list[str] = []
    counts: Counter[str] = Counter({"lost_to_unknown_reads": 0})
    per_agent: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        if op.op == "read":
            per_agent[op.key].append(op)
    for agent in sorted(set(per_agent) | set(cursors)):
        answered = [r for r in per_agent[agent] if not r.unknown and r.output["seqs"]]
        lost = [r for r in per_agent[agent] if r.unknown]
        delivered = Counter(s for r in answered for s in r.output["seqs"])
        found.extend(
            f"agent {agent}: event {s} delivered {k} times with the auto ack"
            for s, k in sorted(delivered.items())
            if k > 1
        )
        ends = {0} | {r.output["seqs"][-1] for r in answered}
        for read in answered:
            seqs = read.output["seqs"]
            counts["reads"] += 1
            if seqs != list(range(seqs[0], seqs[0] + len(seqs))):
                found.append(f"agent {agent}: a read delivered {seqs}, not consecutive")
            blind = any(r.call < (read.ret or 0) for r in lost)
            if seqs[0] - 1 not in ends and not blind:
                found.append(
                    f"agent {agent}: a read started after {seqs[0] - 1}, where no read ended"
                )
        missing = [s for s in range(1, last + 1) if s not in delivered]
        if missing and not lost:
            found.append(f"agent {agent}: events {missing[:10]} never delivered")
        counts["delivered"] += sum(delivered.values())
        counts["lost_to_unknown_reads"] += len(missing) if lost else 0
        if cursors.get(agent) != last:
            found.append(f"agent {agent}: cursor ends at {cursors.get(agent)}, not {last}")
    counts["events"] = last
    counts["agents"] = len(cursors)
    counts["kills"] = sum(op.op == "kill" for op in ops)
    return found, dict(counts)


async def run_cursors(
    url: str,
    room: str,
    *,
    workers: int,
    seed: int,
    workdir: Path,
    faults: bool,
    work: CursorWork | None = None,
    servers: Sequence[str] = (),
    surface: str | None = None,
    started: asyncio.Event | None = None,
) -> PropertyReport:
    """Record and check one cursors history on the store at ``url`` (room ``room`` is
    created): ``workers`` agents with a consumer each, and two consumers of one shared
    agent. Consumer processes, or tasks for ``memory://``; ``faults`` kills them. With
    ``servers`` (the bases of ``agentrooms serve --dev`` processes on ``url``) the
    consumers go through ``surface`` (:func:`~.common.surface_of`): the HTTP API, each
    request to a random server, or MCP, one session per consumer (the auto ack: see
    above). ``started`` is set once the consumers run (for a caller that times faults
    of its own). ``ValueError`` for a surface that cannot be run as asked."""
    work = work or CursorWork()
    if not faults:
        work = dataclasses.replace(work, kills=0)
    in_process = prepare(url, workdir, servers)
    surface = surface_of(servers, surface)
    ack: Literal["auto", "explicit"] = "auto" if surface == "mcp" else "explicit"
    stop_file = workdir / f"{room}.stop"
    store = await open_store(url)
    slots = workers + 2
    paths: list[Path] = []
    try:
        events = (await Rooms(store).create(room)).events
        procs = Processes(MODULE, workdir)

        async def body(slot: int, incarnation: int) -> bool:
            client, path = life(workdir, "cursors", slot, incarnation)
            paths.append(path)
            rng = random.Random(f"{seed}/{client}")
            kill_at = None
            if incarnation < work.kills and ack == "auto":
                kill_at = (
                    rng.randrange(max(1, work.events // work.batch)),
                    rng.choice(AUTO_POINTS),
                )
            elif incarnation < work.kills:
                # a slot's first life dies at its own point, so that each run reaches
                # every point that its slots reach (slot 1's own agent: after
                # processing, before the ack, whose event must then come again)
                point = POINTS[slot % len(POINTS)] if incarnation == 0 else rng.choice(POINTS)
                kill_at = (rng.randrange(work.events // 2), point)
            agent = _agent(slot, workers)
            if not in_process:
                spec = {
                    "url": url,
                    "room": room,
                    "client": client,
                    "out": str(path),
                    "seed": seed,
                    "agent": agent,
                    "kill_at": kill_at,
                    "stop": str(stop_file),
                    "work": dataclasses.asdict(work),
                    "servers": list(servers),
                    "surface": surface,
                }
                return await procs.run(slot, spec)
            return await task_life(
                path,
                client,
                lambda journal: consumer(
                    events, agent, journal, rng, work, kill_at, stop_file.exists, True
                ),
            )

        async with supervised(slots, body, None if in_process else procs, started) as run:
            await _produce(events, work.events, random.Random(f"{seed}/producer"))
            touch(stop_file)
            await run
        ops = load_journals(paths)
        agents = {_agent(s, workers) for s in range(slots)}
        cursors = {a: await settled(functools.partial(events.cursor, a)) for a in agents}
        last = await settled(lambda: store.last_seq(room))
        anomalies, counts = check_cursors(ops, last, cursors, ack=ack)
    finally:
        await store.close()
    return PropertyReport(
        "cursors",
        len(ops),
        sum(op.unknown for op in ops),
        anomalies,
        counts.get("kills", 0),
        counts,
    )


async def _produce(events: Events, count: int, rng: random.Random) -> None:
    """Append ``count`` events (type ``item``), a few milliseconds apart. Each has a
    command id, so a post whose outcome was unknown (``StoreUnavailable``: a store
    fault) is sent again and appended once."""
    for i in range(count):
        while True:
            try:
                await events.post("item", i, command_id=f"item-{i}")
                break
            except StoreUnavailable:
                await asyncio.sleep(0.05)
        await asyncio.sleep(rng.uniform(0.0, 0.01))


async def _connect(spec: dict[str, Any]) -> tuple[CursorCalls | Reads, list[Closer]]:
    """What a consumer process calls: the log over HTTP or MCP, or through its own
    store."""
    if spec["surface"] == "mcp":
        from agentrooms.reliability.properties.mcp import McpEvents  # the MCP SDK: slow

        mcp = McpEvents(spec["servers"], spec["room"], spec["agent"], seed=spec["client"])
        return mcp, [mcp.close]
    if spec["surface"] == "http":
        http = HttpEvents(spec["servers"], spec["room"], seed=spec["client"])
        return http, [http.close]
    store = await open_store(spec["url"])
    return Rooms(store).room(spec["room"]).events, [store.close]


async def _consumer_process(spec: dict[str, Any]) -> None:
    rng = random.Random(f"{spec['seed']}/{spec['client']}")
    stop = Path(spec["stop"])
    work, kill_at = CursorWork(**spec["work"]), kill_point(spec)

    async def body(events: CursorCalls | Reads, journal: Journal) -> None:
        if spec["surface"] == "mcp":
            await auto_consumer(
                events, spec["agent"], journal, rng, work, kill_at, stop.exists, False
            )
        else:
            assert isinstance(events, HttpEvents | Events)
            await consumer(events, spec["agent"], journal, rng, work, kill_at, stop.exists, False)

    await worker_process(spec, _connect, body)


MODULE = "agentrooms.reliability.properties.cursors"


def main(argv: Sequence[str] | None = None) -> None:
    """One consumer: ``python -m agentrooms.reliability.properties.cursors SPEC``."""
    worker_main(MODULE, "consumer", _consumer_process, argv)


if __name__ == "__main__":
    main()
