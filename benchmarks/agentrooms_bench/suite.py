"""A whole run: the cells of every backend, resumable, with progress and the summary."""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from agentrooms.reliability.stores import Target, backend_of, provision, reachable
from agentrooms_bench.peers import PeerSpec, peer_specs, run_peer
from agentrooms_bench.plots import available as plots_available
from agentrooms_bench.plots import plot_report
from agentrooms_bench.records import Output
from agentrooms_bench.report import (
    build_report,
    machine,
    markdown,
    print_report,
    write_csv,
    write_peer_csv,
)
from agentrooms_bench.runner import CellSpec, Settings, run_cell
from agentrooms_bench.scenarios import writer_available

__all__ = ["EXIT_FAILED", "EXIT_LOST", "EXIT_USAGE", "run_bench"]

EXIT_LOST = 1  # a cell lost or duplicated an update
EXIT_FAILED = 3  # a cell crashed (it is not recorded: a rerun tries it again)
EXIT_USAGE = 2


def cell_specs(backend: str, settings: Settings) -> list[CellSpec]:
    """Repetitions outermost, so drift on a shared machine hits every policy alike."""
    return [
        CellSpec(backend, policy, writers, think, rep)
        for rep in range(settings.repetitions)
        for think in settings.think_ms
        for writers in settings.writers
        for policy in settings.policies
    ]


async def _store_info(target: Target) -> dict[str, Any]:
    info = await (await target.handles(1))[0].info()
    data = dataclasses.asdict(info)
    if target.name == "postgres" and target.postgres_dsn:
        import asyncpg

        from agentrooms.reliability.stores import without_query

        conn = await asyncpg.connect(without_query(target.postgres_dsn))
        try:
            data["details"]["server_version"] = await conn.fetchval("SHOW server_version")
        finally:
            await conn.close()
    return data


Spec = CellSpec | PeerSpec


