"""Every Prometheus metric of agentrooms, defined here and nowhere else.

* :class:`Metrics`: the commit loop's contention metrics, by kind;
* :class:`WriterMetrics`: designated writers' queues (depth, apply latency, outcomes);
* :func:`count_http_error`, :func:`count_mcp_error`: error responses of the HTTP API and
  MCP tool errors, by error type, on the default registry (served at ``/metrics``);
* :class:`OperatorMetrics` (:func:`operator_metrics`, on the default registry): HTTP
  requests by route template and status class, leases and effects by what happened to
  them, lock waiters and their wait, cursor lag. docs/why-metrics.md says why each label
  is what it is.

The commit loop's metrics, separated by kind, for Prometheus and an in-process snapshot:

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
import contextlib
import statistics
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "EFFECT_STATES",
    "HTTP_METHODS",
    "KINDS",
    "LEASE_EVENTS",
    "LOCK_WAIT_OUTCOMES",
    "MAX_PREFIXES",
    "MAX_PREFIX_LENGTH",
    "MAX_ROUTES",
    "NO_PREFIX",
    "OTHER_METHOD",
    "OTHER_PREFIX",
    "OTHER_ROUTE",
    "OUTCOMES",
    "STATUS_CLASSES",
    "UNMATCHED_ROUTE",
    "WRITER_OUTCOMES",
    "BoundedLabel",
    "Metrics",
    "OperatorMetrics",
    "WriterMetrics",
    "count_http_error",
    "count_mcp_error",
    "default_metrics",
    "default_writer_metrics",
    "operator_metrics",
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
WRITER_OUTCOMES = ("applied", "rejected", "dead")
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


class WriterMetrics:
    """Queue depth, apply latency, queue wait and outcomes of designated writers, next to
    (composition, not extension) the commit loop's :class:`Metrics`.

    Labels are bounded: ``outcome`` is ``applied``, ``rejected`` or ``dead`` (anything else
    is a ``ValueError``), and a ``room``/``queue`` depth series lives only while a writer of
    this process serves that queue (:meth:`forget` drops it when the writer stops)."""

    def __init__(
        self, registry: CollectorRegistry | None = None, commit: Metrics | None = None
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.commit = commit if commit is not None else Metrics(self.registry)
        self._depth = Gauge(
            "agentrooms_writer_queue_depth",
            "Intents submitted and not yet settled",
            ["room", "queue"],
            registry=self.registry,
        )
        self._apply = Histogram(
            "agentrooms_writer_apply_seconds",
            "Time to apply one intent (read, decide, conditional write)",
            registry=self.registry,
        )
        self._wait = Histogram(
            "agentrooms_writer_queue_wait_seconds",
            "Store-clock time from submission to outcome",
            registry=self.registry,
        )
        self._outcomes = Counter(
            "agentrooms_writer_intents",
            "Settled intents by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._recent: collections.deque[float] = collections.deque(maxlen=10_000)
        self._counts: collections.Counter[str] = collections.Counter()
        self._depths: dict[tuple[str, str], int] = {}

    def depth(self, room: str, queue: str, depth: int) -> None:
        with self._lock:  # with forget's, so a dropped series is not half set again
            self._depth.labels(room, queue).set(depth)
            self._depths[(room, queue)] = depth

    def forget(self, room: str, queue: str) -> None:
        """Drop the depth series of a queue this process no longer serves."""
        with self._lock:
            if self._depths.pop((room, queue), None) is None:
                return
            self._depth.remove(room, queue)

    def settled(self, outcome: str, apply_seconds: float, wait_seconds: float | None) -> None:
        if outcome not in WRITER_OUTCOMES:
            raise ValueError(f"unknown intent outcome {outcome!r}")
        self._outcomes.labels(outcome).inc()
        self._apply.observe(apply_seconds)
        if wait_seconds is not None:
            self._wait.observe(max(0.0, wait_seconds))
        with self._lock:
            self._counts[outcome] += 1
            self._recent.append(apply_seconds)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            latency = sorted(self._recent)
            return {
                "depth": dict(self._depths),
                "outcomes": dict(self._counts),
                "apply_p50": latency[len(latency) // 2] if latency else 0.0,
                "apply_p99": latency[min(len(latency) - 1, int(0.99 * len(latency)))]
                if latency
                else 0.0,
            }


_default_writer: WriterMetrics | None = None
_default_writer_lock = threading.Lock()  # apart from _default_lock, which it nests


def default_writer_metrics() -> WriterMetrics:
    """Process-wide writer metrics on prometheus-client's default registry."""
    global _default_writer
    with _default_writer_lock:
        if _default_writer is None:
            _default_writer = WriterMetrics(REGISTRY, default_metrics())
        return _default_writer


_http_errors: Counter | None = None
_mcp_errors: Counter | None = None
_errors_lock = threading.Lock()


def count_http_error(kind: str) -> None:
    """Count an error response of the HTTP API by error type in
    ``agentrooms_http_errors_total`` (default registry)."""
    global _http_errors
    with _errors_lock:
        if _http_errors is None:
            _http_errors = Counter(
                "agentrooms_http_errors",
                "Error responses of the HTTP API, by error type",
                ["type"],
                registry=REGISTRY,
            )
    _http_errors.labels(kind).inc()


def count_mcp_error(kind: str) -> None:
    """Count an MCP tool error by type in ``agentrooms_mcp_errors_total`` (default
    registry, served by the HTTP API's ``/metrics``)."""
    global _mcp_errors
    with _errors_lock:
        if _mcp_errors is None:
            _mcp_errors = Counter(
                "agentrooms_mcp_errors",
                "MCP tool errors, by error type",
                ["type"],
                registry=REGISTRY,
            )
    _mcp_errors.labels(kind).inc()


