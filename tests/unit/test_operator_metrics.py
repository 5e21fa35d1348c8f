"""The operator's metrics keep every label within its fixed set of values."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from agentrooms.metrics import (
    EFFECT_STATES,
    LEASE_EVENTS,
    MAX_ROUTES,
    OTHER_METHOD,
    OTHER_ROUTE,
    STATUS_CLASSES,
    UNMATCHED_ROUTE,
    OperatorMetrics,
)


def values(registry: CollectorRegistry, metric: str, label: str) -> set[str]:
    return {
        sample.labels[label]
        for family in registry.collect()
        if family.name == metric
        for sample in family.samples
        if label in sample.labels
    }


def test_routes_methods_and_statuses_are_bounded() -> None:
    metrics = OperatorMetrics()
    for i in range(MAX_ROUTES * 3):
        metrics.request("GET", f"/v1/route-{i}", 200, 0.001)
    metrics.request("BREW", None, 418, 0.001)
    metrics.request("GET", "/v1/route-0", 999, 0.001)  # not a status: counted a server error
    routes = values(metrics.registry, "agentrooms_http_requests", "route")
    assert len(routes) == MAX_ROUTES + 1  # the cap (its last place is other's), unmatched
    assert OTHER_ROUTE in routes and UNMATCHED_ROUTE in routes
    assert values(metrics.registry, "agentrooms_http_requests", "method") == {"GET", OTHER_METHOD}
    statuses = values(metrics.registry, "agentrooms_http_requests", "status")
    assert statuses == {"2xx", "4xx", "5xx"} and statuses <= set(STATUS_CLASSES)


def test_only_lease_and_effect_events_are_counted() -> None:
    metrics = OperatorMetrics()
    metrics.appended(["lease.granted", "lease.bogus", "task.added", "effect.claimed"])
    metrics.appended([f"lease.x{i}" for i in range(100)] + [f"effect.y{i}" for i in range(100)])
    assert values(metrics.registry, "agentrooms_leases", "event") == set(LEASE_EVENTS)
    assert values(metrics.registry, "agentrooms_effects", "state") == set(EFFECT_STATES.values())
    counted = {
        (s.name, tuple(s.labels.values())): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name in ("agentrooms_leases_total", "agentrooms_effects_total") and s.value
    }
    assert counted == {
        ("agentrooms_leases_total", ("granted",)): 1.0,
        ("agentrooms_effects_total", ("in_progress",)): 1.0,
    }


def test_a_waiter_that_raises_is_counted_as_giving_up() -> None:
    metrics = OperatorMetrics()
    with metrics.waiting():
        assert metrics.registry.get_sample_value("agentrooms_lock_waiters") == 1
    with pytest.raises(TimeoutError), metrics.waiting():
        raise TimeoutError
    sample = metrics.registry.get_sample_value
    assert sample("agentrooms_lock_waiters") == 0
    assert sample("agentrooms_lock_wait_seconds_count", {"outcome": "granted"}) == 1
    assert sample("agentrooms_lock_wait_seconds_count", {"outcome": "gave_up"}) == 1
