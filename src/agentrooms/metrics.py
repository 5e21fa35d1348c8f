"""Contention metrics, separated by kind, for Prometheus and for an in-process snapshot.

Kinds (one counter each, never lumped together): ``conflict``, ``invalid_transition``,
``contention_exhausted``, ``transport_failure``, ``rate_limited``, ``stale_fence``.
Conflicts are also counted per key prefix (``task/``, ``doc/`` ...) so a hot record stands
out; attempts per commit and commit latency are histograms.

Every label takes a bounded set of values, so no workload grows the series without end:
``kind`` is one of :data:`KINDS` and ``outcome`` one of :data:`OUTCOMES` (anything else
is a ``ValueError``); ``prefix`` is a key's first segment with its ``/`` (at most
:data:`MAX_PREFIX_LENGTH` characters), :data:`NO_PREFIX` for a key without ``/``, and
once :data:`MAX_PREFIXES` distinct values are in use, :data:`OTHER_PREFIX` for every new
one (the first values seen keep their own series for the life of the ``Metrics``).
"""

from __future__ import annotations

import collections
import statistics
import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

__all__ = [
    "KINDS",
    "MAX_PREFIXES",
    "MAX_PREFIX_LENGTH",
    "NO_PREFIX",
    "OTHER_PREFIX",
    "OUTCOMES",
    "BoundedLabel",
    "Metrics",
    "default_metrics",
]

KINDS = (
    "conflict",
    "invalid_transition",
    "contention_exhausted",
    "transport_failure",
    "rate_limited",
    "stale_fence",
)


OUTCOMES = ("ok", "error")
MAX_PREFIXES = 32
MAX_PREFIX_LENGTH = 64
NO_PREFIX = "(none)"
OTHER_PREFIX = "(other)"


def _prefix(key: str) -> str:
    """The key's family: ``task/`` for ``task/t1``; ``NO_PREFIX`` without a ``/``."""
    head, sep, _ = key.partition("/")
    if not sep:
        return NO_PREFIX
    return head + sep if len(head) < MAX_PREFIX_LENGTH else OTHER_PREFIX


class BoundedLabel:
    """The values of one label, at most ``limit`` of them: the first ``limit`` distinct
    values keep their own; every later one reads as ``other``. Thread-safe."""

    def __init__(self, limit: int, other: str) -> None:
        if limit < 1:
            raise ValueError("a bounded label needs room for at least one value")
        self.limit, self.other = limit, other
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        with self._lock:
            if value in self._seen or value == self.other:
                return value
            if len(self._seen) < self.limit - 1:  # the last place is other's
                self._seen.add(value)
                return value
            return self.other


class Metrics:
    """Counters and histograms of the commit loop. Thread-safe."""

    def __init__(self, registry: CollectorRegistry | None = None, window: int = 10_000) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._errors = Counter(
            "agentrooms_errors",
            "Failed or retried store writes, by kind",
            ["kind"],
            registry=self.registry,
        )
        self._conflicts = Counter(
            "agentrooms_conflicts_by_prefix",
            "Version conflicts per key prefix",
            ["prefix"],
            registry=self.registry,
        )
        self._commits = Counter(
            "agentrooms_commits", "Commit loop outcomes", ["outcome"], registry=self.registry
        )
        self._attempts = Histogram(
            "agentrooms_commit_attempts",
            "Conditional writes sent per commit",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
            registry=self.registry,
        )
        self._latency = Histogram(
            "agentrooms_commit_seconds",
            "Commit latency including retries",
            registry=self.registry,
        )
        for kind in KINDS:
            self._errors.labels(kind)
        self._prefix = BoundedLabel(MAX_PREFIXES, OTHER_PREFIX)
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._by_prefix: collections.Counter[str] = collections.Counter()
        self._outcomes: collections.Counter[str] = collections.Counter()
        self._recent_attempts: collections.deque[int] = collections.deque(maxlen=window)
        self._recent_latency: collections.deque[float] = collections.deque(maxlen=window)

    def count(self, kind: str, n: int = 1) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown metric kind {kind!r}")
        self._errors.labels(kind).inc(n)
        with self._lock:
            self._counts[kind] += n

    def conflict(self, conflicts: Mapping[str, object]) -> None:
        self.count("conflict")
        prefixes = {self._prefix(_prefix(key)) for key in conflicts}
        with self._lock:
            for p in prefixes:
                self._by_prefix[p] += 1
        for p in prefixes:
            self._conflicts.labels(p).inc()

    def observe_commit(self, attempts: int, elapsed: float, outcome: str) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown commit outcome {outcome!r}")
        self._commits.labels(outcome).inc()
        self._attempts.observe(attempts)
        self._latency.observe(elapsed)
        with self._lock:
            self._outcomes[outcome] += 1
            self._recent_attempts.append(attempts)
            self._recent_latency.append(elapsed)

    def snapshot(self) -> dict[str, Any]:
        """A plain-data view for the CLI and tests (percentiles over the recent window)."""
        with self._lock:
            attempts = list(self._recent_attempts)
            latency = sorted(self._recent_latency)
            return {
                "errors": {kind: self._counts[kind] for kind in KINDS},
                "conflicts_by_prefix": dict(self._by_prefix),
                "commits": dict(self._outcomes),
                "attempts_mean": statistics.fmean(attempts) if attempts else 0.0,
                "attempts_max": max(attempts, default=0),
                "latency_p50": _quantile(latency, 0.50),
                "latency_p99": _quantile(latency, 0.99),
            }


def _quantile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


_default: Metrics | None = None
_default_lock = threading.Lock()


def default_metrics() -> Metrics:
    """The process-wide metrics, registered with prometheus-client's default registry."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Metrics(REGISTRY)
        return _default
