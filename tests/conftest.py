"""Backends for the tests, each isolated to this test run.

* memory: a fresh in-process store per test.
* sqlite: a fresh file per test under pytest's tmp_path.
* redis: the server at ``AGENTROOMS_TEST_REDIS_URL`` (default 127.0.0.1:6379/0) with a
  key prefix unique to this run; the run's keys are deleted at the end.
* postgres: a database created for this run on ``AGENTROOMS_TEST_POSTGRES_URL``
  (default postgresql://postgres@127.0.0.1:5432/postgres) and dropped at the end.
* redis-cluster: a Redis Cluster of this run's own (3 primaries, one replica each:
  ``tests/cluster_fixture.py``), started once per session. To keep the suite's time, only
  the store's and the room-level conformance suites, the HTTP and MCP state suites and
  the cluster's own tests (:data:`CLUSTER_SUITES`) run on it
  (``AGENTROOMS_CLUSTER_ALL=1``: every module that uses the ``backend`` fixture).
* postgres-pgbouncer-tx, postgres-pgbouncer-session: that database through pgbouncer
  (tests/pgbouncer_fixture.py) in transaction and in session pooling, each in a schema
  of its own. They run only the modules of :data:`POOLED_MODULES` (the store's and the
  room-level conformance suites, the HTTP and MCP state suites): elsewhere they are
  deselected.

A backend whose service does not answer is skipped on a laptop, but with
``AGENTROOMS_REQUIRE_BACKENDS=1`` (set by ``.ci/run``) the test **fails** instead.
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from agentrooms.store import Limits, Store, open_store
from tests import pgbouncer_fixture
from tests.cluster_fixture import Cluster, start_cluster
from tests.pgbouncer_fixture import PgBouncer

BACKENDS = (
    "memory",
    "sqlite",
    "redis",
    "postgres",
    "redis-cluster",
    "postgres-pgbouncer-tx",
    "postgres-pgbouncer-session",
)
CLUSTER_SUITES = (
    "tests/conformance/test_store.py",
    "tests/conformance/test_glance.py",
    "tests/conformance/test_room_pages.py",
    "tests/conformance/test_rooms.py",
    "tests/conformance/test_commit.py",
    "tests/conformance/test_sets_watch_rooms.py",
    "tests/unit/test_redis_cluster.py",
    "tests/server/test_state_http.py",
    "tests/mcp/test_state_mcp.py",
)
"""Where the ``redis-cluster`` cases run (paths, or folders ending in ``/``)."""
CLUSTER_ALL = os.environ.get("AGENTROOMS_CLUSTER_ALL", "") not in ("", "0", "false")
POOLED = ("postgres-pgbouncer-tx", "postgres-pgbouncer-session")
# The suites that also run through pgbouncer (all of them would double the postgres time).
POOLED_MODULES = (
    "tests/conformance/test_store.py",
    "tests/conformance/test_glance.py",
    "tests/conformance/test_room_pages.py",
    "tests/conformance/test_rooms.py",
    "tests/conformance/test_commit.py",
    "tests/conformance/test_sets_watch_rooms.py",
    "tests/server/test_state_http.py",
    "tests/mcp/test_state_mcp.py",
)
RUN_ID = uuid.uuid4().hex[:10]
REQUIRE = os.environ.get("AGENTROOMS_REQUIRE_BACKENDS", "") not in ("", "0", "false")
REDIS_URL = os.environ.get("AGENTROOMS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "AGENTROOMS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 1
        ):
            return True
    except OSError:
        return False


def unavailable(what: str) -> None:
    """Skip locally, fail in CI, when a backend's service is not answering."""
    message = f"{what} is not answering"
    if REQUIRE:
        pytest.fail(f"{message} and AGENTROOMS_REQUIRE_BACKENDS is set", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if not _answers(REDIS_URL, 6379):
        unavailable(f"Redis at {REDIS_URL}")
    prefix = f"artest-{RUN_ID}"
    sep = "&" if "?" in REDIS_URL else "?"
    yield f"{REDIS_URL}{sep}prefix={prefix}"
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The run's own Redis Cluster (started on first use, stopped at the session's end)."""
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("redis-cluster"))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        unavailable(f"a Redis Cluster of this run's own ({exc})")
        raise
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def redis_cluster_url(redis_cluster: Cluster) -> str:
    return redis_cluster.url(f"prefix=artest-{RUN_ID}")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    if not _answers(POSTGRES_URL, 5432):
        unavailable(f"PostgreSQL at {POSTGRES_URL}")
    import asyncio

    import asyncpg

    dbname = f"agentrooms_test_{RUN_ID}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{dbname}"'))
    parts = urlsplit(POSTGRES_URL)
    yield urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", parts.query, ""))
    asyncio.run(admin(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def pgbouncers(postgres_url: str) -> Iterator[Callable[..., PgBouncer]]:
    """Start (once per run and configuration) a pgbouncer in front of the test server:
    ``pgbouncers("transaction")``, ``pgbouncers("session", connect_query=...)``."""
    if not pgbouncer_fixture.available():
        unavailable("pgbouncer (Debian package pgbouncer) is not installed, so it")
    started: dict[tuple[str, tuple[tuple[str, str], ...]], PgBouncer] = {}

    def get(pool_mode: str, **settings: str) -> PgBouncer:
        key = (pool_mode, tuple(sorted(settings.items())))
        if key not in started:
            started[key] = pgbouncer_fixture.start(postgres_url, pool_mode, **settings)
        return started[key]

    yield get
    for bouncer in started.values():
        bouncer.stop()


def pooled_url(postgres_url: str, bouncer: PgBouncer, pooler: str, schema: str) -> str:
    """The test database through ``bouncer``, as a store URL in ``pooler`` mode."""
    dbname = urlsplit(postgres_url).path.lstrip("/")
    return bouncer.url(dbname, f"pooler={pooler}&schema={schema}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the ``redis-cluster`` cases of modules outside :data:`CLUSTER_SUITES`
    (unless ``AGENTROOMS_CLUSTER_ALL``), and the pgbouncer cases outside
    :data:`POOLED_MODULES` or marked ``slow`` (the multi-process scenarios, which the
    direct connection runs)."""
    root = Path(str(config.rootpath))
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("backend") if callspec is not None else None
        where = Path(str(item.path)).relative_to(root).as_posix()
        off_cluster = name == "redis-cluster" and not CLUSTER_ALL
        pooled = name in POOLED
        if (
            (off_cluster and not where.startswith(CLUSTER_SUITES))
            or (pooled and not item.nodeid.startswith(POOLED_MODULES))
            or (pooled and item.get_closest_marker("slow") is not None)
        ):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@dataclass
