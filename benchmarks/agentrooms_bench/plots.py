"""PNG plots of a run (matplotlib, Agg backend): one figure per backend and think time,
four panels against the writer count on a log2 axis, one line per policy: goodput,
rejection rate, open-loop p99 latency, and write attempts per acked update."""

from __future__ import annotations

from pathlib import Path

from agentrooms_bench.report import Group, Report

__all__ = ["available", "plot_report"]

PANELS = (
    ("goodput", "goodput (acked updates/s)", True),
    ("rejection_rate", "rejection rate", False),
    ("open_p99_s", "p99 latency, open loop (ms)", True),
    ("attempts_per_update", "write attempts per update", True),
)


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_report(report: Report, directory: Path) -> list[Path]:
    """Write the plots into ``directory``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections: dict[tuple[str, float], list[Group]] = {}
    for group in report.groups:
        sections.setdefault((group.backend, group.think_ms), []).append(group)
    paths: list[Path] = []
    for (backend, think), groups in sections.items():
        fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
        policies = list(dict.fromkeys(g.policy for g in groups))
        writers = sorted({g.writers for g in groups})
        for ax, (field, title, log) in zip(axes.flat, PANELS, strict=True):
            plotted: list[float] = []
            for policy in policies:
                rows = sorted((g for g in groups if g.policy == policy), key=lambda g: g.writers)
                xs, ys = [], []
                for g in rows:
                    value = g.row()[field]
                    if value is None:
                        continue
                    xs.append(g.writers)
                    ys.append(value * 1000 if field.endswith("_s") else value)
                if not xs:
                    continue
                plotted += ys
                style = "--" if policy == "raw" else "-"
                ax.plot(xs, ys, style, marker="o", markersize=3, label=policy)
            ax.set_xscale("log", base=2)
            ax.set_xticks(writers, [str(n) for n in writers])
            ax.minorticks_off() if not log else None
            if log and plotted and min(plotted) > 0:
                ax.set_yscale("log")
            ax.set_title(title)
            ax.set_xlabel("writers (log2)")
            ax.grid(alpha=0.3, which="both")
        axes.flat[0].legend(fontsize=8, ncol=2)
        fig.suptitle(f"agentrooms bench: {backend}, think time {think:g} ms")
        fig.tight_layout()
        path = directory / f"{backend}-think{think:g}ms.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
