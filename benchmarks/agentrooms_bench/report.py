"""The summary of a run: Markdown tables, CSV, console tables, and the correctness verdict.

Numbers per (backend, think time, policy, writers) are the **median over repetitions**,
with the range (min-max) of goodput beside it. Goodput, rejection rate and attempts per
update come from the closed loop; latency percentiles from the open loop (measured from
each arrival's scheduled time). ``vs raw`` is the policy's median goodput divided by the
raw client's at the same backend, think time and writer count.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import os
import platform
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentrooms_bench.records import Output
from agentrooms_bench.scenarios import DESCRIPTIONS

__all__ = ["Group", "Report", "build_report", "machine"]

PEER_PACKAGES = (
    "agentrooms",
    "redis",
    "hiredis",
    "asyncpg",
    "matplotlib",
    "python-redis-lock",
    "pottery",
    "eventsourcing",
    "psycopg",
    "langgraph-checkpoint-postgres",
)


def machine() -> dict[str, Any]:
    """CPU, memory, OS, Python and package versions of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as src:
            for line in src:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    versions: dict[str, str | None] = {}
    for package in PEER_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    import sqlite3

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory,
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "sqlite_library": sqlite3.sqlite_version,
        "packages": versions,
        "note": "one client process, one asyncio event loop; store servers on this machine",
        "event_loop": _selector(),
    }


