"""Recorders: concurrent clients doing random operations on one room, and the history
they leave, checked for linearizability and the log and command-id properties.

Each client issues one call at a time: reads, puts, compare-and-sets by version (every
written value is unique), deletes, appends to the room's log, reads of the whole log,
commits with command ids (a share of them re-sending an id already used, by this
client or another, as a redelivered command would) and reads of the commit key. It
records each call as an :class:`~agentrooms.reliability.history.Operation` for
:class:`~agentrooms.reliability.models.StoreModel`.

* Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process of
  the machine on Linux, so histories of client processes merge into one timeline.
* A call that raises ``StoreUnavailable``, a timeout or a connection error has an
  unknown outcome (no output, no return time). A definite failure is an output: a
  compare-and-set's conflict (with the current version), a commit that gave up after
  conflicts only (no effect). Any other exception is a bug and ends the run.
* The surface a client goes through is pluggable (:class:`Surface`):
  :class:`LibrarySurface` calls the library (``Store.read``/``transact``/``read_log``
  and ``commit``); :mod:`agentrooms.reliability.surfaces` has the HTTP and MCP ones.

:func:`record_tasks` runs the clients as asyncio tasks of this process (the only way
to share a ``memory://`` store), :func:`record_processes` as separate processes
(``python -m agentrooms.reliability.recorder``), each writing its own JSON lines.
:func:`verify` then reads the log and the commit key once more and checks everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentrooms.commit import Change, CommitOptions, View, commit
from agentrooms.errors import ContentionExhausted, StoreUnavailable, VersionConflict
from agentrooms.reliability.checker import CheckResult, check
from agentrooms.reliability.history import Operation, dump_jsonl, load_jsonl
from agentrooms.reliability.models import StoreModel
from agentrooms.retry import FullJitter, RetryPolicy
from agentrooms.store import Absent, Append, Delete, Put, Store, VersionIs, open_store

__all__ = [
    "COMMITS",
    "LOG",
    "LibrarySurface",
    "RunReport",
    "Surface",
    "Workload",
    "record_processes",
    "record_tasks",
    "verify",
]

LOG = "log"
"""The partition key of the room's log in a history."""
COMMITS = "commits"
"""The record that commits add their command ids to (and its partition key)."""
UNKNOWN_OUTCOME: tuple[type[BaseException], ...] = (
    StoreUnavailable,
    TimeoutError,
    ConnectionError,
)
"""Exceptions after which a call may or may not have taken effect."""
POLICY = RetryPolicy(max_attempts=50, budget=30.0, backoff=FullJitter(base=0.002))
"""The commit loop's policy in recorded runs: contention is the point, so it retries
long, from a small base."""


class Surface(Protocol):
    """What a recording client calls. Each method raises one of ``UNKNOWN_OUTCOME``
    when the outcome is unknown."""

    async def read(self, key: str) -> tuple[str | None, int | None]:
        """The record's value and version (``None, None`` when absent)."""
        ...

    async def put(self, key: str, value: str) -> int:
        """Write unconditionally; the new version."""
        ...

    async def cas(self, key: str, version: int | None, value: str) -> tuple[bool, int | None]:
        """Write if the version is ``version`` (``None``: if absent). ``(True, new
        version)`` or ``(False, current version)``."""
        ...

    async def delete(self, key: str) -> None: ...

    async def append(self, item: str) -> int:
        """Append an event carrying ``item``; its sequence number."""
        ...

    async def read_log(self) -> list[tuple[int, str]]:
        """Every event of the log, as ``(seq, item)``."""
        ...

    async def commit(self, command_id: str) -> tuple[int, bool | None] | None:
        """Add ``command_id`` to the commit key's list, once per id: ``(position,
        replayed)`` (``replayed`` is ``None`` where the surface does not say), or
        ``None`` when the commit gave up after conflicts only."""
        ...

    async def read_commits(self) -> list[str]: ...

    async def close(self) -> None: ...


def _add_command(view: View, command_id: str) -> Change:
    ids = view.get(COMMITS, [])
    return Change(writes=[Put(COMMITS, [*ids, command_id])], result=len(ids) + 1)


