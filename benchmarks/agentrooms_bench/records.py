"""What a benchmark run writes, and how a later run finds what is already done.

An output directory holds:

* ``records/<run>.jsonl.gz``: one JSON line per operation (``run``, ``cell``, ``phase``,
  ``op``, ``agent``, ``start``, ``latency``, ``outcome``, ``attempts``, ``rejected``), one
  file per invocation, one gzip member per cell (``zcat records/*.gz`` reads them all).
  ``start`` is seconds since the cell began (for open-loop operations: the *scheduled*
  arrival time, from which ``latency`` is measured).
* ``cells.jsonl``: one line per finished cell (its summary and its loss check). A cell's
  records are appended first, then its summary line, each flushed and synced: a cell is
  finished exactly when its summary line is there, and a run that died half-way through
  a cell leaves no summary for it, so the next run with the same directory runs it again
  (records of such an unfinished attempt carry another ``run`` id and are ignored, and a
  record file torn by a crash is read up to the tear).
* ``meta.json``: the settings (a rerun with other settings is refused), the machine, and
  the stores' durability as ``Store.info()`` reports it.
* ``summary.md``, ``summary.csv``, ``plots/*.png``: written from ``cells.jsonl``.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["OpRecord", "Output"]

RECORDS = "records"
CELLS = "cells.jsonl"
META = "meta.json"


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One operation of one agent in one cell."""

    phase: str  # warmup | closed | open | peer
    op: str
    agent: int
    start: float  # seconds since the cell started (open loop: the scheduled arrival)
    latency: float  # seconds (open loop: from the scheduled arrival)
    outcome: str  # ok | exhausted | error | missed
    attempts: int = 1  # write attempts (or lock tries, or intent submissions)
    rejected: int = 0  # of those, how many did not take effect

    def to_json(self, run: str, cell: str) -> dict[str, Any]:
        return {
            "run": run,
            "cell": cell,
            "phase": self.phase,
            "op": self.op,
            "agent": self.agent,
            "start": round(self.start, 6),
            "latency": round(self.latency, 7),
            "outcome": self.outcome,
            "attempts": self.attempts,
            "rejected": self.rejected,
        }


class Output:
    """The output directory of a (resumable) run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        (path / "plots").mkdir(exist_ok=True)
        (path / RECORDS).mkdir(exist_ok=True)

    def records_path(self, run: str) -> Path:
        return self.path / RECORDS / f"{run}.jsonl.gz"

    @property
    def cells_path(self) -> Path:
        return self.path / CELLS

    @property
    def meta_path(self) -> Path:
        return self.path / META

    def cells(self) -> list[dict[str, Any]]:
        """Finished cells, the last line of each cell id winning."""
        found: dict[str, dict[str, Any]] = {}
        if self.cells_path.exists():
            for line in _lines(self.cells_path):
                found[line["cell"]] = line
        return list(found.values())

    def finished(self) -> set[str]:
        return {cell["cell"] for cell in self.cells()}

    def records(self, cell: str | None = None) -> Iterator[dict[str, Any]]:
        """Records of finished cells (only those of the attempt that finished them)."""
        runs = {c["cell"]: c["run"] for c in self.cells()}
        for path in sorted((self.path / RECORDS).glob("*.jsonl.gz")):
            for line in _gzip_lines(path):
                if runs.get(line["cell"]) == line["run"] and (cell is None or line["cell"] == cell):
                    yield line

    def finish_cell(
        self, run: str, cell: str, records: Iterable[OpRecord], summary: dict[str, Any]
    ) -> None:
        """Append the cell's records, then its summary line (the cell is then done)."""
        with self.records_path(run).open("ab") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as member:
                for r in records:
                    line = json.dumps(r.to_json(run, cell), separators=(",", ":")) + "\n"
                    member.write(line.encode())
            raw.flush()
            os.fsync(raw.fileno())
        _append(self.cells_path, [json.dumps({**summary, "run": run, "cell": cell}, default=str)])

    def read_meta(self) -> dict[str, Any] | None:
        if not self.meta_path.exists():
            return None
        data: dict[str, Any] = json.loads(self.meta_path.read_text(encoding="utf-8"))
        return data

    def write_meta(self, meta: dict[str, Any]) -> None:
        tmp = self.meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(self.meta_path)


def _append(path: Path, lines: Iterable[str]) -> None:
    """Append lines, synced; after a line torn by a crash, start on a new line."""
    torn = False
    if path.exists() and path.stat().st_size:
        with path.open("rb") as src:
            src.seek(-1, os.SEEK_END)
            torn = src.read(1) != b"\n"
    with path.open("a", encoding="utf-8") as out:
        if torn:
            out.write("\n")
        for line in lines:
            out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def _gzip_lines(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as src:
            for raw in src:
                yield json.loads(raw)
    except (EOFError, OSError, zlib.error, json.JSONDecodeError):
        return  # torn by a crash: what came before it is complete


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as src:
        for text in src:
            line = text.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a crash mid-write: that cell is not finished