class Backend:
    """How a test reaches one backend: a URL (when other processes can share it) and an
    opener that returns another handle on the *same* data."""

    name: str
    url: str
    shared_across_processes: bool
    _memory: Store | None = None
    _opened: list[Store] = field(default_factory=list)

    async def open(self, limits: Limits | None = None) -> Store:
        """A handle on the backend's data, closed at the test's end if the test did not
        close it (a failed assertion must not leak its connections into later tests)."""
        if self.name == "memory" and limits is None:
            if self._memory is None:
                self._memory = await open_store(self.url)
            return self._memory
        store = await open_store(self.url, limits=limits)
        self._opened.append(store)
        return store


@pytest.fixture
async def _opened_stores() -> AsyncIterator[list[Store]]:
    """The stores a test's :class:`Backend` opened, closed at its end in its loop."""
    opened: list[Store] = []
    yield opened
    for store in opened:
        await store.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    name: str = request.param
    if name == "memory":
        b = Backend(name, "memory://", shared_across_processes=False)
    elif name == "sqlite":
        b = Backend(name, f"sqlite:///{tmp_path / 'store.db'}", shared_across_processes=True)
    elif name == "redis":
        b = Backend(name, request.getfixturevalue("redis_url"), True)
    elif name == "redis-cluster":
        b = Backend(name, request.getfixturevalue("redis_cluster_url"), True)
    elif name in POOLED:
        pooler = "transaction" if name == "postgres-pgbouncer-tx" else "session"
        bouncer = request.getfixturevalue("pgbouncers")(pooler)
        schema = "pgbouncer_tx" if pooler == "transaction" else "pgbouncer_session"
        b = Backend(
            name, pooled_url(request.getfixturevalue("postgres_url"), bouncer, pooler, schema), True
        )
    else:
        b = Backend(name, request.getfixturevalue("postgres_url"), True)
    b._opened = request.getfixturevalue("_opened_stores")
    return b


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    s = await backend.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def shared_url(request: pytest.FixtureRequest) -> str:
    """A URL whose handles reach the same data (sqlite: one database file, whose handles
    share one worker)."""
    if request.param == "sqlite":
        tmp: Path = request.getfixturevalue("tmp_path")
        return f"sqlite:///{tmp / 'shared.db'}"
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def room() -> str:
    """A room name no other test uses (Redis and PostgreSQL are shared per run)."""
    return f"room-{uuid.uuid4().hex[:12]}"


OpenStore = Callable[[], Awaitable[Store]]
