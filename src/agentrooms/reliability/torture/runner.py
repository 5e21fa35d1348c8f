"""The runner: the run's store, servers and clients started once, then one history after
another, each with its fault plan, healed and checked."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import sqlite3
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrooms.errors import StoreUnavailable, VersionConflict
from agentrooms.reliability.history import Operation, dump_jsonl
from agentrooms.reliability.proxy import TcpProxy
from agentrooms.reliability.recorder import (
    UNKNOWN_OUTCOME,
    LibrarySurface,
    RunReport,
    Surface,
    Workload,
    run_client,
    verify,
)
from agentrooms.reliability.servers import ServerProcess
from agentrooms.reliability.torture.clients import Pool, Worker, _wrap
from agentrooms.reliability.torture.cluster import Cluster
from agentrooms.reliability.torture.journal import (
    Journal,
    Journaled,
    Window,
    attribute,
    heal_after,
    healed,
    leaks,
)
from agentrooms.reliability.torture.settings import (
    CLIENT_CANCEL,
    CLIENT_KILL,
    HTTP_TIMEOUT,
    MCP_TIMEOUT,
    SERVER_KILL,
    SERVER_KILL_IN_FLIGHT,
    SERVER_STOP,
    SPARES,
    VERIFY_TIMEOUT,
    PlannedFault,
    Settings,
    StoreFault,
    _shown,
    fault_kinds,
    plan_faults,
)
from agentrooms.reliability.torture.summary import HistoryResult, Summary, kind_of, verdict
from agentrooms.rooms import Rooms
from agentrooms.store import Store, open_store

__all__ = ["RunStore", "run_torture"]

CREATE_BUDGET = 30.0  # seconds the runner retries creating a history's rooms, or its reads

# ------------------------------------------------------------------------------ runner


@dataclass(frozen=True, slots=True)
class RunStore:
    """The store of a run: ``url`` is what client and server processes open (through
    the rig's proxy when the run owns its store), ``direct_url`` the runner's own
    handle (past the proxy), ``faults`` the store faults the run may draw, ``proxy``
    the rig's proxy when the run draws faults and has one (Redis, PostgreSQL)."""

    url: str
    direct_url: str
    faults: list[StoreFault]
    proxy: TcpProxy | None = None


@contextlib.asynccontextmanager
async def _store(settings: Settings, workdir: Path) -> AsyncIterator[RunStore]:
    """The run's store. With ``settings.url``, that store and no store fault; else
    :func:`~agentrooms.reliability.faults.store_under_test`: a store the run owns,
    behind its proxy, with its faults when ``settings.faults`` (none on memory)."""
    if settings.url is not None:
        yield RunStore(settings.url, settings.url, [])
        return
    from agentrooms.reliability.faults import store_under_test

    async with store_under_test(settings.backend, workdir) as rig:
        faults: list[StoreFault] = list(rig.faults) if settings.faults else []
        yield RunStore(rig.url, rig.direct_url, faults, rig.proxy if faults else None)


class _Runner:
    def __init__(
        self,
        settings: Settings,
        store: RunStore,
        workdir: Path,
        out: Path,
    ) -> None:
        self.settings, self.workdir, self.out = settings, workdir, out
        self.url, self.direct_url = store.url, store.direct_url
        self.store_faults = {f.name: f for f in store.faults}
        self.proxy = store.proxy
        self.kinds = fault_kinds(settings, store.faults, proxied=store.proxy is not None)
        self.run_id = uuid.uuid4().hex[:8]
        self.store: Store | None = None  # the runner's own handle (verifying, memory)
        self.pool: Pool | None = None
        self.cluster: Cluster | None = None
        self.integrity_checks = 0

    async def start(self) -> None:
        s = self.settings
        self.store = await open_store(self.direct_url)  # prepares it, before the others
        if s.backend != "memory":
            spec = {"surface": s.surface, "url": self.url, "broken": s.broken}
            self.pool = Pool(spec)
            self.pool.spawn(s.clients + SPARES)  # while the servers start
        if s.surface != "library":
            urls = [self.url] * s.servers
            if self.proxy is not None:  # a port of the proxy's own per server: whose it is
                own = f"127.0.0.1:{self.proxy.port}"
                assert own in self.url, self.url
                ports = [await self.proxy.listen(i) for i in range(s.servers)]
                urls = [self.url.replace(own, f"127.0.0.1:{p}") for p in ports]
            procs = [ServerProcess(url, self.workdir) for url in urls]
            self.cluster = Cluster(procs)
            await self.cluster.start()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        if self.cluster is not None:
            await self.cluster.stop()
        if self.store is not None:
            await self.store.close()

    async def history(self, index: int) -> HistoryResult:
        s = self.settings
        seed = s.seed + index
        started = time.monotonic()
        room = f"torture-{self.run_id}-{seed}"
        workload = s.workload(seed)
        plan = plan_faults(seed, self.kinds, s.clients * s.ops)
        journal = Journal()
        anomalies: list[str] = []
        reports: Counter[str] = Counter()
        bases = await self._rooms(room)
        runs: list[asyncio.Task[tuple[str, Any]]] = []
        workers: list[Worker] = []
        if self.pool is None:
            assert self.store is not None
            store = _wrap(self.store, s.broken, seed)  # one broken store for all clients
            for i in range(s.clients):
                surface = LibrarySurface(store, room, interleave=True)
                journaled = Journaled(surface, functools.partial(journal.event, i))
                runs.append(asyncio.create_task(self._task(journaled, i, workload)))
        else:
            workers = await self.pool.take(s.clients)
            for i, worker in enumerate(workers):
                job = {
                    "client": i,
                    "room": room,
                    "seed": seed,
                    "workload": dataclasses.asdict(workload),
                    "bases": bases,
                }
                runs.append(asyncio.create_task(worker.run(job, journal)))
        injected: list[Window] = []
        heals: list[asyncio.Task[None]] = []
        over = asyncio.Event()  # the clients are done: heal what is still broken
        injector = asyncio.create_task(
            self._inject(plan, journal, runs, workers, injected, heals, over)
        )
        outcomes = await asyncio.gather(*runs, return_exceptions=True)
        injector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await injector
        over.set()
        anomalies += await healed(heals)
        for i, outcome in enumerate(outcomes):
            anomalies += self._outcome(i, outcome, workers, reports)
        ops = journal.close()
        errors = attribute(journal.errors, injected)
        anomalies += leaks(journal.errors)
        if s.backend == "sqlite" and any("kill" in w.kind for w in injected):
            anomalies += await self._integrity()
        final = Journal()
        report = await self._verify(ops, room, final)
        anomalies += report.anomalies
        result = HistoryResult(
            index,
            seed,
            room,
            len(ops),
            sum(o.unknown for o in ops),
            verdict(report),
            report.result.failed,
            anomalies,
            [w.kind for w in injected],
            reports,
            time.monotonic() - started,
            errors=errors,
        )
        if not result.ok:
            result.saved = self._save(result, workload, [*ops, *final.close()])
        return result

    async def _rooms(self, room: str) -> list[str]:
        """Over HTTP or MCP: wait for the servers restarting (a history starts with
        every server up, so that its server faults find one to hit), create the
        history's rooms; the servers' bases."""
        if self.cluster is None:
            return []
        from agentrooms.reliability.surfaces import logs

        await self.cluster.settled()
        bases = self.cluster.bases()
        assert self.store is not None
        rooms = Rooms(self.store)
        await asyncio.gather(*(_create(rooms, r) for r in (room, *logs(room))))
        return bases

    @staticmethod
    async def _task(surface: Journaled, client: int, workload: Workload) -> tuple[str, Any]:
        await run_client(surface, client, workload)
        return "done", {}

    def _outcome(
        self, i: int, outcome: Any, workers: list[Worker], reports: Counter[str]
    ) -> list[str]:
        """What client ``i``'s end says: its reports, and an anomaly if it crashed or
        died of something else than a fault. Its process goes back to the pool."""
        worker = workers[i] if workers else None
        if worker is not None:
            assert self.pool is not None
            if worker.killed or kind_of(outcome) == "died":
                worker.writer.close()  # its process is gone: another takes its place
                self.pool.spawn()
            else:
                self.pool.give(worker)
        if isinstance(outcome, asyncio.CancelledError):
            return []  # a cancelled client task: a fault
        if isinstance(outcome, BaseException):
            text = "".join(traceback.format_exception(outcome))[-3000:]
            return [f"client {i} crashed: {text}"]
        kind, detail = outcome
        if kind == "done":
            reports.update(detail)
            return []
        if kind == "crash":
            return [f"client {i} crashed: {detail}"]
        if worker is not None and worker.killed:
            return []
        return [f"client {i}'s process exited {detail} unasked"]

    async def _inject(
        self,
        plan: list[PlannedFault],
        journal: Journal,
        runs: list[asyncio.Task[tuple[str, Any]]],
        workers: list[Worker],
        injected: list[Window],
        heals: list[asyncio.Task[None]],
        over: asyncio.Event,
    ) -> None:
        """Inject ``plan``'s faults as the answers come (each one's window in
        ``injected``); a fault that lasts is healed by a task of ``heals`` after its
        time, or once ``over`` is set, and its window closes then (a killed server's
        once it runs again)."""
        store_heal: asyncio.Task[None] | None = None  # one store fault at a time
        for fault in plan:
            await journal.reached(fault.after)
            live = [i for i, r in enumerate(runs) if not r.done()]
            if fault.kind in (CLIENT_KILL, CLIENT_CANCEL):
                if len(live) < 1:
                    continue
                victim = live[fault.target % len(live)]
                if fault.kind == CLIENT_KILL:
                    workers[victim].kill()
                else:
                    runs[victim].cancel()
                injected.append(Window(fault.kind).closed())
                continue
            if fault.kind == SERVER_KILL_IN_FLIGHT:
                if store_heal is not None:  # the proxy's: one store fault at a time
                    await asyncio.wait([store_heal])
                store_heal = asyncio.create_task(self._kill_in_flight(fault, injected, over))
                heals.append(store_heal)
                continue
            if fault.kind in (SERVER_KILL, SERVER_STOP):
                assert self.cluster is not None
                cluster = self.cluster
                server = cluster.candidate(fault.target)
                if server is None:
                    continue
                if fault.kind == SERVER_KILL:
                    window = Window(fault.kind)
                    restart = cluster.kill(server)
                    restart.add_done_callback(window.on_done)
                    injected.append(window)
                    continue
                window = Window(fault.kind)
                cluster.pause(server)
                heal: Awaitable[None] = cluster.resumed(server)
            else:
                if store_heal is not None:
                    await asyncio.wait([store_heal])
                store_fault = self.store_faults[fault.kind]
                window = Window(fault.kind)
                await store_fault.inject()
                heal = store_fault.heal()
            injected.append(window)
            seconds = fault.seconds
            if fault.kind == SERVER_STOP and self.settings.surface == "mcp":
                # held in proportion to the MCP call's timeout, as over HTTP to its
                # own: some stops outlast their callers' timeouts
                seconds *= MCP_TIMEOUT / HTTP_TIMEOUT
            task = asyncio.create_task(heal_after(seconds, heal, over, window))
            heals.append(task)
            if fault.kind in self.store_faults:
                store_heal = task

    async def _kill_in_flight(
        self, fault: PlannedFault, injected: list[Window], over: asyncio.Event
    ) -> None:
        """Arm the proxy for ``fault.seconds`` (or until ``over``): the first server
        whose request to the store then gets its reply while another server is up is
        killed (``kill -9``) before the reply passes, and restarted in the background;
        its window opens at the kill and closes once it runs again. Not killed while
        no request came, or while only one server was up."""
        assert self.proxy is not None and self.cluster is not None
        cluster, loop = self.cluster, asyncio.get_running_loop()

        async def kill(server: int) -> bool:  # on the runner's loop
            if not cluster.up[server] or cluster.candidate(0) is None:
                return False  # at most one server down at a time
            window = Window(fault.kind)
            cluster.kill(server).add_done_callback(window.on_done)
            injected.append(window)
            return True

        async def killer(server: int) -> bool:  # on the proxy's loop
            future = asyncio.run_coroutine_threadsafe(kill(server), loop)
            return await asyncio.wrap_future(future)

        await self.proxy.kill_in_flight(killer)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(over.wait(), fault.seconds)
        finally:
            await asyncio.shield(self.proxy.kill_in_flight(None))

    async def _integrity(self) -> list[str]:
        """``PRAGMA integrity_check`` of the SQLite file (after a process was killed)."""
        from agentrooms.store.sqlite.config import parse_url

        path = parse_url(self.url).path

        def run() -> list[str]:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                rows = [str(r[0]) for r in db.execute("PRAGMA integrity_check")]
            return [] if rows == ["ok"] else [f"PRAGMA integrity_check: {rows[:5]}"]

        found = await asyncio.to_thread(run)
        self.integrity_checks += 1
        return found

    async def _verify(self, ops: list[Operation], room: str, final: Journal) -> RunReport:
        """The final reads (recorded in ``final``), through a surface of the run's,
        retried while their outcome is unknown (for :data:`CREATE_BUDGET` seconds: the
        store may still be out of reach a moment after a fault's heal); then the
        checks."""
        s = self.settings
        deadline = time.monotonic() + CREATE_BUDGET
        while True:
            surface: Surface
            if self.cluster is None:
                assert self.store is not None
                surface = LibrarySurface(self.store, room)
            else:
                from agentrooms.reliability.surfaces import HttpSurface, McpSurface

                bases = self.cluster.bases()
                if s.surface == "http":
                    surface = HttpSurface(bases, room, "verifier", timeout=VERIFY_TIMEOUT)
                else:
                    surface = McpSurface(bases, room, timeout=VERIFY_TIMEOUT)
            journaled = Journaled(surface, functools.partial(final.event, s.clients))
            try:
                return await verify(ops, journaled, s.clients, budget=s.budget)
            except UNKNOWN_OUTCOME:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
            finally:
                await surface.close()

    def _save(self, result: HistoryResult, workload: Workload, ops: list[Operation]) -> Path:
        s = self.settings
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"{s.backend}-{s.surface}-{result.seed}.jsonl"
        dump_jsonl(ops, path)
        meta = {
            "seed": result.seed,
            "backend": s.backend,
            "surface": s.surface,
            "clients": s.clients,
            "servers": s.servers if s.surface != "library" else None,
            "broken": s.broken,
            "url": None if s.url is None else _shown(s.url),
            "workload": dataclasses.asdict(workload),
            "faults": result.faults,
            "verdict": result.verdict,
            "failed_keys": result.failed_keys,
            "anomalies": result.anomalies,
            "unknown": result.unknown,
            "command": s.replay(result.seed),
        }
        meta_path = path.with_suffix(".meta.json")
        meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return path


async def run_torture(
    settings: Settings,
    out: str | Path,
    *,
    on_history: Callable[[HistoryResult, Summary], None] | None = None,
) -> Summary:
    """Run ``settings``: start the store, servers and client processes once, record
    and check histories one after another until ``settings.histories`` or
    ``settings.minutes``, save each failing one to ``out``; the totals. ``on_history``
    is called after each. ``Unsupported`` if the run cannot be done as asked; a store
    that cannot be reached raises the store's error."""
    settings.validate()
    summary = Summary(settings, Path(out))
    started = time.monotonic()
    deadline = None if settings.minutes is None else started + 60 * settings.minutes
    with tempfile.TemporaryDirectory(prefix="agentrooms-torture-") as tmp:
        async with _store(settings, Path(tmp)) as store:
            runner = _Runner(settings, store, Path(tmp), Path(out))
            try:
                await runner.start()
                index = 0
                while (settings.histories is None or index < settings.histories) and (
                    deadline is None or time.monotonic() < deadline
                ):
                    result = await runner.history(index)
                    summary.add(result)
                    summary.integrity_checks = runner.integrity_checks
                    summary.seconds = time.monotonic() - started
                    if on_history is not None:
                        on_history(result, summary)
                    index += 1
            finally:
                await runner.close()
    summary.seconds = time.monotonic() - started
    return summary


async def _create(rooms: Rooms, room: str) -> None:
    """Create ``room`` (a name of this run's own), retried while the store is out of
    reach (a fault drawn for the history before may still be healing, or a reply come
    late): a retry that finds the room there finds the first try's."""
    deadline = time.monotonic() + CREATE_BUDGET
    while True:
        try:
            await rooms.create(room)
            return
        except StoreUnavailable:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)
        except VersionConflict:
            await rooms.describe(room)  # it exists (else NotFound)
            return
