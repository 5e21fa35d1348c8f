"""Cursors: each agent's cursor delivers every event once across consumer kills.

A producer (the run itself) appends events to a room while consumers read them with
``read_new(agent, ack="explicit")``, record each event as processed (flushed) and then
``ack`` it. One consumer per agent, and two consumers that share one agent's cursor.
Each consumer life may be killed at one seeded point: before processing an event,
after processing it (before its ack), in the middle of its ack, or after it;
``kill -9`` of its own process (a task is ended instead on ``memory://``), then the
run starts it again. Journal: ``read`` (the seqs delivered), ``process`` (one event),
``ack`` (its seq; the cursor's position it answered), ``kill`` (where).

:func:`check_cursors` asserts, per agent: every event of the log was processed; each
read delivered consecutive events starting right after a position some ack had asked
for (no skip) and after every position an acknowledged ack answered before the read
began (an event comes again only if its ack was not acknowledged); an acknowledged ack
answered a position at or past its seq; the cursor ends at the log's last event.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from agentrooms.errors import StoreUnavailable
from agentrooms.reliability.history import Operation
from agentrooms.reliability.properties.common import (
    INCARNATIONS,
    Journal,
    Killed,
    Processes,
    PropertyReport,
    Supervisor,
    abandon,
    die,
    load_journals,
    prepare,
    ready_then_wait,
    touch,
)
from agentrooms.reliability.properties.http import HttpEvents
from agentrooms.rooms import Rooms
from agentrooms.rooms.events import Events
from agentrooms.store import Store, open_store

__all__ = ["CursorWork", "check_cursors", "run_cursors"]

POINTS = ("before_process", "after_process", "mid_ack", "after_ack")
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


class CursorCalls(Protocol):
    """What a consumer calls: :class:`~agentrooms.rooms.events.Events`, or
    :class:`~agentrooms.reliability.properties.http.HttpEvents` over HTTP."""

    async def read_new(
        self, agent: str, limit: int = 100, *, ack: Literal["auto", "explicit"] = "auto"
    ) -> Sequence[HasSeq]: ...

    async def ack(self, agent: str, seq: int) -> int: ...


UNKNOWN = (StoreUnavailable, ConnectionError, TimeoutError)
"""What a call raises when its outcome is unknown (``UnknownOutcome`` over HTTP is a
``ConnectionError``)."""


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
                _kill(journal, agent, here[1], in_process)
            journal.note("process", agent, {"seq": event.seq})
            if here and here[1] == "after_process":
                _kill(journal, agent, here[1], in_process)
            n = journal.call("ack", agent, {"seq": event.seq})
            if here and here[1] == "mid_ack":
                await _ack_cut_short(events, agent, event.seq, rng, in_process)
            try:
                position = await events.ack(agent, event.seq)
            except UNKNOWN:
                continue
            journal.ret(n, {"position": position})
            if here and here[1] == "after_ack":
                _kill(journal, agent, here[1], in_process)


def _kill(journal: Journal, agent: str, point: str, in_process: bool) -> None:
    journal.note("kill", agent, {"point": point})
    die(in_process)


async def _ack_cut_short(
    events: CursorCalls, agent: str, seq: int, rng: random.Random, in_process: bool
) -> None:
    """Die while the ack is in flight (after a few steps of the event loop, or a few
    milliseconds for a process): it may or may not have been applied."""
    ack = asyncio.ensure_future(events.ack(agent, seq))
    if in_process:
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)
        ack.cancel()
    else:
        await asyncio.wait([ack], timeout=rng.uniform(0.0, 0.01))
    die(in_process)


def check_cursors(
    ops: list[Operation], last: int, cursors: dict[str, int]
) -> tuple[list[str], dict[str, int]]:
    """The anomalies of a cursors history (``last``: the log's last seq at the end;
    ``cursors``: each agent's final position), and counts of what it did."""
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
    started: asyncio.Event | None = None,
) -> PropertyReport:
    """Record and check one cursors history on the store at ``url`` (room ``room`` is
    created): ``workers`` agents with a consumer each, and two consumers of one shared
    agent. Consumer processes, or tasks for ``memory://``; ``faults`` kills them. With
    ``servers`` (the bases of ``agentrooms serve --dev`` processes on ``url``) the
    consumers go through the HTTP API, each request to a random server. ``started`` is
    set once the consumers run (for a caller that times faults of its own)."""
    work = work or CursorWork()
    if servers and url.startswith("memory:"):
        raise ValueError("servers cannot share a memory:// store")
    if not faults:
        work = dataclasses.replace(work, kills=0)
    prepare(workdir)
    stop_file = workdir / f"{room}.stop"
    store = await open_store(url)
    slots = workers + 2
    paths: list[Path] = []
    try:
        events = (await Rooms(store).create(room)).events
        in_process = url.startswith("memory:")
        procs = Processes("agentrooms.reliability.properties.cursors", workdir)

        async def body(slot: int, incarnation: int) -> bool:
            client = slot * INCARNATIONS + incarnation
            paths.append(workdir / f"cursors-{client}.jsonl")
            rng = random.Random(f"{seed}/{client}")
            kill_at = None
            if incarnation < work.kills:
                kill_at = (rng.randrange(work.events // 2), rng.choice(POINTS))
            if not in_process:
                spec = {
                    "url": url,
                    "room": room,
                    "client": client,
                    "out": str(paths[-1]),
                    "seed": seed,
                    "agent": _agent(slot, workers),
                    "kill_at": kill_at,
                    "stop": str(stop_file),
                    "work": dataclasses.asdict(work),
                    "servers": list(servers),
                }
                return await procs.run(slot, spec)
            journal = Journal(paths[-1], client)
            try:
                await consumer(
                    events,
                    _agent(slot, workers),
                    journal,
                    rng,
                    work,
                    kill_at,
                    stop_file.exists,
                    True,
                )
            except Killed:
                return False
            finally:
                journal.close()
            return True

        run = asyncio.create_task(Supervisor(slots, body).run())
        try:
            if not in_process:
                await procs.release(slots, run)
            if started is not None:
                started.set()
            await _produce(events, work.events, random.Random(f"{seed}/producer"))
            touch(stop_file)
            await run
        finally:
            await abandon(run)
        ops = load_journals(paths)
        cursors = {a: await events.cursor(a) for a in {_agent(s, workers) for s in range(slots)}}
        anomalies, counts = check_cursors(ops, await store.last_seq(room), cursors)
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
    """Append ``count`` events (type ``item``), a few milliseconds apart."""
    for i in range(count):
        await events.post("item", i)
        await asyncio.sleep(rng.uniform(0.0, 0.01))


async def _consumer_process(spec: dict[str, Any]) -> None:
    store: Store | None = None
    http: HttpEvents | None = None
    if spec["servers"]:
        http = HttpEvents(spec["servers"], spec["room"], seed=spec["client"])
        events: CursorCalls = http
    else:
        store = await open_store(spec["url"])
        events = Rooms(store).room(spec["room"]).events
    await ready_then_wait(spec)
    journal = Journal(spec["out"], spec["client"])
    try:
        rng = random.Random(f"{spec['seed']}/{spec['client']}")
        kill_at = (
            None if spec["kill_at"] is None else (int(spec["kill_at"][0]), str(spec["kill_at"][1]))
        )
        stop = Path(spec["stop"])
        await consumer(
            events,
            spec["agent"],
            journal,
            rng,
            CursorWork(**spec["work"]),
            kill_at,
            stop.exists,
            False,
        )
    finally:
        journal.close()
        with contextlib.suppress(Exception):
            if store is not None:
                await store.close()
            if http is not None:
                await http.close()


def main(argv: Sequence[str] | None = None) -> None:
    """One consumer: ``python -m agentrooms.reliability.properties.cursors SPEC``."""
    parser = argparse.ArgumentParser(prog="python -m agentrooms.reliability.properties.cursors")
    parser.add_argument("spec", help="the consumer's JSON spec")
    asyncio.run(_consumer_process(json.loads(parser.parse_args(argv).spec)))


if __name__ == "__main__":
    main()
