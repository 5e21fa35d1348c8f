"""The result of each history and a run's totals."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from agentrooms.reliability.recorder import (
    RunReport,
)
from agentrooms.reliability.torture.settings import Settings

__all__ = ["HistoryResult", "Summary", "kind_of", "verdict"]

# ----------------------------------------------------------------------------- results


@dataclass(slots=True)
class HistoryResult:
    """One history: its seed, operations (the clients' calls), unknown outcomes,
    ``verdict`` (``linearizable``, ``not linearizable`` or ``undecided``), anomalies
    (failed properties, crashed clients, a damaged SQLite file), the faults injected,
    how failures were reported to the clients, and where it was saved if it failed."""

    index: int
    seed: int
    room: str
    operations: int
    unknown: int
    verdict: str
    failed_keys: list[str]
    anomalies: list[str]
    faults: list[str]
    reports: Counter[str]
    seconds: float
    saved: Path | None = None
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return self.verdict == "linearizable" and not self.anomalies


@dataclass(slots=True)
class Summary:
    """A run's totals, and each history's result (``ok``: every history linearizable,
    no anomaly)."""

    settings: Settings
    out: Path
    histories: int = 0
    operations: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    unknown: int = 0
    anomalies: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    reports: Counter[str] = field(default_factory=Counter)
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    integrity_checks: int = 0
    saved: list[Path] = field(default_factory=list)
    failing: list[HistoryResult] = field(default_factory=list)
    results: list[HistoryResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.histories > 0 and not self.failing

    def fault_errors(self) -> dict[str, Counter[str]]:
        """Per fault kind (or :data:`NO_FAULT`), what the callers saw while it was
        active, and how often."""
        table: dict[str, Counter[str]] = {}
        for (fault, what), n in self.errors.items():
            table.setdefault(fault, Counter())[what] += n
        return table

    def add(self, result: HistoryResult) -> None:
        self.results.append(result)
        self.histories += 1
        self.operations += result.operations
        self.verdicts[result.verdict] += 1
        self.unknown += result.unknown
        self.anomalies += len(result.anomalies)
        self.faults.update(result.faults)
        self.reports.update(result.reports)
        self.errors.update(result.errors)
        self.reports.update({f"{fault} → {what}": n for (fault, what), n in result.errors.items()})
        if not result.ok:
            self.failing.append(result)
            if result.saved is not None:
                self.saved.append(result.saved)


def kind_of(outcome: object) -> str | None:
    """How a client's run ended (``done``, ``crash``, ``died``), if it returned."""
    if isinstance(outcome, tuple) and outcome and isinstance(outcome[0], str):
        return outcome[0]
    return None


def verdict(report: RunReport) -> str:
    """``linearizable``, ``not linearizable`` (a key has no linearization) or
    ``undecided`` (the checker's budget ran out first)."""
    if report.result.linearizable:
        return "linearizable"
    return "not linearizable" if report.result.failed else "undecided"