# ------------------------------------------------------------------- the operator's view

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
OTHER_METHOD = "OTHER"
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")
UNMATCHED_ROUTE = "(unmatched)"
OTHER_ROUTE = "(other)"
MAX_ROUTES = 128
LEASE_EVENTS = ("granted", "renewed", "expired", "reclaimed", "lost")
# the state an effect is in after each of its events (``effect.<event>``)
EFFECT_STATES = {
    "requested": "pending",
    "retry": "pending",
    "claimed": "in_progress",
    "reconciling": "in_progress",
    "unknown": "unknown",
    "failed": "failed",
    "succeeded": "done",
    "compensated": "compensated",
}
LOCK_WAIT_OUTCOMES = ("granted", "gave_up")
_LAG_BUCKETS = (0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
_WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


class OperatorMetrics:
    """What an operator watches, every label from a fixed set (no room, agent, key or
    raw path is ever a label):

    * ``agentrooms_http_requests_total`` / ``agentrooms_http_request_seconds``: by
      ``method`` (:data:`HTTP_METHODS`, else :data:`OTHER_METHOD`), ``route`` (the
      route's template such as ``/v1/rooms/{room}/tasks/{task_id}``,
      :data:`UNMATCHED_ROUTE` when none matches; at most :data:`MAX_ROUTES` templates,
      then :data:`OTHER_ROUTE`) and ``status`` class (:data:`STATUS_CLASSES`);
    * ``agentrooms_leases_total{event}``: task leases :data:`LEASE_EVENTS`, counted from
      the events a commit appended (``lease.<event>``);
    * ``agentrooms_effects_total{state}``: outbox effects moving into each state of
      :data:`EFFECT_STATES`, from their ``effect.<event>`` events;
    * ``agentrooms_lock_waiters`` (gauge) and ``agentrooms_lock_wait_seconds{outcome}``:
      waiters in line in this process, and the time each spent in line;
    * ``agentrooms_cursor_lag_events``: a histogram of how far behind the log's head a
      cursor is when its agent reads or acknowledges (one observation per read, no room
      label: the distribution over every room and agent). Thread-safe."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ["method", "route", "status"]
        self._requests = Counter(
            "agentrooms_http_requests", "HTTP requests answered", labels, registry=self.registry
        )
        self._request_seconds = Histogram(
            "agentrooms_http_request_seconds",
            "Time to answer an HTTP request (a stream: until it ends)",
            labels,
            registry=self.registry,
        )
        self._leases = Counter(
            "agentrooms_leases", "Task lease events", ["event"], registry=self.registry
        )
        self._effects = Counter(
            "agentrooms_effects",
            "Outbox effects moving into a state",
            ["state"],
            registry=self.registry,
        )
        self._waiters = Gauge(
            "agentrooms_lock_waiters",
            "Lock waiters in line in this process",
            registry=self.registry,
        )
        self._wait = Histogram(
            "agentrooms_lock_wait_seconds",
            "Time a waiter spent in a lock's line",
            ["outcome"],
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self._lag = Histogram(
            "agentrooms_cursor_lag_events",
            "Events after a cursor, when its agent reads or acknowledges",
            buckets=_LAG_BUCKETS,
            registry=self.registry,
        )
        self._route = BoundedLabel(MAX_ROUTES, OTHER_ROUTE)
        for event in LEASE_EVENTS:
            self._leases.labels(event)
        for state in sorted(set(EFFECT_STATES.values())):
            self._effects.labels(state)

    def request(self, method: str, route: str | None, status: int, seconds: float) -> None:
        """Count one answered request; ``route`` is its template (``None``: none matched)."""
        verb = method if method in HTTP_METHODS else OTHER_METHOD
        template = UNMATCHED_ROUTE if route is None else self._route(route)
        status_class = f"{status // 100}xx" if 100 <= status < 600 else "5xx"
        self._requests.labels(verb, template, status_class).inc()
        self._request_seconds.labels(verb, template, status_class).observe(max(0.0, seconds))

    def appended(self, types: Iterable[str]) -> None:
        """Count the lease and effect events among the types of events one write appended
        (call it once the write is in; other types are not counted)."""
        for kind in types:
            family, _, event = kind.partition(".")
            if family == "lease" and event in LEASE_EVENTS:
                self._leases.labels(event).inc()
            elif family == "effect" and event in EFFECT_STATES:
                self._effects.labels(EFFECT_STATES[event]).inc()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """A waiter in line for the block's duration: ``granted`` when it ends normally,
        ``gave_up`` when it raises (a timeout, a cancellation)."""
        start = time.monotonic()
        self._waiters.inc()
        outcome = "gave_up"
        try:
            yield
            outcome = "granted"
        finally:
            self._waiters.dec()
            self._wait.labels(outcome).observe(time.monotonic() - start)

    def cursor_lag(self, events: int) -> None:
        self._lag.observe(max(0, events))


_operator: OperatorMetrics | None = None


def operator_metrics() -> OperatorMetrics:
    """The process-wide :class:`OperatorMetrics` on prometheus-client's default registry."""
    global _operator
    if _operator is not None:  # every commit asks: no lock once it exists
        return _operator
    with _errors_lock:
        if _operator is None:
            _operator = OperatorMetrics(REGISTRY)
        return _operator
