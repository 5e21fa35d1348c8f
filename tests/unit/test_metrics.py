"""Metric labels stay bounded whatever keys, rooms and queues a workload uses."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from agentrooms.commit import Intent
from agentrooms.metrics import (
    KINDS,
    MAX_PREFIX_LENGTH,
    MAX_PREFIXES,
    NO_PREFIX,
    OTHER_PREFIX,
    BoundedLabel,
    Metrics,
)
from agentrooms.rooms import Rooms
from agentrooms.store import Put, open_store
from agentrooms.writer import IntentQueue, Writer, WriterMetrics


def series(registry: CollectorRegistry, name: str) -> list[dict[str, str]]:
    """The label sets of every sample of metric ``name``."""
    return [
        sample.labels
        for family in registry.collect()
        if family.name == name
        for sample in family.samples
        if sample.name == name + "_total" or sample.name == name
    ]


def label_values(registry: CollectorRegistry) -> dict[tuple[str, str], set[str]]:
    """Every (metric, label) in ``registry`` with the values it took."""
    seen: dict[tuple[str, str], set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label != "le":  # histogram buckets: fixed by the code
                    seen.setdefault((family.name, label), set()).add(value)
    return seen


def test_keys_without_a_slash_share_one_series() -> None:
    metrics = Metrics()
    for i in range(30):
        metrics.conflict({f"counter{i}": 3})
    got = series(metrics.registry, "agentrooms_conflicts_by_prefix")
    assert got == [{"prefix": NO_PREFIX}]
    assert metrics.snapshot()["conflicts_by_prefix"] == {NO_PREFIX: 30}


def test_prefixes_are_capped_and_the_rest_is_other() -> None:
    metrics = Metrics()
    metrics.conflict({"task/t1": 1, "doc/d": 2})
    for i in range(100):
        metrics.conflict({f"agent-{i}/state": 1})
    metrics.conflict({"x" * (MAX_PREFIX_LENGTH + 1) + "/k": 1})
    metrics.conflict({"task/t2": 1})  # a value seen before keeps its own series
    got = {s["prefix"] for s in series(metrics.registry, "agentrooms_conflicts_by_prefix")}
    assert len(got) == MAX_PREFIXES
    assert {"task/", "doc/", "agent-0/", OTHER_PREFIX} <= got and "agent-99/" not in got
    snap = metrics.snapshot()["conflicts_by_prefix"]
    assert set(snap) == got and sum(snap.values()) == 104 and snap["task/"] == 2
    assert snap[OTHER_PREFIX] == 100 - (MAX_PREFIXES - 3) + 1


def test_every_label_of_the_commit_metrics_is_bounded() -> None:
    metrics = Metrics()
    for i in range(200):
        metrics.conflict({f"k{i}": 1, f"p{i}/k": 1, f"{i}" * 80 + "/k": 1})
        metrics.observe_commit(1 + i % 5, 0.001, "ok" if i % 3 else "error")
        metrics.count(KINDS[i % len(KINDS)])
    with pytest.raises(ValueError, match="unknown metric kind"):
        metrics.count("room-7")
    with pytest.raises(ValueError, match="unknown commit outcome"):
        metrics.observe_commit(1, 0.001, "room-7")
    values = label_values(metrics.registry)
    assert set(values) == {
        ("agentrooms_errors", "kind"),
        ("agentrooms_conflicts_by_prefix", "prefix"),
        ("agentrooms_commits", "outcome"),
    }
    assert values[("agentrooms_errors", "kind")] == set(KINDS)
    assert values[("agentrooms_commits", "outcome")] == {"ok", "error"}
    assert len(values[("agentrooms_conflicts_by_prefix", "prefix")]) == MAX_PREFIXES


def test_bounded_label() -> None:
    label = BoundedLabel(3, "other")
    assert [label(v) for v in ("a", "b", "c", "a", "other", "d")] == [
        "a",
        "b",
        "other",
        "a",
        "other",
        "other",
    ]
    with pytest.raises(ValueError, match="at least one value"):
        BoundedLabel(0, "other")


def test_writer_depth_series_ends_with_its_writer() -> None:
    """One depth series per queue being served, not per queue ever served."""

    async def main() -> None:
        store = await open_store("memory://")
        metrics = WriterMetrics()
        for n in range(5):
            room = await Rooms(store).create(f"room-{n}")
            await room.scope.transact(writes=[Put("counter", {"n": 0})])
            stop = asyncio.Event()
            running = asyncio.create_task(
                Writer(room, owner="w1", metrics=metrics, idle=0.05).run(stop)
            )
            queued = await IntentQueue(room).submit(Intent([], [Put("counter", {"n": 1})], []))
            assert (await IntentQueue(room).wait(queued, timeout=20)).status == "applied"
            assert series(metrics.registry, "agentrooms_writer_queue_depth") == [
                {"room": room.name, "queue": "main"}
            ]
            stop.set()
            await asyncio.wait_for(running, 20)
            assert series(metrics.registry, "agentrooms_writer_queue_depth") == []
        assert metrics.snapshot()["depth"] == {}
        with pytest.raises(ValueError, match="unknown intent outcome"):
            metrics.settled("room-7", 0.001, None)
        await store.close()

    asyncio.run(main())


def test_every_metric_is_defined_in_the_metrics_module() -> None:
    """A Counter, Gauge, Histogram or Summary is made only in agentrooms/metrics.py."""
    import re
    from pathlib import Path

    import agentrooms

    package = Path(agentrooms.__file__).parent
    maker = re.compile(r"\b(Counter|Gauge|Histogram|Summary|Info|Enum)\(\s*\"agentrooms_")
    defining = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if maker.search(path.read_text())
    )
    assert defining == ["metrics.py"]


def test_the_default_writer_metrics_share_the_default_commit_metrics() -> None:
    """Made once per process, nesting the default commit metrics (without deadlocking)."""
    import threading

    from agentrooms.metrics import default_metrics, default_writer_metrics

    made: list[WriterMetrics] = []
    worker = threading.Thread(target=lambda: made.append(default_writer_metrics()), daemon=True)
    worker.start()
    worker.join(10)
    assert made, "default_writer_metrics() did not return"
    assert made[0] is default_writer_metrics()
    assert made[0].commit is default_metrics()
