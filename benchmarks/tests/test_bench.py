"""``agentrooms bench`` end to end with tiny durations: outputs, the loss check, resume.

No assertion on speed (speed is a benchmark, never a timed test): only that every part
runs, writes what it promises, catches a policy that loses updates, and resumes.
"""

from __future__ import annotations

import gzip
import json
import selectors
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrooms.cli import app
from agentrooms_bench.records import OpRecord, Output
from agentrooms_bench.runner import Ledger, verify
from agentrooms_bench.scenarios import Applied, Outcome

runner = CliRunner()
TINY = ["--duration", "0.05", "--warmup", "0.01", "--repetitions", "1", "--no-plots"]


def bench(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["bench", *args], env={"COLUMNS": "160"})
    return result.exit_code, result.output


def cells(out: Path) -> list[dict[str, object]]:
    lines = (out / "cells.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def records(out: Path) -> list[dict[str, object]]:
    found = []
    for path in sorted((out / "records").glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as src:
            found += [json.loads(line) for line in src]
    return found


def check_crdt_cells(finished: list[dict[str, object]]) -> None:
    """Each CRDT replica writes its own record: no write rejected, one record each."""
    crdt = [c for c in finished if c["kind"] == "policy" and c["policy"] == "crdt"]
    for cell in crdt:
        closed, extra = cell["closed"], cell["extra"]
        assert isinstance(closed, dict) and isinstance(extra, dict)
        assert closed["ops"] > 0 and closed["rejected"] == 0, cell["cell"]
        assert extra["replicas"] == cell["writers"] and extra["read_ms"] > 0
    assert crdt


def test_quick_on_memory_writes_everything_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "memory"
    args = ["--quick", "--url", "memory://", "--out", str(out), "--writers", "1,4", *TINY]
    args += ["--lock-agents", "8"]
    code, output = bench(*args)
    assert code == 0, output
    assert "zero lost or duplicated updates" in output
    finished = cells(out)
    policies = {c["policy"] for c in finished if c["kind"] == "policy"}
    assert policies >= {"cas-none", "cas-full", "lock", "lease", "log", "crdt", "raw"}
    assert {c["impl"] for c in finished if c["kind"] == "peer"} == {
        "ours-polling",
        "ours-queued",
        "ours-queued-fused",
        "ours-requeue",
    }
    for cell in finished:
        if cell["kind"] == "peer" and cell["group"] == "locks":
            extra = cell["extra"]
            assert isinstance(extra, dict) and extra["hold_ms"] >= 1.0, cell["cell"]
            # the run is a chain of holds, each with what the lock adds to it
            elapsed = cell["phases"]["acquire"]["elapsed"]  # type: ignore[index]
            chain = (extra["hold_ms"] + extra["overhead_ms"]) * extra["acquisitions"] / 1000
            assert extra["overhead_ms"] > 0 and chain == pytest.approx(elapsed, rel=1e-3)
        check = cell["check"]
        assert isinstance(check, dict)
        assert check["lost"] == 0 and check["duplicated"] == 0, cell["cell"]
    check_crdt_cells(finished)
    ops = records(out)
    assert ops and {"cell", "op", "start", "latency", "outcome", "attempts"} <= set(ops[0])
    assert {r["phase"] for r in ops} >= {"warmup", "closed", "open"}
    summary = (out / "summary.md").read_text()
    assert "memory, think time 5 ms" in summary and "Correctness" in summary
    assert "memory://" in summary or "memory" in summary
    header = (out / "summary.csv").read_text().splitlines()[0]
    assert "goodput" in header and "vs_raw" in header and "open_p99_s" in header
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stores"]["memory"]["durability"] and meta["machine"]["python"]

    # resume: nothing left to run, nothing appended
    before = (out / "cells.jsonl").read_text()
    code, output = bench(*args)
    assert code == 0, output
    assert "already finished, skipped" in output
    assert (out / "cells.jsonl").read_text() == before
    assert len(list((out / "records").glob("*.gz"))) == 1

    # an unfinished cell (no summary line) runs again; the others are skipped
    lines = before.splitlines()
    dropped = json.loads(lines[-1])["cell"]
    (out / "cells.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    code, output = bench(*args)
    assert code == 0, output
    assert f"{len(lines) - 1} of {len(lines)} cells already finished" in output
    assert [c["cell"] for c in cells(out)].count(dropped) == 1
    assert len(cells(out)) == len(lines)

    # other settings into the same directory are refused
    code, output = bench(*[a if a != "0.05" else "0.06" for a in args])
    assert code == 2 and "other settings" in output


def test_quick_on_sqlite(tmp_path: Path) -> None:
    out = tmp_path / "sqlite"
    code, output = bench(
        "--quick",
        "--backends",
        "sqlite",
        "--out",
        str(out),
        "--policies",
        "cas-full,lease,writer,log,raw",
        "--writers",
        "1,4",
        "--no-peers",
        *TINY[:-1],
    )
    assert code == 0, output
    finished = cells(out)
    assert len(finished) == 5 * 2 * 2
    assert all(c["check"]["lost"] == 0 for c in finished)  # type: ignore[index]
    raw = [c for c in finished if c["policy"] == "raw"]
    assert raw and "sqlite3" in str(raw[0]["extra"])
    assert (out / "plots" / "sqlite-think0ms.png").stat().st_size > 0
    meta = json.loads((out / "meta.json").read_text())
    assert "sqlite" in meta["stores"]
    if hasattr(selectors, "EpollSelector"):  # the benchmarks' loop, and the report says so
        assert meta["machine"]["event_loop"] == "PreciseEpollSelector"
        assert "(selector: PreciseEpollSelector)" in (out / "summary.md").read_text()


def test_event_sourcing_peers_on_sqlite_with_one_and_several_writers(tmp_path: Path) -> None:
    """Our aggregate store, our room log and ``eventsourcing`` append the same events,
    by one writer and by EVENT_WRITERS at once; every cell checks none was lost."""
    pytest.importorskip("eventsourcing")
    from agentrooms_bench.peers import EVENT_WRITERS

    out = tmp_path / "events"
    code, output = bench(
        "--quick",
        "--backends",
        "sqlite",
        "--out",
        str(out),
        "--policies",
        "log",
        "--writers",
        "1",
        "--think",
        "0",
        "--lock-agents",
        "2",
        *TINY,
    )
    assert code == 0, output
    events = [c for c in cells(out) if c["kind"] == "peer" and c["group"] == "events"]
    got = {(c["impl"], c["agents"]) for c in events}
    impls = ("ours-aggregate", "ours-log", "eventsourcing")
    assert got == {(impl, n) for impl in impls for n in (1, EVENT_WRITERS)}
    for cell in events:
        check = cell["check"]
        assert isinstance(check, dict) and check["acked"] == 200, cell
        assert check["lost"] == 0 and check["duplicated"] == 0, cell
    summary = (out / "summary.md").read_text()
    assert f"| sqlite | eventsourcing | {EVENT_WRITERS} | 200 |" in summary


def test_a_policy_that_loses_updates_fails_the_run(tmp_path: Path) -> None:
    out = tmp_path / "blind"
    code, output = bench(
        "--url",
        "memory://",
        "--out",
        str(out),
        "--policies",
        "blind",
        "--writers",
        "4",
        "--think",
        "5",
        "--no-peers",
        *TINY,
    )
    assert code == 1, output
    assert "LOST" in output
    [cell] = cells(out)
    check = cell["check"]
    assert isinstance(check, dict)
    assert check["lost"] > 0 and check["applied"] < check["acked"]
    # the failure is sticky: resuming the directory still fails
    code, output = bench(
        "--url", "memory://", "--out", str(out), "--policies", "blind", "--writers", "4",
        "--think", "5", "--no-peers", *TINY,
    )  # fmt: skip
    assert code == 1 and "LOST" in output


@pytest.mark.parametrize(
    ("acked", "doubt", "applied", "lost", "duplicated"),
    [
        ([3, 2], [0, 0], {0: 3, 1: 2}, 0, 0),
        ([3, 2], [0, 0], {0: 2, 1: 2}, 1, 0),  # an acked update missing
        ([3, 2], [0, 0], {0: 4, 1: 2}, 0, 1),  # applied once more than acked
        ([3, 2], [0, 1], {0: 3, 1: 3}, 0, 0),  # the one in doubt did apply: fine
        ([3, 2], [0, 0], {0: 3, 1: 2, 7: 1}, 0, 1),  # an update by no agent
    ],
)
def test_verify_by_counts(
    acked: list[int], doubt: list[int], applied: dict[int, int], lost: int, duplicated: int
) -> None:
    ledger = Ledger(len(acked))
    ledger.acked, ledger.doubt = list(acked), list(doubt)
    check = verify(ledger, Applied(counts=applied))
    assert (check["lost"], check["duplicated"]) == (lost, duplicated)


def test_verify_by_ids() -> None:
    import collections

    ledger = Ledger(2)
    for op_id, outcome in [("0.0", "ok"), ("0.1", "ok"), ("1.0", "ok"), ("1.1", "exhausted")]:
        ledger.add(int(op_id[0]), op_id, Outcome(outcome))
    good = verify(ledger, Applied(ids=collections.Counter(["0.0", "0.1", "1.0"])))
    assert (good["lost"], good["duplicated"]) == (0, 0)
    twice = verify(ledger, Applied(ids=collections.Counter(["0.0", "0.1", "1.0", "1.0"])))
    assert twice["duplicated"] == 1
    gave_up_but_applied = verify(
        ledger, Applied(ids=collections.Counter(["0.0", "0.1", "1.0", "1.1"]))
    )
    assert gave_up_but_applied["duplicated"] == 1
    missing = verify(ledger, Applied(ids=collections.Counter(["0.0", "1.0"])))
    assert missing["lost"] == 1


def test_torn_output_is_read_up_to_the_tear(tmp_path: Path) -> None:
    out = Output(tmp_path)
    out.finish_cell("r1", "c1", [OpRecord("closed", "x", 0, 0.0, 0.001, "ok")], {"check": {}})
    with (tmp_path / "cells.jsonl").open("a") as f:
        f.write('{"cell": "c2", "run"')  # a crash mid-line
    with out.records_path("r1").open("ab") as f:
        f.write(b"\x1f\x8b\x08garbage")
    out.finish_cell("r1", "c3", [], {"check": {}})
    assert out.finished() == {"c1", "c3"}
    assert [r["cell"] for r in out.records()] == ["c1"]