def _selector() -> str | None:
    """The running event loop's selector (``PreciseEpollSelector``: timer waits to the
    microsecond, :mod:`agentrooms_bench.loop`), if any."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    selector = getattr(loop, "_selector", None)
    return type(loop).__name__ if selector is None else type(selector).__name__


def _median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _low(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return min(kept) if kept else None


def _high(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return max(kept) if kept else None


@dataclass
class Group:
    """One policy at one writer count (one backend, one think time), over repetitions."""

    backend: str
    think_ms: float
    policy: str
    writers: int
    cells: list[dict[str, Any]] = field(default_factory=list)
    raw_goodput: float | None = None

    def closed(self, name: str) -> float | None:
        return _median(c["closed"].get(name) for c in self.cells)

    def open(self, name: str) -> float | None:
        return _median((c.get("open") or {}).get(name) for c in self.cells)

    @property
    def goodput(self) -> float:
        return self.closed("goodput") or 0.0

    @property
    def goodput_range(self) -> tuple[float, float]:
        values = [c["closed"]["goodput"] for c in self.cells]
        return min(values), max(values)

    @property
    def lost(self) -> int:
        return sum(int(c["check"]["lost"]) for c in self.cells)

    @property
    def duplicated(self) -> int:
        return sum(int(c["check"]["duplicated"]) for c in self.cells)

    @property
    def ratio(self) -> float | None:
        return self.goodput / self.raw_goodput if self.raw_goodput else None

    def extra(self, name: str) -> float | None:
        return _median(c.get("extra", {}).get(name) for c in self.cells)

    def row(self) -> dict[str, Any]:
        low, high = self.goodput_range
        return {
            "backend": self.backend,
            "think_ms": self.think_ms,
            "policy": self.policy,
            "writers": self.writers,
            "repetitions": len(self.cells),
            "goodput": self.goodput,
            "goodput_min": low,
            "goodput_max": high,
            "vs_raw": self.ratio,
            "rejection_rate": self.closed("rejection_rate"),
            "attempts_per_update": self.closed("attempts_per_update"),
            "attempts_p99": self.closed("attempts_p99"),
            "closed_p99_s": self.closed("p99"),
            "open_rate": self.open("rate"),
            "open_p50_s": self.open("p50"),
            "open_p99_s": self.open("p99"),
            "open_p99_min_s": _low((c.get("open") or {}).get("p99") for c in self.cells),
            "open_p99_max_s": _high((c.get("open") or {}).get("p99") for c in self.cells),
            "open_p999_s": self.open("p999"),
            "open_missed": self.open("missed"),
            "exhausted": sum(c["closed"]["exhausted"] for c in self.cells),
            "errors": sum(c["closed"]["errors"] for c in self.cells),
            "acked": sum(int(c["check"]["acked"]) for c in self.cells),
            "lost": self.lost,
            "duplicated": self.duplicated,
            "fold_ms": self.extra("fold_ms"),
            "jain": self.closed("jain"),
            "served": self.closed("served"),
        }


@dataclass
class Report:
    groups: list[Group]
    peers: list[dict[str, Any]]
    failed: list[dict[str, Any]]  # cells that lost or duplicated an update
    cells: int
    acked: int

    @property
    def ok(self) -> bool:
        return not self.failed


def build_report(out: Output) -> Report:
    cells = out.cells()
    policy_cells = [c for c in cells if c.get("kind") == "policy"]
    peers = [c for c in cells if c.get("kind") == "peer"]
    by_key: dict[tuple[str, float, str, int], Group] = {}
    for cell in sorted(policy_cells, key=lambda c: (c["backend"], c["think_ms"], c["writers"])):
        key = (cell["backend"], float(cell["think_ms"]), cell["policy"], int(cell["writers"]))
        if key not in by_key:
            by_key[key] = Group(*key)
        by_key[key].cells.append(cell)
    for group in by_key.values():
        raw = by_key.get((group.backend, group.think_ms, "raw", group.writers))
        if raw is not None and raw.goodput > 0:
            group.raw_goodput = raw.goodput
    order = {name: i for i, name in enumerate(DESCRIPTIONS)}
    groups = sorted(
        by_key.values(),
        key=lambda g: (g.backend, g.think_ms, order.get(g.policy, 99), g.writers),
    )
    failed = [c for c in cells if c["check"]["lost"] or c["check"]["duplicated"]]
    acked = sum(int(c["check"]["acked"]) for c in cells)
    return Report(groups, peers, failed, len(cells), acked)


# ---------------------------------------------------------------------------- format


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 10 else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _sections(report: Report) -> list[tuple[str, float, list[Group]]]:
    sections: dict[tuple[str, float], list[Group]] = {}
    for group in report.groups:
        sections.setdefault((group.backend, group.think_ms), []).append(group)
    return [(b, t, gs) for (b, t), gs in sections.items()]


def verdict(report: Report) -> str:
    if report.ok:
        return (
            f"zero lost or duplicated updates in all {report.cells} cells "
            f"({report.acked:,} acked updates checked against the state read back)"
        )
    names = ", ".join(c["cell"] for c in report.failed[:10])
    return f"LOST OR DUPLICATED UPDATES in {len(report.failed)} of {report.cells} cells: {names}"


def markdown(report: Report, meta: dict[str, Any], plots: list[Path]) -> str:
    m = meta.get("machine", {})
    s = meta.get("settings", {})
    lines = [
        "# agentrooms bench",
        "",
        f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB, "
        f"{m.get('os')}, Python {m.get('python')}, SQLite {m.get('sqlite_library')}. "
        f"{m.get('note', '')}"
        + (f" (selector: {m['event_loop']})" if m.get("event_loop") else "")
        + ".",
        "",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in (m.get("packages") or {}).items() if v is not None)
        + ".",
        "",
        f"Settings: {s.get('repetitions')} repetition(s); closed loop {s.get('duration')} s "
        f"after {s.get('warmup')} s warm-up; open loop {s.get('open_duration')} s at "
        + (
            f"{s['rate']} arrivals/s"
            if s.get("rate")
            else f"{s.get('load')} x the cell's closed-loop goodput"
        )
        + f"; an update gives up after {s.get('budget')} s.",
        "",
        "## Stores",
        "",
        "| backend | durability | warnings | server |",
        "|---|---|---|---|",
    ]
    for name, info in (meta.get("stores") or {}).items():
        details = info.get("details") or {}
        server = details.get("redis_version") or details.get("server_version") or ""
        server = server or details.get("sqlite_version") or ""
        warnings = "; ".join(info.get("warnings") or []) or "none"
        lines.append(f"| {name} | {info.get('durability')} | {warnings} | {server} |")
    lines += [
        "",
        "## Correctness",
        "",
        ("**" + verdict(report) + "**"),
        "",
        "## Policies",
        "",
        "Goodput: acked updates/s in the closed loop (median over repetitions, range). "
        "Rejection: write attempts that did not take effect / all attempts. Latency: open "
        "loop, from each arrival's scheduled time. Jain: fairness of the acked updates "
        "over the agents in the closed loop (1 = equal shares); served: agents with at "
        "least one.",
        "",
    ]
    lines += [f"- `{name}`: {what}" for name, what in DESCRIPTIONS.items()]
    for backend, think, groups in _sections(report):
        lines += [
            "",
            f"### {backend}, think time {think:g} ms",
            "",
            "| policy | writers | goodput/s | range | vs raw | rejection | attempts/update "
            "| attempts p99 | open rate/s | p50 ms | p99 ms | p99 range | p99.9 ms | missed "
            "| Jain | served | lost | dup |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
            "|---:|---:|",
        ]
        for g in groups:
            r = g.row()
            lines.append(
                f"| {g.policy} | {g.writers} | {_rate(r['goodput'])} | "
                f"{_rate(r['goodput_min'])}-{_rate(r['goodput_max'])} | "
                f"{_num(r['vs_raw'])} | {_pct(r['rejection_rate'])} | "
                f"{_num(r['attempts_per_update'])} | {_num(r['attempts_p99'], 0)} | "
                f"{_rate(r['open_rate'])} | {_ms(r['open_p50_s'])} | {_ms(r['open_p99_s'])} | "
                f"{_ms(r['open_p99_min_s'])}-{_ms(r['open_p99_max_s'])} | "
                f"{_ms(r['open_p999_s'])} | {_num(r['open_missed'], 0)} | "
                f"{_num(r['jain'], 3)} | {_num(r['served'], 0)}/{g.writers} | {r['lost']} | "
                f"{r['duplicated']} |"
            )
        folds = [g for g in groups if g.policy == "log" and g.extra("fold_ms") is not None]
        if folds:
            lines.append("")
            lines.append(
                "Append-only log, cost of the fold (reading the whole log back once): "
                + ", ".join(
                    f"N={g.writers}: {_num(g.extra('fold_ms'))} ms for "
                    f"{_num(g.extra('events'), 0)} events"
                    for g in folds
                )
            )
    lines += _peer_markdown(report.peers, meta.get("notes") or [])
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in plots]
    return "\n".join(lines) + "\n"


def _peer_groups(
    peers: list[dict[str, Any]], group: str
) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    found: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for cell in peers:
        if cell["group"] == group:
            found.setdefault((cell["backend"], cell["impl"], int(cell["agents"])), []).append(cell)
    return found


def _phase(cells: list[dict[str, Any]], op: str, name: str) -> float | None:
    return _median((c["phases"].get(op) or {}).get(name) for c in cells)


def peer_rows(peers: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Peer numbers (medians over repetitions), by group."""
    rows: dict[str, list[dict[str, Any]]] = {"locks": [], "events": [], "checkpoints": []}
    locks = _peer_groups(peers, "locks")
    for (backend, impl, agents), cells in locks.items():
        solo = locks.get((backend, impl, 1))
        rate = _phase(cells, "acquire", "goodput")
        solo_rate = _phase(solo, "acquire", "goodput") if solo else None
        rows["locks"].append(
            {
                "backend": backend,
                "impl": impl,
                "agents": agents,
                "acquisitions_per_s": rate,
                "vs_solo": rate / solo_rate if rate is not None and solo_rate else None,
                "served": _median(c["extra"]["served"] for c in cells),
                "jain": _median(c["extra"]["jain"] for c in cells),
                "hold_ms": _median(c["extra"].get("hold_ms") for c in cells),
                "overhead_ms": _median(c["extra"].get("overhead_ms") for c in cells),
                "wait_p50_s": _phase(cells, "acquire", "p50"),
                "wait_p99_s": _phase(cells, "acquire", "p99"),
                "lost": sum(c["check"]["lost"] + c["check"]["duplicated"] for c in cells),
            }
        )
    for (backend, impl, agents), cells in _peer_groups(peers, "events").items():
        rows["events"].append(
            {
                "backend": backend,
                "impl": impl,
                "writers": agents,
                "events": _median(c["extra"]["events"] for c in cells),
                "appends_per_s": _phase(cells, "append", "goodput"),
                "append_p50_s": _phase(cells, "append", "p50"),
                "append_p99_s": _phase(cells, "append", "p99"),
                "read_back_s": _phase(cells, "read", "p50"),
                "lost": sum(c["check"]["lost"] + c["check"]["duplicated"] for c in cells),
            }
        )
    for (backend, impl, agents), cells in _peer_groups(peers, "checkpoints").items():
        rows["checkpoints"].append(
            {
                "backend": backend,
                "impl": impl,
                "writers": agents,
                "puts_per_s": _phase(cells, "put", "goodput"),
                "put_p50_s": _phase(cells, "put", "p50"),
                "put_p99_s": _phase(cells, "put", "p99"),
                "lost": sum(c["check"]["lost"] + c["check"]["duplicated"] for c in cells),
            }
        )
    return rows


