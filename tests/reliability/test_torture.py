"""The short tier of the torture runner: a few histories under faults on every backend
and surface, all passing with totals that add up; every broken store flagged in every
short run; a saved failing history replayed from its seed to the same verdict; and the
``agentrooms torture`` command line."""

from __future__ import annotations

import asyncio
import functools
import json
import shlex
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrooms.cli import app
from agentrooms.reliability.broken import BROKEN
from agentrooms.reliability.checker import check
from agentrooms.reliability.history import load_jsonl
from agentrooms.reliability.models import StoreModel
from agentrooms.reliability.torture import (
    CLIENT_CANCEL,
    CLIENT_KILL,
    SERVER_KILL,
    SERVER_STOP,
    Settings,
    Summary,
    fault_kinds,
    plan_faults,
    run_torture,
)

COMBINATIONS = [
    ("memory", "library"),
    *((b, s) for b in ("sqlite", "redis", "postgres") for s in ("library", "http", "mcp")),
]
REPORTED = {  # how a failure may reach a client (docs/reliability.md), and nothing else
    "ConnectError: not sent, sent to another server",
    "ConnectTimeout: not sent, sent to another server",
    "ReadTimeout: unknown outcome",
    "WriteTimeout: unknown outcome",
    "ReadError: unknown outcome",
    "WriteError: unknown outcome",
    "RemoteProtocolError: unknown outcome",
    "HTTP 503 store_unavailable: unknown outcome",
    "HTTP 412 without the current version: unknown outcome",
    "HTTP 429: waited, sent again",
    "MCPError 'Connection closed': unknown outcome",
    "MCPError timed out: unknown outcome",
    "opening a session: ExceptionGroup",
    "a reading session: ExceptionGroup",
    "closing a lost session: ExceptionGroup",
    "rate_limited: waited, called again",
    "store_unavailable: unknown outcome",
}

TYPED = {"StoreUnavailable", "cancelled (the caller's deadline)"}
"""What a library caller may see raised under these faults (the call's outcome unknown)."""


@pytest.fixture(params=COMBINATIONS, ids=lambda c: f"{c[0]}-{c[1]}")
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, str | None]:
    """A backend, a surface, and the backend's store for the test run (isolated by
    tests/conftest.py; a sync fixture: the backends' session fixtures run their own
    event loop)."""
    backend, surface = request.param
    if backend == "memory":
        return backend, surface, None
    if backend == "sqlite":
        return backend, surface, f"sqlite:///{tmp_path / 'store.db'}"
    url: str = request.getfixturevalue(f"{backend}_url")
    return backend, surface, url


def first_seed_planning_every_fault(settings: Settings, histories: int) -> int:
    """A base seed whose first ``histories`` histories plan every fault kind of the run
    (drawn from the seeds, so any run of them injects the same plan)."""
    kinds = fault_kinds(settings)
    for base in range(0, 100_000, 1000):
        planned = {
            f.kind
            for i in range(histories)
            for f in plan_faults(base + i, kinds, settings.clients * settings.ops)
        }
        if planned == set(kinds):
            return base
    raise AssertionError("no base seed plans every fault")


def assert_totals(summary: Summary, histories: int) -> None:
    assert summary.histories == histories
    assert sum(summary.verdicts.values()) == histories
    results = summary.results
    assert [r.index for r in results] == list(range(histories))
    assert summary.operations == sum(r.operations for r in results)
    assert summary.unknown == sum(r.unknown for r in results)
    assert summary.anomalies == sum(len(r.anomalies) for r in results)
    assert summary.faults == sum((Counter(r.faults) for r in results), Counter[str]())
    assert len(summary.saved) == sum(r.saved is not None for r in results)


async def test_short_torture_passes_with_faults(
    target: tuple[str, str, str | None], tmp_path: Path
) -> None:
    backend, surface, url = target
    histories = 6 if surface == "library" else 3
    base = Settings(backend, surface, histories=histories, servers=2)
    seed = first_seed_planning_every_fault(base, histories)
    settings = Settings(
        backend,
        surface,
        seed=seed,
        histories=histories,
        servers=2,
        url=url,
    )
    summary = await run_torture(settings, tmp_path / "out")
    print(
        f"{backend}/{surface}: {summary.operations} ops, {summary.unknown} unknown, "
        f"faults {dict(summary.faults)}, {summary.seconds:.1f}s; {dict(summary.reports)}"
    )
    failing = [(r.seed, r.verdict, r.anomalies[:3]) for r in summary.failing]
    assert summary.ok and not failing, failing
    assert summary.verdicts == Counter(linearizable=histories)
    assert_totals(summary, histories)
    assert summary.anomalies == 0 and not summary.saved
    assert summary.operations > histories * settings.clients * settings.ops // 2
    allowed = set(fault_kinds(settings))
    assert set(summary.faults) <= allowed and summary.faults
    client_fault = CLIENT_CANCEL if backend == "memory" else CLIENT_KILL
    assert summary.faults[client_fault] > 0
    if surface != "library":
        assert summary.faults[SERVER_KILL] > 0 and summary.faults[SERVER_STOP] > 0
    # what the surfaces counted, and what each fault's callers saw (``fault → seen``)
    seen = {k.split(" → ")[-1] for k in summary.reports}
    assert seen <= {*REPORTED, *TYPED}, summary.reports
    assert {what for _, what in summary.errors} <= {*REPORTED, *TYPED}, summary.errors
    if backend == "sqlite" and summary.faults[client_fault]:
        assert summary.integrity_checks > 0


