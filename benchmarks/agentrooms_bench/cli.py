"""``agentrooms bench``: the command line of the benchmark suite.

The library's ``agentrooms bench`` hands its arguments to :data:`app` when this
distribution (``agentrooms-bench``) is installed; ``python -m agentrooms_bench`` runs it
directly. Exit codes follow the library's CLI: 0 ok, 1 a cell lost or duplicated an
update, 2 a usage error, 3 a cell crashed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

__all__ = ["app", "main"]

T = TypeVar("T")

app = typer.Typer(add_completion=False)

QUICK = {"writers": "1,4,16", "think": "0,5", "repetitions": 1, "duration": 0.3, "warmup": 0.1}
FULL = {"writers": "1,2,4,8,16,32,64", "think": "0,5,50", "repetitions": 3, "duration": 2.0}


def _numbers(text: str, what: str, kind: Callable[[str], T]) -> tuple[T, ...]:
    try:
        values = tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{what} must be a comma-separated list of numbers") from exc
    if not values:
        raise typer.BadParameter(f"{what} must not be empty")
    return values


@app.command()
def bench(
    url: Annotated[
        str | None,
        typer.Option("--url", help="Measure this one store (rooms unique to each cell)"),
    ] = None,
    backends: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: memory,sqlite,redis,postgres on their default local "
            "servers, each isolated to the run (default: sqlite)"
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", help="Output directory; rerun with it to resume")
    ] = Path("bench-results/agentrooms-bench"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Writers 1,4,16, think 0,5 ms, 1 repetition, short")
    ] = False,
    policies: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated, default all: cas-none, cas-exp, cas-full, cas-decorrelated, "
            "lock, lease, writer, log, crdt, raw"
        ),
    ] = None,
    writers: Annotated[
        str | None, typer.Option(help="Writer counts (default 1,2,4,8,16,32,64)")
    ] = None,
    think: Annotated[
        str | None, typer.Option(help="Think times in ms between read and write (default 0,5,50)")
    ] = None,
    repetitions: Annotated[
        int | None, typer.Option(help="Repetitions per cell (default 3; --quick: 1)")
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(help="Seconds of closed loop, and of open loop, per cell (default 2)"),
    ] = None,
    open_duration: Annotated[float | None, typer.Option(hidden=True)] = None,
    warmup: Annotated[float | None, typer.Option(hidden=True)] = None,
    load: Annotated[
        float, typer.Option(help="Open-loop arrival rate as a share of closed-loop goodput")
    ] = 0.5,
    rate: Annotated[
        float | None,
        typer.Option(help="Fixed open-loop arrival rate (updates/s) for every cell instead"),
    ] = None,
    budget: Annotated[float, typer.Option(help="Seconds an update may take before giving up")] = (
        10.0
    ),
    lock_agents: Annotated[int, typer.Option(help="Agents in the lock fairness test")] = 48,
    peers: Annotated[
        bool,
        typer.Option(
            "--peers/--no-peers",
            help="Also the peer libraries: python-redis-lock, pottery, eventsourcing, LangGraph",
        ),
    ] = True,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write PNG plots")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="A line per cell")] = False,
) -> None:
    """Benchmark the write policies against the raw client and peer libraries.

    Policies x writer counts x think times, closed loop (goodput) and open loop (latency
    at a fixed arrival rate), every cell checked for lost or duplicated updates (exit
    code 1 if any). Results go to --out as JSON lines; a rerun with the same --out skips
    finished cells. Then summary.md, summary.csv and plots/*.png.
    """
    from agentrooms_bench import HIDDEN, POLICIES, Settings, run_bench
    from agentrooms_bench import loop as bench_loop

    if url is not None and backends is not None:
        raise typer.BadParameter("give --url or --backends, not both")
    preset: dict[str, Any] = QUICK if quick else FULL
    chosen = tuple(p.strip() for p in (policies or ",".join(POLICIES)).split(",") if p.strip())
    unknown = [p for p in chosen if p not in POLICIES and p not in HIDDEN]
    if unknown:
        raise typer.BadParameter(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    counts = _numbers(writers or preset["writers"], "--writers", int)
    thinks = _numbers(think or preset["think"], "--think", float)
    if min(counts) < 1 or min(thinks) < 0:
        raise typer.BadParameter("writers must be >= 1 and think times >= 0")
    if repetitions is not None and repetitions < 1:
        raise typer.BadParameter("--repetitions must be at least 1")
    seconds = duration if duration is not None else float(preset["duration"])
    settings = Settings(
        policies=chosen,
        writers=counts,
        think_ms=thinks,
        repetitions=repetitions if repetitions is not None else int(preset["repetitions"]),
        duration=seconds,
        open_duration=open_duration if open_duration is not None else seconds,
        warmup=warmup if warmup is not None else float(preset.get("warmup", min(1.0, seconds / 4))),
        load=load,
        rate=rate,
        budget=budget,
        lock_agents=lock_agents,
        peers=peers,
        quick=quick,
    )
    names = None if backends is None else [b.strip() for b in backends.split(",") if b.strip()]
    code = bench_loop.run(
        run_bench(
            settings,
            out,
            backends=names,
            url=url,
            console=Console(),  # the bench's reports print Rich markup of their own
            verbose=verbose,
            plots=plots,
        )
    )
    raise typer.Exit(code)


def main() -> None:
    """``python -m agentrooms_bench``: the suite's command line on its own."""
    app(prog_name="agentrooms bench")