class LibrarySurface:
    """The library's own calls on ``store``. With ``interleave``, each call yields to
    the event loop before and after it, so clients that are tasks of one process overlap
    even on a backend that answers without awaiting (``memory://``)."""

    def __init__(
        self, store: Store, room: str, *, interleave: bool = False, owns_store: bool = False
    ) -> None:
        self.store, self.room = store, room
        self.interleave, self.owns_store = interleave, owns_store

    async def _around(self, call: Coroutine[Any, Any, Any]) -> Any:
        if self.interleave:
            try:
                await asyncio.sleep(0)
            except BaseException:  # cancelled before the call began: it never runs
                call.close()
                raise
        result = await call
        if self.interleave:
            await asyncio.sleep(0)
        return result

    async def read(self, key: str) -> tuple[str | None, int | None]:
        record = (await self._around(self.store.read(self.room, [key]))).get(key)
        return (None, None) if record is None else (record.value, record.version)

    async def put(self, key: str, value: str) -> int:
        done = await self._around(self.store.transact(self.room, (), [Put(key, value)]))
        version: int = done.versions[key]
        return version

    async def cas(self, key: str, version: int | None, value: str) -> tuple[bool, int | None]:
        compare = Absent(key) if version is None else VersionIs(key, version)
        try:
            done = await self._around(self.store.transact(self.room, [compare], [Put(key, value)]))
        except VersionConflict as exc:
            return False, exc.conflicts[key]
        new: int = done.versions[key]
        return True, new

    async def delete(self, key: str) -> None:
        await self._around(self.store.transact(self.room, (), [Delete(key)]))

    async def append(self, item: str) -> int:
        done = await self._around(self.store.transact(self.room, (), (), [Append("op", item)]))
        seq: int = done.seqs[0]
        return seq

    async def read_log(self) -> list[tuple[int, str]]:
        events = await self._around(self.store.read_log(self.room, 0, self.store.limits.max_page))
        return [(e.seq, e.data) for e in events]

    async def commit(self, command_id: str) -> tuple[int, bool | None] | None:
        try:
            done = await self._around(
                commit(
                    self.store,
                    self.room,
                    _add_command,
                    command_id,
                    keys=[COMMITS],
                    command_id=command_id,
                    options=CommitOptions(policy=POLICY),
                )
            )
        except ContentionExhausted:
            return None
        return done.result, done.replayed

    async def read_commits(self) -> list[str]:
        record = (await self._around(self.store.read(self.room, [COMMITS]))).get(COMMITS)
        return [] if record is None else list(record.value)

    async def close(self) -> None:
        if self.owns_store:
            await self.store.close()


@dataclass(frozen=True, slots=True)
class Workload:
    """What each client does: ``ops`` calls on ``keys`` records, the log and the commit
    key, drawn from ``seed`` (each client its own stream); ``weights`` per operation;
    ``redeliver``: the share of commits that re-send an id already drawn; ``timeout``:
    seconds after which a call's outcome counts as unknown."""

    ops: int = 50
    keys: int = 2
    seed: int = 0
    redeliver: float = 0.4
    timeout: float = 30.0
    weights: tuple[tuple[str, int], ...] = (
        ("read", 6),
        ("put", 3),
        ("cas", 5),
        ("delete", 1),
        ("append", 4),
        ("read_log", 1),
        ("commit", 4),
        ("read_commits", 1),
    )