def _peer_markdown(peers: list[dict[str, Any]], notes: list[str]) -> list[str]:
    if not peers and not notes:
        return []
    rows = peer_rows(peers)
    lines = ["", "## Peer libraries", ""]
    if rows["locks"]:
        lines += [
            "### Locks (1 ms held; a counter incremented without a compare under the lock)",
            "",
            "*hold ms*: how long the 1 ms hold took, measured (an asyncio sleep ends on the "
            "event loop's next wake-up, a thread's `time.sleep` does not wait for one); "
            "*not held ms*: the run's time per acquisition less the hold, i.e. what the lock "
            "(handoff, and the counter's read and write) adds to each hold.",
            "",
            "| backend | lock | agents | acquisitions/s | vs solo | agents served | Jain "
            "| hold ms | not held ms | wait p50 ms | wait p99 ms | lost |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows["locks"]:
            lines.append(
                f"| {r['backend']} | {r['impl']} | {r['agents']} | "
                f"{_rate(r['acquisitions_per_s'])} | {_pct(r['vs_solo'])} | "
                f"{_num(r['served'], 0)}/{r['agents']} | {_num(r['jain'], 3)} | "
                f"{_num(r['hold_ms'], 3)} | {_num(r['overhead_ms'], 3)} | "
                f"{_ms(r['wait_p50_s'])} | "
                f"{_ms(r['wait_p99_s'])} | {r['lost']} |"
            )
        lines.append("")
    if rows["events"]:
        lines += [
            "### Event sourcing (one event per append; with 1 writer, then a full read-back)",
            "",
            "| backend | implementation | writers | events | appends/s | append p50 ms "
            "| append p99 ms | read-back ms | lost |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows["events"]:
            lines.append(
                f"| {r['backend']} | {r['impl']} | {r['writers']} | {_num(r['events'], 0)} | "
                f"{_rate(r['appends_per_s'])} | {_ms(r['append_p50_s'])} | "
                f"{_ms(r['append_p99_s'])} | {_ms(r['read_back_s'])} | {r['lost']} |"
            )
        lines.append("")
    if rows["checkpoints"]:
        lines += [
            "### Checkpoints (each writer on its own thread)",
            "",
            "| backend | implementation | writers | puts/s | p50 ms | p99 ms | lost |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in rows["checkpoints"]:
            lines.append(
                f"| {r['backend']} | {r['impl']} | {r['writers']} | {_rate(r['puts_per_s'])} | "
                f"{_ms(r['put_p50_s'])} | {_ms(r['put_p99_s'])} | {r['lost']} |"
            )
        lines.append("")
    lines += [f"- {note}" for note in notes]
    return lines


def write_csv(report: Report, path: Path) -> None:
    rows = [g.row() for g in report.groups]
    with path.open("w", newline="", encoding="utf-8") as out:
        if not rows:
            return
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_peer_csv(report: Report, path: Path) -> None:
    rows = [
        {"group": group, **row} for group, items in peer_rows(report.peers).items() for row in items
    ]
    if not rows:
        return
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def print_report(report: Report, console: Console, notes: list[str]) -> None:
    if report.groups:
        console.print(
            "each cell: goodput (acked updates/s, closed loop) / rejection rate / p99 latency "
            "(open loop); vs raw: goodput / the raw client's at the largest N"
        )
    for backend, think, groups in _sections(report):
        writers = sorted({g.writers for g in groups})
        table = Table(title=f"{backend}, think {think:g} ms", title_justify="left")
        table.add_column("policy", no_wrap=True)
        for n in writers:
            table.add_column(f"N={n}", justify="right", no_wrap=True)
        table.add_column("vs raw", justify="right")
        for policy in dict.fromkeys(g.policy for g in groups):
            mine = {g.writers: g for g in groups if g.policy == policy}
            cells = []
            for n in writers:
                g = mine.get(n)
                if g is None:
                    cells.append("")
                    continue
                r = g.row()
                mark = "" if not (g.lost or g.duplicated) else "\n[red]LOST[/red]"
                cells.append(
                    f"{_rate(r['goodput'])}/s\n{_pct(r['rejection_rate'])}\n"
                    f"{_ms(r['open_p99_s'])} ms{mark}"
                )
            top = mine[max(mine)]
            table.add_row(policy, *cells, _num(top.ratio), end_section=True)
        console.print(table)
    rows = peer_rows(report.peers)
    if rows["locks"]:
        table = Table(title="locks", title_justify="left")
        for col in (
            "backend",
            "lock",
            "agents",
            "acq/s",
            "vs solo",
            "served",
            "Jain",
            "hold ms",
            "not held ms",
            "p99 wait ms",
        ):
            table.add_column(col, justify="left" if col in ("backend", "lock") else "right")
        for r in rows["locks"]:
            table.add_row(
                r["backend"],
                r["impl"],
                str(r["agents"]),
                _rate(r["acquisitions_per_s"]),
                _pct(r["vs_solo"]),
                f"{_num(r['served'], 0)}/{r['agents']}",
                _num(r["jain"], 3),
                _num(r["hold_ms"], 3),
                _num(r["overhead_ms"], 3),
                _ms(r["wait_p99_s"]),
            )
        console.print(table)
    if rows["events"]:
        table = Table(title="event sourcing", title_justify="left")
        for col in (
            "backend",
            "implementation",
            "writers",
            "events",
            "appends/s",
            "p99 ms",
            "read-back ms",
        ):
            table.add_column(
                col, justify="left" if col in ("backend", "implementation") else "right"
            )
        for r in rows["events"]:
            table.add_row(
                r["backend"],
                r["impl"],
                str(r["writers"]),
                _num(r["events"], 0),
                _rate(r["appends_per_s"]),
                _ms(r["append_p99_s"]),
                _ms(r["read_back_s"]),
            )
        console.print(table)
    if rows["checkpoints"]:
        table = Table(title="checkpoints", title_justify="left")
        for col in ("backend", "implementation", "writers", "puts/s", "p50 ms", "p99 ms"):
            table.add_column(
                col, justify="left" if col in ("backend", "implementation") else "right"
            )
        for r in rows["checkpoints"]:
            table.add_row(
                r["backend"],
                r["impl"],
                str(r["writers"]),
                _rate(r["puts_per_s"]),
                _ms(r["put_p50_s"]),
                _ms(r["put_p99_s"]),
            )
        console.print(table)
    for note in notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if report.ok:
        console.print(f"[green]{verdict(report)}[/green]")
    else:
        console.print(f"[bold red]{verdict(report)}[/bold red]")
