"""``agentrooms torture``: the reliability suite's long tier on one backend and surface.

Registered by :mod:`agentrooms.cli`; the runner is
:func:`agentrooms.reliability.torture.run_torture` (see docs/reliability.md), or with
``--property fences|cursors|outbox``
:func:`agentrooms.reliability.properties.runner.run_properties`. Exit codes
follow the CLI's table: 0 when every history is linearizable with no anomaly, 1 when one
is not (each such history saved with the command that replays it), 2 for a run that
cannot be done as asked (``memory://`` over HTTP or MCP, a broken store over the network,
an unknown name), 3 when the run could not go on (a server or client process did not
start), 6 when the store cannot be reached.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from rich.table import Table

    from agentrooms.reliability.properties.runner import PropertySummary
    from agentrooms.reliability.torture import Summary

__all__ = ["torture"]

EXIT_CRASHED = 3  # the CLI's code for a run that could not go on
T = TypeVar("T")


def torture(
    backend: Annotated[
        str | None,
        typer.Option(help="memory, sqlite, redis or postgres (default: the --url's backend)"),
    ] = None,
    surface: Annotated[str, typer.Option(help="library, http or mcp")] = "library",
    minutes: Annotated[
        float | None, typer.Option(help="Stop after this many minutes (default 1)")
    ] = None,
    histories: Annotated[
        int | None, typer.Option(help="Stop after this many histories (the first reached)")
    ] = None,
    seed: Annotated[int, typer.Option(help="History i has seed SEED + i")] = 0,
    clients: Annotated[int, typer.Option(help="Clients per history")] = 3,
    ops: Annotated[int, typer.Option(help="Calls per client per history")] = 15,
    keys: Annotated[int, typer.Option(help="Records the clients share")] = 2,
    servers: Annotated[int, typer.Option(help="Server processes (http, mcp)")] = 3,
    out: Annotated[
        Path | None,
        typer.Option(help="Where failing histories are saved (default: a new temporary folder)"),
    ] = None,
    no_faults: Annotated[bool, typer.Option("--no-faults", help="Inject no faults")] = False,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="The store to torture (rooms named torture-*; they are left behind; no "
            "store faults). Default: a store of the run's own, removed afterwards (a "
            "temporary SQLite file, a redis-server with appendfsync always, a PostgreSQL "
            "database), reached through a fault proxy",
        ),
    ] = None,
    broken: Annotated[
        str | None,
        typer.Option(
            help="Run against a deliberately broken store (library surface): "
            "ignores-version-is, stale-reads, applies-twice, commit-drops-compares"
        ),
    ] = None,
    property: Annotated[
        str | None,
        typer.Option(
            "--property",
            help="Check a property instead of linearizability: fences, cursors or outbox "
            "(--histories counts its runs, --clients its workers)",
        ),
    ] = None,
) -> None:
    """Record and check many short concurrent histories under faults.

    Each history runs in fresh rooms: CLIENTS clients of OPS calls each
    (reads, puts, compare-and-sets, deletes, appends, commits with command
    ids), under faults drawn from what the backend and surface allow (kill -9
    of client and server processes, SIGSTOP; on a store of the run's own, the
    store's faults too: a proxy that delays, drops, resets or blackholes, or
    resets a connection with a request in flight,
    CLIENT PAUSE and a restart of Redis, pg_terminate_backend, kill -9 of a
    SQLite writer). Each is checked for
    linearizability, a gapless log and commands applied once; a failing one
    is saved to --out with the command that replays it. Exit code 0 if every
    history passed, 1 if one failed.

    With --property, each run records one property's workers instead (fences:
    no result recorded under a stale fence; cursors: each agent's cursor
    delivers every event once across consumer kills; outbox: each effect
    performed once or reconciled) and checks it.
    """

    from agentrooms.cli import EXIT_FINDING, EXIT_USAGE, console, fail
    from agentrooms.errors import BadRequest
    from agentrooms.reliability.stores import backend_of
    from agentrooms.reliability.torture import (
        HistoryResult,
        Settings,
        Unsupported,
        run_torture,
    )

    if backend is None:
        if url is None:
            fail("bad_request", "give --backend (or a store --url)", EXIT_USAGE)
        try:
            backend = backend_of(url)
        except BadRequest as exc:
            fail(exc.code, exc, EXIT_USAGE)
    if property is not None:
        return _properties(
            property,
            backend,
            surface,
            minutes,
            histories,
            seed,
            clients,
            servers,
            out,
            no_faults,
            url,
            broken,
        )
    settings = Settings(
        backend=backend,
        surface=surface,
        seed=seed,
        clients=clients,
        ops=ops,
        keys=keys,
        histories=histories,
        minutes=1.0 if minutes is None and histories is None else minutes,
        faults=not no_faults,
        broken=broken,
        url=url,
        servers=servers,
    )
    try:
        settings.validate()
    except (Unsupported, BadRequest) as exc:
        fail("bad_request", exc, EXIT_USAGE)
    folder = out if out is not None else Path(tempfile.mkdtemp(prefix="agentrooms-torture-"))

    def runs(update: Update) -> Coroutine[Any, Any, Summary]:
        def on_history(result: HistoryResult, summary: Summary) -> None:
            failing = len(summary.failing)
            status = f"{summary.operations} ops, {summary.unknown} unknown, {failing} failing"
            update(summary.histories, summary.seconds, status)

        return run_torture(settings, folder, on_history=on_history)

    title = f"torture {backend}/{surface}"
    summary = _shown(title, settings.histories, settings.minutes, url, runs)
    console.print(_table(summary))
    _failing(
        [
            (
                f"seed {result.seed}, {result.verdict} {result.failed_keys or ''}, "
                f"{len(result.anomalies)} anomalies, faults {result.faults}: {result.saved}",
                settings.replay(result.seed),
                result.anomalies,
            )
            for result in summary.failing
        ],
        f"failing histories are saved to {folder}",
    )
    raise typer.Exit(0 if summary.ok else EXIT_FINDING)


def _table(summary: Summary) -> Table:
    """The summary table of a run."""
    from rich.table import Table

    s = summary.settings
    table = Table(title=f"torture {s.backend} / {s.surface}" + (f" / {s.broken}" * bool(s.broken)))
    table.add_column("what")
    table.add_column("count", justify="right")
    rows: list[tuple[str, object]] = [
        ("histories", summary.histories),
        ("operations", summary.operations),
        ("linearizable", summary.verdicts["linearizable"]),
        ("not linearizable", summary.verdicts["not linearizable"]),
        ("undecided", summary.verdicts["undecided"]),
        ("unknown outcomes", summary.unknown),
        ("anomalies", summary.anomalies),
    ]
    rows += [(f"fault: {kind}", n) for kind, n in sorted(summary.faults.items())]
    if summary.integrity_checks:
        rows.append(
            ("SQLite integrity checks (all ok unless an anomaly)", summary.integrity_checks)
        )
    rows += [(f"reported: {how}", n) for how, n in sorted(summary.reports.items())]
    rows += [
        ("failing histories saved", len(summary.saved)),
        ("minutes", f"{summary.seconds / 60:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def _properties(
    name: str,
    backend: str,
    surface: str,
    minutes: float | None,
    histories: int | None,
    seed: int,
    clients: int,
    servers: int,
    out: Path | None,
    no_faults: bool,
    url: str | None,
    broken: str | None,
) -> None:
    """``agentrooms torture --property NAME``: the runs, their summary table, the
    failing runs; exits 0 if every run passed, 1 if one had an anomaly, 2 for runs
    that cannot be done as asked."""

    from agentrooms.cli import EXIT_FINDING, EXIT_USAGE, console, fail
    from agentrooms.reliability.properties.runner import (
        PropertyRun,
        PropertySettings,
        run_properties,
    )

    if broken is not None:
        fail(
            "bad_request", "--broken goes with the linearizability runs, not --property", EXIT_USAGE
        )
    settings = PropertySettings(
        property=name,
        backend=backend,
        surface=surface,
        seed=seed,
        runs=histories,
        minutes=1.0 if minutes is None and histories is None else minutes,
        workers=clients,
        faults=not no_faults,
        url=url,
        servers=servers,
    )
    try:
        settings.validate()
    except ValueError as exc:
        fail("bad_request", exc, EXIT_USAGE)
    folder = out if out is not None else Path(tempfile.mkdtemp(prefix="agentrooms-torture-"))

    def runs(update: Update) -> Coroutine[Any, Any, PropertySummary]:
        def on_run(run: PropertyRun, summary: PropertySummary) -> None:
            status = f"{summary.operations} ops, {len(summary.failing)} failing"
            update(summary.runs, summary.seconds, status)

        return run_properties(settings, folder, on_run=on_run)

    title = f"torture {name} {backend}/{surface}"
    summary = _shown(title, settings.runs, settings.minutes, url, runs)
    console.print(_property_table(summary))
    _failing(
        [
            (
                f"seed {run.seed}, {len(run.report.anomalies)} anomalies: {run.saved}",
                settings.replay(run.seed),
                run.report.anomalies,
            )
            for run in summary.failing
        ],
        f"failing runs are saved to {folder}",
    )
    raise typer.Exit(0 if summary.ok else EXIT_FINDING)


def _property_table(summary: PropertySummary) -> Table:
    """The summary table of the runs of a property."""
    from rich.table import Table

    s = summary.settings
    table = Table(title=f"torture --property {s.property} {s.backend} / {s.surface}")
    table.add_column("what")
    table.add_column("count", justify="right")
    rows: list[tuple[str, object]] = [
        ("runs", summary.runs),
        ("operations", summary.operations),
        ("unknown outcomes", summary.unknown),
        ("anomalies", summary.anomalies),
        ("faults injected", summary.faults + summary.server_faults),
        ("of which server kill -9, restart", summary.server_faults),
    ]
    rows += [(f"{s.property}: {what}", n) for what, n in sorted(summary.counts.items())]
    rows += [
        ("failing runs saved", len(summary.failing)),
        ("minutes", f"{summary.seconds / 60:.1f}"),
    ]
    for what, value in rows:
        table.add_row(what, str(value))
    return table


Update = Callable[[int, float, str], None]
"""Tells the progress bar: runs done, seconds so far, a status line."""


def _shown(
    title: str,
    count: int | None,
    minutes: float | None,
    url: str | None,
    runs: Callable[[Update], Coroutine[Any, Any, T]],
) -> T:
    """Run ``runs`` under a progress bar on stderr (a terminal only): ``count`` runs, or
    ``minutes``; its result. A store error exits with its code, a ``RuntimeError`` (a
    process that did not start) with 3."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentrooms.cli import _report, fail
    from agentrooms.errors import AgentroomsError

    err = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn() if count is not None else TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=err,
        disable=not err.is_terminal,
        transient=True,
    )
    task = progress.add_task(title, total=count, status="starting")

    def update(done: int, seconds: float, status: str) -> None:
        if count is None:
            assert minutes is not None
            share = seconds / (60 * minutes)
            progress.update(task, total=1.0, completed=min(1.0, share), status=status)
        else:
            progress.update(task, completed=done, status=status)

    try:
        with progress:
            return asyncio.run(runs(update))
    except AgentroomsError as exc:
        raise typer.Exit(_report(exc, url)) from exc
    except RuntimeError as exc:
        fail("torture_crashed", exc, EXIT_CRASHED)


def _failing(failing: list[tuple[str, str, list[str]]], saved: str) -> None:
    """Print the first failing runs (what, the replay command, the first anomalies),
    then where they are saved."""
    from agentrooms.cli import console, literal

    for what, replay, anomalies in failing[:10]:
        console.print(literal(f"failing: {what}"), soft_wrap=True)
        console.print(literal(f"  replay: {replay}"), soft_wrap=True)
        for anomaly in anomalies[:3]:
            console.print(literal(f"  {anomaly}"), soft_wrap=True)
    console.print(literal(saved), soft_wrap=True)