async def run_client(surface: Surface, client: int, workload: Workload) -> list[Operation]:
    """One client's calls, in order; its history."""
    rng = random.Random(f"{workload.seed}/{client}")
    kinds = [k for k, _ in workload.weights]
    weights = [w for _, w in workload.weights]
    versions: dict[str, int | None] = {}  # the version this client last saw per key
    history: list[Operation] = []
    for n in range(workload.ops):
        kind = rng.choices(kinds, weights)[0]
        unique = f"{client}.{n}"
        key = f"k{rng.randrange(workload.keys)}"
        if kind in ("append", "read_log"):
            key = LOG
        elif kind in ("commit", "read_commits"):
            key = COMMITS
        if kind == "commit" and n and rng.random() < workload.redeliver:
            unique = f"{rng.randrange(client + 1)}.{rng.randrange(n)}"
        expected = versions.get(key)
        inp, run = _call(surface, kind, key, unique, expected)
        started = time.monotonic_ns()
        try:
            result = await asyncio.wait_for(run(), workload.timeout)
        except UNKNOWN_OUTCOME:
            history.append(Operation(client, key, kind, inp, None, started, None))
            continue
        ended = time.monotonic_ns()
        output = _output(kind, result)
        if kind in ("read", "put", "cas"):
            versions[key] = output["version"]
        elif kind == "delete":
            versions[key] = None
        history.append(Operation(client, key, kind, inp, output, started, ended))
    return history


def _call(
    surface: Surface, kind: str, key: str, unique: str, expected: int | None
) -> tuple[Any, Callable[[], Awaitable[Any]]]:
    """The recorded input of a call, and the call."""
    if kind == "read":
        return None, lambda: surface.read(key)
    if kind == "put":
        return {"value": unique}, lambda: surface.put(key, unique)
    if kind == "cas":
        return {"version": expected, "value": unique}, lambda: surface.cas(key, expected, unique)
    if kind == "delete":
        return None, lambda: surface.delete(key)
    if kind == "append":
        return {"id": unique}, lambda: surface.append(unique)
    if kind == "read_log":
        return None, surface.read_log
    if kind == "commit":
        return {"id": unique}, lambda: surface.commit(unique)
    return None, surface.read_commits


def _output(kind: str, result: Any) -> Any:
    if kind == "read":
        return {"value": result[0], "version": result[1]}
    if kind == "put":
        return {"version": result}
    if kind == "cas":
        return {"ok": result[0], "version": result[1]}
    if kind == "delete":
        return {}
    if kind == "append":
        return {"seq": result}
    if kind == "read_log":
        return {"events": [list(e) for e in result]}
    if kind == "commit":
        if result is None:
            return {"error": "contention_exhausted"}
        return {"result": result[0], "replayed": result[1]}
    return {"ids": result}


async def record_tasks(surfaces: Sequence[Surface], workload: Workload) -> list[Operation]:
    """Run one client per surface as tasks of this process; the merged history."""
    runs = [run_client(s, i, workload) for i, s in enumerate(surfaces)]
    histories = await asyncio.gather(*runs)
    return [op for h in histories for op in h]


