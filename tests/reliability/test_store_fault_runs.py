"""The short tier's torture runs with store faults: a few histories on a store each run
owns (``faults.store_under_test``), with the faults it draws, through the library on
SQLite, Redis and PostgreSQL, over HTTP on Redis and PostgreSQL and over MCP on
PostgreSQL: 0 anomalies, and every error a caller saw typed (``StoreUnavailable``,
``store_unavailable``, a timeout recorded as unknown), never a raw driver exception. On
Redis and PostgreSQL the runs' seeds plan the proxy's reset of a request in flight,
whose errors are asserted typed too; over HTTP on Redis, a run plans the ``kill -9`` of
a server with its request to the store in flight."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrooms.reliability.torture import (
    CLIENT_KILL,
    NO_FAULT,
    SERVER_KILL_IN_FLIGHT,
    Settings,
    Summary,
    fault_kinds,
    plan_faults,
    run_torture,
)

pytestmark = pytest.mark.usefixtures("services")

IN_FLIGHT = "proxy reset in flight"
PROXY = ("proxy delay 0.25s", "proxy drop", "proxy reset", "proxy blackhole", IN_FLIGHT)
STORE_FAULTS = {
    "sqlite": ("sqlite kill -9 of a writer",),
    "redis": (
        *PROXY,
        "redis CLIENT PAUSE WRITE",
        "redis CLIENT PAUSE ALL",
        "redis restart (aof always)",
    ),
    "postgres": (*PROXY, "postgres pg_terminate_backend"),
}
"""The store faults a run that owns its store draws, per backend (asserted below)."""


@pytest.fixture(scope="module")
def services(request: pytest.FixtureRequest) -> None:
    """Fail (CI) or skip (a laptop) when Redis or PostgreSQL does not answer."""
    request.getfixturevalue("redis_url")
    request.getfixturevalue("postgres_url")


# ---------------------------------------------------------------- short torture runs


class NamedFault:
    """A stand-in with a fault's name, to plan a run's faults before it starts."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def inject(self) -> None:
        raise AssertionError("never injected")

    async def heal(self) -> None:
        raise AssertionError("never healed")


def kinds_of(settings: Settings) -> dict[str, int]:
    """The faults a run of ``settings`` on a store it owns draws from."""
    names = STORE_FAULTS[settings.backend]
    proxied = settings.backend != "sqlite"
    return fault_kinds(settings, [NamedFault(n) for n in names], proxied=proxied)


def seed_planning_most_store_faults(settings: Settings, aim: str = IN_FLIGHT) -> int:
    """The base seed (of the first 200) whose histories plan ``aim`` (the reset of a
    request in flight by default, where the backend has the proxy) as a history's first
    fault, and the most distinct store faults of the backend."""
    names = {*STORE_FAULTS[settings.backend], SERVER_KILL_IN_FLIGHT}
    kinds = kinds_of(settings)
    assert settings.histories is not None

    def planned(base: int) -> tuple[bool, int]:
        plans = [
            plan_faults(base + i, kinds, settings.clients * settings.ops)
            for i in range(settings.histories or 0)
        ]
        found = {f.kind for plan in plans for f in plan} & names
        # first in its history: not held back behind another store fault's heal, while
        # the clients, failing fast under that fault, run out of calls
        return any(plan and plan[0].kind == aim for plan in plans), len(found)

    return max(range(0, 200_000, 1000), key=planned)


def assert_typed(summary: Summary) -> None:
    """Every error a caller saw was typed, and each is in the summary's reports."""
    assert summary.errors, "no call failed: the store faults did not bite"
    for (fault, what), n in summary.errors.items():
        assert not what.startswith("raw "), (fault, what, n)
        assert summary.reports[f"{fault} → {what}"] == n


@pytest.mark.parametrize(
    ("backend", "surface", "histories"),
    [
        ("sqlite", "library", 6),
        ("redis", "library", 6),
        ("postgres", "library", 6),
        ("redis", "http", 2),
        ("postgres", "http", 2),
        ("postgres", "mcp", 2),
    ],
)
async def test_short_torture_with_store_faults(
    backend: str, surface: str, histories: int, tmp_path: Path
) -> None:
    base = Settings(backend, surface, histories=histories, servers=2)
    seed = seed_planning_most_store_faults(base)
    settings = Settings(backend, surface, seed=seed, histories=histories, servers=2)
    summary = await run_torture(settings, tmp_path / "out")
    table = {fault: dict(seen) for fault, seen in summary.fault_errors().items()}
    print(
        f"{backend}/{surface}: {summary.operations} ops, {summary.unknown} unknown, "
        f"faults {dict(summary.faults)}, {summary.seconds:.1f}s; errors {table}"
    )
    failing = [(r.seed, r.verdict, r.anomalies[:3]) for r in summary.failing]
    assert summary.ok and not failing, failing
    assert summary.anomalies == 0
    store_faults = set(summary.faults) & set(STORE_FAULTS[backend])
    assert store_faults, summary.faults
    assert set(summary.faults) <= set(kinds_of(settings))
    if backend == "sqlite":  # a writer's kill is not felt by the clients: the file is checked
        assert summary.integrity_checks > 0
    else:
        assert_typed(summary)
        assert set(table) - {NO_FAULT, CLIENT_KILL}, table
        # the reset of a request in flight was injected, and its callers were told so
        # in a typed way (asserted above for every error)
        assert summary.faults[IN_FLIGHT] > 0 and IN_FLIGHT in table, table


async def test_server_kill_in_flight_over_http_on_redis(tmp_path: Path) -> None:
    """The proxy holds the reply to a server's request to the store and the runner kills
    that server (``kill -9``) before it passes: injected, the histories linearizable,
    the log gapless and each command applied once (``verify``), every error typed."""
    base = Settings("redis", "http", histories=1, servers=2)
    kinds = kinds_of(base)
    calls = base.clients * base.ops
    alone = [  # seeds whose history plans the kill in flight and no other fault
        n
        for n in range(1000)
        if [f.kind for f in plan_faults(n, kinds, calls)] == [SERVER_KILL_IN_FLIGHT]
    ]
    assert alone, kinds
    seed = alone[0]
    settings = Settings("redis", "http", seed=seed, histories=1, servers=2)
    summary = await run_torture(settings, tmp_path / "out")
    table = {fault: dict(seen) for fault, seen in summary.fault_errors().items()}
    print(
        f"redis/http: {summary.operations} ops, {summary.unknown} unknown, "
        f"faults {dict(summary.faults)}, {summary.seconds:.1f}s; errors {table}"
    )
    failing = [(r.seed, r.verdict, r.anomalies[:3]) for r in summary.failing]
    assert summary.ok and not failing, failing
    assert summary.anomalies == 0
    assert summary.faults[SERVER_KILL_IN_FLIGHT] > 0, summary.faults
    assert_typed(summary)
    assert SERVER_KILL_IN_FLIGHT in table, table
