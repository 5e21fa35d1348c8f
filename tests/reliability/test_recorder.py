"""Recorded histories through the library on every backend, checked; and each broken
store flagged in at least 19 of 20 short seeded runs (the correct store in none)."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pytest

from agentrooms.reliability.broken import BROKEN, StaleReads
from agentrooms.reliability.recorder import (
    COMMITS,
    LOG,
    LibrarySurface,
    RunReport,
    Workload,
    record_processes,
    record_tasks,
    verify,
)
from agentrooms.store import Store, open_store
from agentrooms.store.wrap import Forwarding
from tests.conftest import Backend

CLIENTS = 4  # asyncio tasks
PROCESSES = 3  # client processes (each start costs about a second of imports)


async def test_library_histories_are_linearizable_on_every_backend(backend: Backend) -> None:
    room = f"rec-{uuid.uuid4().hex[:10]}"
    workload = Workload(ops=80, seed=1)
    clients = PROCESSES if backend.shared_across_processes else CLIENTS
    store = await backend.open()
    try:
        if backend.shared_across_processes:
            history = await record_processes(backend.url, room, clients, workload)
        else:
            surfaces = [LibrarySurface(store, room, interleave=True) for _ in range(clients)]
            history = await record_tasks(surfaces, workload)
        report = await verify(history, LibrarySurface(store, room), clients)
    finally:
        await store.close()
    assert report.ok, (report.result.failed, report.anomalies)
    assert report.operations == clients * workload.ops and report.unknown == 0
    # the workload reached the paths that matter: conflicts, and redelivered commands
    assert any(op.op == "cas" and op.output["ok"] is False for op in history)
    assert any(op.op == "commit" and op.output.get("replayed") for op in history)
    keys = {p.key for p in report.result.partitions}
    assert {LOG, COMMITS} <= keys and len(keys) == 2 + workload.keys
    # the clients overlapped: some call started before another client's call returned
    calls = sorted(history, key=lambda op: op.call)
    assert any(
        b.client != a.client and a.ret is not None and b.call < a.ret
        for a, b in itertools.pairwise(calls)
    )
    print(
        f"{backend.name}: {report.operations} ops, {len(keys)} keys, checked in "
        f"{report.result.seconds:.2f}s"
    )


async def short_run(store: Store, inner: Store, seed: int) -> RunReport:
    room = "r"
    surfaces = [LibrarySurface(store, room, interleave=True) for _ in range(CLIENTS)]
    history = await record_tasks(surfaces, Workload(ops=60, seed=seed))
    return await verify(history, LibrarySurface(inner, room), CLIENTS)


def wrap(name: str, inner: Store, seed: int) -> Forwarding:
    cls = BROKEN[name]
    return cls(inner, seed=seed) if cls is StaleReads else cls(inner)


@pytest.mark.parametrize("name", sorted(BROKEN))
async def test_each_broken_store_is_flagged_in_19_of_20_runs(name: str) -> None:
    flagged = 0
    for seed in range(20):
        inner = await open_store("memory://")
        report = await short_run(wrap(name, inner, seed), inner, seed)
        flagged += not report.ok
        await inner.close()
    print(f"{name}: flagged in {flagged}/20 runs")
    assert flagged >= 19


async def test_the_correct_store_is_flagged_in_no_run() -> None:
    for seed in range(20):
        inner = await open_store("memory://")
        report = await short_run(inner, inner, seed)
        assert report.ok, (seed, report.result.failed, report.anomalies)
        await inner.close()


async def test_client_processes_run_the_workload_they_are_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    workload = Workload(ops=6, seed=3, weights=(("append", 1),))
    history = await record_processes(url, "r", 2, workload)
    assert [op.op for op in history] == ["append"] * 12
    store = await open_store(url)
    try:
        report = await verify(history, LibrarySurface(store, "r"), 2)
    finally:
        await store.close()
    assert report.ok and sorted(op.output["seq"] for op in history) == list(range(1, 13))