@dataclasses.dataclass
class _Run:
    settings: Settings
    out: Output
    console: Console
    url: str | None
    names: list[str]
    meta: dict[str, Any]
    notes: list[str]
    verbose: bool
    id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])
    crashed: list[str] = dataclasses.field(default_factory=list)

    def plan(self) -> dict[str, list[Spec]]:
        plan: dict[str, list[Spec]] = {}
        for name in self.names:
            specs: list[Spec] = list(cell_specs(name, self.settings))
            if self.settings.peers:
                probe = Target(name, self.url or "", self.out.path)
                peers, notes = peer_specs(probe, self.settings, isolated=self.url is None)
                specs += peers
                self.notes += [f"{name}: {n}" for n in notes]
            plan[name] = specs
        return plan

    async def execute(self, plan: dict[str, list[Spec]]) -> None:
        finished = self.out.finished()
        total = sum(len(specs) for specs in plan.values())
        done = sum(1 for specs in plan.values() for spec in specs if spec.id in finished)
        if done:
            self.console.print(
                f"resuming {self.out.path}: {done} of {total} cells already finished, skipped"
            )
        columns = (
            TextColumn("[progress.description]{task.description:<44}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=self.console, transient=False) as progress:
            bar = progress.add_task("cells", total=total, completed=done)
            for name, specs in plan.items():
                todo = [spec for spec in specs if spec.id not in finished]
                if not todo:
                    continue
                try:
                    async with provision(name if self.url is None else None, self.url) as target:
                        self.meta["stores"][name] = await _store_info(target)
                        self.out.write_meta(self.meta)
                        for spec in todo:
                            progress.update(bar, description=spec.id)
                            await self.cell(spec, target, progress.console)
                            progress.advance(bar)
                except Exception as exc:  # the store cannot be opened or reached
                    progress.console.print(
                        f"[red]{name}: {type(exc).__name__}: {escape(str(exc))}[/red]"
                    )
                    self.crashed += [spec.id for spec in todo]

    async def cell(self, spec: Spec, target: Target, console: Console) -> None:
        try:
            if isinstance(spec, CellSpec):
                summary, records = await run_cell(spec, target, self.settings)
            else:
                summary, records = await run_peer(spec, target, self.settings)
        except Exception as exc:
            self.crashed.append(spec.id)
            console.print(
                f"[red]cell {spec.id} crashed:[/red] {type(exc).__name__}: {escape(str(exc))}"
            )
            return
        self.out.finish_cell(self.id, spec.id, records, summary)
        check = summary["check"]
        if check["lost"] or check["duplicated"]:
            console.print(
                f"[bold red]{spec.id}: LOST {check['lost']} / DUPLICATED "
                f"{check['duplicated']} of {check['acked']} acked updates[/bold red]"
            )
        elif self.verbose:
            console.print(_line(spec.id, summary))


async def run_bench(
    settings: Settings,
    out_dir: Path,
    *,
    backends: list[str] | None = None,
    url: str | None = None,
    console: Console | None = None,
    verbose: bool = False,
    plots: bool = True,
) -> int:
    """Run every cell not already finished in ``out_dir``, then write the summary.

    Returns the exit code: 0, ``EXIT_LOST`` if any cell (of this run or an earlier one
    in ``out_dir``) lost or duplicated an update, ``EXIT_FAILED`` if a cell crashed,
    ``EXIT_USAGE`` for a directory holding a run with other settings or a store that
    does not answer.
    """
    console = console or Console()
    out = Output(out_dir)
    meta = out.read_meta()
    if meta is not None and meta.get("signature") != settings.signature():
        console.print(
            f"[red]{out_dir} holds a run with other settings[/red] ({meta.get('signature')}); "
            "use another --out, or the same settings to resume it"
        )
        return EXIT_USAGE
    notes: list[str] = []
    if "writer" in settings.policies and not writer_available():
        kept = tuple(p for p in settings.policies if p != "writer")
        settings = dataclasses.replace(settings, policies=kept)
        notes.append("writer: agentrooms.writer is not importable yet; policy skipped")
    names = [backend_of(url)] if url is not None else list(dict.fromkeys(backends or ["sqlite"]))
    for name in [] if url is not None else names:
        problem = reachable(name)
        if problem is not None:
            console.print(f"[red]{problem}[/red]; start it or leave {name} out of --backends")
            return EXIT_USAGE
    meta = meta or {"signature": settings.signature(), "created": time.time(), "stores": {}}
    meta["settings"] = dataclasses.asdict(settings)
    meta["machine"] = machine()
    run = _Run(settings, out, console, url, names, meta, notes, verbose)
    plan = run.plan()
    meta["notes"] = run.notes
    out.write_meta(meta)
    await run.execute(plan)

    report = build_report(out)
    paths: list[Path] = []
    if plots and plots_available():
        paths = plot_report(report, out.path / "plots")
    elif plots:
        run.notes.append("plots: matplotlib is not installed (agentrooms-bench)")
    (out.path / "summary.md").write_text(markdown(report, meta, paths), encoding="utf-8")
    write_csv(report, out.path / "summary.csv")
    write_peer_csv(report, out.path / "peers.csv")
    print_report(report, console, run.notes)
    console.print(f"results in {out.path}: summary.md, summary.csv, cells.jsonl, records/, plots/")
    if run.crashed:
        console.print(
            f"[red]{len(run.crashed)} cell(s) crashed and were not recorded[/red]: "
            f"{', '.join(run.crashed[:10])}; rerun with the same --out to retry them"
        )
    if not report.ok:
        return EXIT_LOST
    return EXIT_FAILED if run.crashed else 0


def _line(cell: str, summary: dict[str, Any]) -> str:
    if summary.get("kind") == "peer":
        phases = ", ".join(f"{op} {p['goodput']:,.0f}/s" for op, p in summary["phases"].items())
        return f"  {cell}: {phases}"
    closed, opened = summary["closed"], summary.get("open") or {}
    p99 = opened.get("p99")
    return (
        f"  {cell}: {closed['goodput']:,.0f}/s, rejected {closed['rejection_rate']:.1%}, "
        f"open p99 {'-' if p99 is None else f'{p99 * 1000:.1f} ms'}, "
        f"{summary['check']['acked']} acked, 0 lost"
    )