async def record_processes(
    url: str, room: str, clients: int, workload: Workload, workdir: str | Path | None = None
) -> list[Operation]:
    """Run ``clients`` client processes through the library on the store at ``url``
    (not ``memory://``: processes do not share it), each opening its own handle; they
    start together once every one has opened its store. The merged history.
    ``RuntimeError`` if a client process fails (its stderr in the message)."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        outs = [Path(tmp) / f"client-{i}.jsonl" for i in range(clients)]
        procs = []
        for i, out in enumerate(outs):
            spec = {
                "url": url,
                "room": room,
                "client": i,
                "out": str(out),
                "workload": dataclasses.asdict(workload),
            }
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "agentrooms.reliability.recorder",
                    json.dumps(spec),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            )
        for proc in procs:  # each says "ready" once its store is open (or exits)
            assert proc.stdout is not None
            await proc.stdout.readline()
        failures = []
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            with contextlib.suppress(ConnectionError):
                await proc.stdin.drain()
            proc.stdin.close()
        for i, proc in enumerate(procs):
            _, err = await proc.communicate()
            if proc.returncode != 0:
                failures.append(f"client {i} exited {proc.returncode}: {err.decode()[-2000:]}")
        if failures:
            raise RuntimeError("; ".join(failures))
        return [op for out in outs for op in load_jsonl(out)]


@dataclass(frozen=True, slots=True)
class RunReport:
    """One run's verdict: the checker's, and each property that failed (``anomalies``)."""

    operations: int
    unknown: int
    result: CheckResult
    anomalies: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result.linearizable and not self.anomalies


async def verify(
    history: list[Operation], surface: Surface, client: int, *, budget: float | None = None
) -> RunReport:
    """Read the log and the commit key through ``surface`` (after every client has
    finished; recorded as operations of ``client``), then check the whole history for
    linearizability and the properties:

    * the log is numbered 1, 2, ... without a gap; every acknowledged append is in it
      exactly once, at the position it was acknowledged with; an append with an unknown
      outcome at most once; nothing else is;
    * a command id is in the commit key's list at most once, exactly once when a commit
      of it was acknowledged, and only if some commit sent it.

    ``budget``: the checker's (:func:`~agentrooms.reliability.checker.check`).
    """
    final = list(history)
    for kind, key in (("read_log", LOG), ("read_commits", COMMITS)):
        inp, run = _call(surface, kind, key, "", None)
        started = time.monotonic_ns()
        output = _output(kind, await run())
        final.append(Operation(client, key, kind, inp, output, started, time.monotonic_ns()))
    log: list[list[Any]] = final[-2].output["events"]
    ids: list[str] = final[-1].output["ids"]
    anomalies = _log_anomalies(history, log) + _command_anomalies(history, ids)
    return RunReport(
        len(history),
        sum(op.unknown for op in history),
        check(StoreModel(), final, budget=budget),
        anomalies,
    )


def _log_anomalies(history: list[Operation], log: list[list[Any]]) -> list[str]:
    found: list[str] = []
    seqs = [seq for seq, _ in log]
    if seqs != list(range(1, len(seqs) + 1)):
        found.append(f"the log is not numbered 1..{len(seqs)} without gaps: {seqs[:20]}...")
    count = Counter(item for _, item in log)
    at = {item: seq for seq, item in log}
    sent = set()
    for op in history:
        if op.op != "append":
            continue
        item = op.input["id"]
        sent.add(item)
        if op.unknown:
            if count[item] > 1:
                found.append(f"append {item} (outcome unknown) is in the log {count[item]} times")
        elif count[item] != 1:
            found.append(f"acknowledged append {item} is in the log {count[item]} times")
        elif at[item] != op.output["seq"]:
            found.append(f"append {item} was acknowledged as {op.output['seq']}, is {at[item]}")
    found.extend(
        f"the log holds {item}, which nobody appended" for item in count if item not in sent
    )
    return found


def _command_anomalies(history: list[Operation], ids: list[str]) -> list[str]:
    found: list[str] = []
    count = Counter(ids)
    found.extend(f"command {c} took effect {n} times" for c, n in count.items() if n > 1)
    sent = set()
    for op in history:
        if op.op != "commit":
            continue
        cid = op.input["id"]
        sent.add(cid)
        if not op.unknown and "result" in op.output and count[cid] != 1:
            found.append(f"acknowledged command {cid} took effect {count[cid]} times")
    found.extend(f"command {c} took effect but nobody sent it" for c in count if c not in sent)
    return found


def _workload(fields: dict[str, Any]) -> Workload:
    """A workload from its JSON form (``weights`` arrives as lists)."""
    weights = tuple((str(k), int(w)) for k, w in fields["weights"])
    return Workload(**{**fields, "weights": weights})


async def _client_process(spec: dict[str, Any]) -> None:
    store = await open_store(spec["url"])
    surface = LibrarySurface(store, spec["room"], owns_store=True)
    try:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # every client starts at once
        history = await run_client(surface, spec["client"], _workload(spec["workload"]))
    finally:
        await surface.close()
    dump_jsonl(history, spec["out"])


def main(argv: Sequence[str] | None = None) -> None:
    """One recording client process: ``python -m agentrooms.reliability.recorder SPEC``
    with SPEC a JSON object (url, room, client, out, workload). It prints ``ready`` once
    its store is open and starts on a line from stdin."""
    parser = argparse.ArgumentParser(prog="python -m agentrooms.reliability.recorder")
    parser.add_argument("spec", help="the client's JSON spec")
    asyncio.run(_client_process(json.loads(parser.parse_args(argv).spec)))


if __name__ == "__main__":
    main()