@pytest.mark.parametrize("name", sorted(BROKEN))
async def test_each_broken_store_is_flagged_in_every_short_run(name: str, tmp_path: Path) -> None:
    """20 short runs on ``memory://`` (10 histories each, with faults), each from its own
    seed, and one on SQLite with client processes: every run is flagged."""
    flagged = []
    for run in range(20):
        settings = Settings("memory", seed=1000 * run, histories=10, broken=name)
        summary = await run_torture(settings, tmp_path / f"m{run}")
        assert_totals(summary, 10)
        flagged.append(len(summary.failing))
        assert not summary.ok, (name, run)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    summary = await run_torture(
        Settings("sqlite", histories=10, broken=name, url=url), tmp_path / "sqlite"
    )
    print(f"{name}: histories flagged per run of 10 {flagged}; sqlite {len(summary.failing)}")
    assert not summary.ok
    assert all(r.saved is not None and r.saved.exists() for r in summary.failing)


async def test_the_correct_store_is_flagged_in_no_short_run(tmp_path: Path) -> None:
    for run in range(20):
        summary = await run_torture(Settings("memory", seed=1000 * run, histories=10), tmp_path)
        assert summary.ok, [(r.seed, r.verdict, r.anomalies[:3]) for r in summary.failing]


async def test_a_saved_failing_history_replays_to_the_same_verdict_from_its_seed(
    tmp_path: Path,
) -> None:
    summary = await run_torture(
        Settings("memory", seed=40, histories=4, broken="ignores-version-is"), tmp_path / "a"
    )
    saved = summary.failing[0]
    assert saved.saved is not None
    meta = json.loads(saved.saved.with_suffix(".meta.json").read_text())
    assert meta["seed"] == saved.seed and meta["verdict"] == "not linearizable"
    assert meta["backend"] == "memory" and meta["broken"] == "ignores-version-is"
    history = load_jsonl(saved.saved)
    # the saved file holds the clients' calls and the final reads, and checks the same
    again = check(StoreModel(), history)
    assert not again.linearizable and again.failed == meta["failed_keys"]
    # the command it names runs that history alone: the same calls, the same verdict
    args = shlex.split(meta["command"])
    assert args[:2] == ["agentrooms", "torture"]
    # the command line runs its own event loop: in a thread of its own
    invoke = functools.partial(CliRunner().invoke, app, [*args[1:], "--out", str(tmp_path / "b")])
    result = await asyncio.to_thread(invoke)
    assert result.exit_code == 1, result.output
    replayed = tmp_path / "b" / saved.saved.name
    replay_meta = json.loads(replayed.with_suffix(".meta.json").read_text())
    assert replay_meta["verdict"] == meta["verdict"]
    assert replay_meta["failed_keys"] == meta["failed_keys"]
    assert replay_meta["faults"] == meta["faults"]

    def calls(path: Path) -> list[tuple[int, str, str, object, object]]:
        ops = load_jsonl(path)
        return sorted(
            ((o.client, o.key, o.op, json.dumps(o.input), json.dumps(o.output)) for o in ops),
            key=repr,
        )

    assert calls(replayed) == calls(saved.saved)


def test_the_command_line_runs_a_short_torture_and_prints_its_summary(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    args = ["torture", "--url", url, "--histories", "3", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {}
    for line in result.output.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    assert rows["histories"] == "3" and rows["linearizable"] == "3"
    assert rows["not linearizable"] == "0" and rows["anomalies"] == "0"
    assert rows["failing histories saved"] == "0"
    assert int(rows["operations"]) > 0
    assert f"saved to {tmp_path / 'out'}" in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--backend", "memory", "--surface", "http"], "memory:// lives inside one process"),
        (["--backend", "memory", "--surface", "mcp"], "memory:// lives inside one process"),
        (["--backend", "sqlite", "--surface", "http", "--broken", "stale-reads"], "library"),
        (["--backend", "memory", "--broken", "nope"], "unknown broken store"),
        (["--backend", "cassandra"], "unknown backend"),
        (["--backend", "redis", "--url", "sqlite:///x.db"], "is not a redis store"),
    ],
)
def test_a_run_that_cannot_be_done_exits_2_and_says_why(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["torture", *args, "--histories", "1"])
    assert result.exit_code == 2
    assert says in result.output
