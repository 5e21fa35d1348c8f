"""The stores a benchmark or torture run uses, each isolated to the run.

A backend name (``memory``, ``sqlite``, ``redis``, ``postgres``) uses the default local
server (overridable with ``AGENTROOMS_BENCH_REDIS_URL`` / ``AGENTROOMS_BENCH_POSTGRES_URL``)
and isolates the run:

* sqlite: a fresh file in a temporary directory (removed afterwards);
* redis: a key prefix unique to the run (its keys are deleted afterwards);
* postgres: a temporary database, dropped afterwards (``WITH (FORCE)``);
* memory: the in-process store.

A given store URL is used as it is instead (rooms unique to each cell; raw baselines in
a temporary SQLite file, a unique Redis key prefix, or a table created and dropped in
the given PostgreSQL database).
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from agentrooms.errors import BadRequest
from agentrooms.store import Store, StoreInfo, open_store

__all__ = [
    "BACKENDS",
    "Target",
    "backend_of",
    "provision",
    "reachable",
    "unique",
    "without_query",
]

BACKENDS = ("memory", "sqlite", "redis", "postgres")
REDIS_URL = os.environ.get("AGENTROOMS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "AGENTROOMS_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
MAX_HANDLES = 8  # one store handle (its own connection pool) per 8 agents, at most 8


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def backend_of(url: str) -> str:
    scheme = urlsplit(url).scheme.lower()
    names = {
        "memory": "memory",
        "sqlite": "sqlite",
        "redis": "redis",
        "rediss": "redis",
        "postgres": "postgres",
        "postgresql": "postgres",
    }
    if scheme not in names:
        raise BadRequest(f"cannot benchmark a store URL with scheme {scheme!r}: {url}")
    return names[scheme]


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), *params.items()]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


def without_query(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def reachable(name: str) -> str | None:
    """``None`` if the default server of ``name`` answers, else why not."""
    url = {"redis": REDIS_URL, "postgres": POSTGRES_URL}.get(name)
    if url is None:
        return None
    parts = urlsplit(url)
    port = parts.port or (6379 if name == "redis" else 5432)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", port), 2):
            return None
    except OSError as exc:
        return f"{name} at {parts.hostname}:{port} does not answer ({exc})"


@dataclass
class Target:
    """One store under test and where its raw baseline and peers put their data."""

    name: str  # memory | sqlite | redis | postgres
    url: str  # the store URL our library opens
    scratch: Path  # a temporary directory of the run (raw SQLite file, peers' files)
    redis_url: str | None = None  # the Redis server, for raw clients and peers
    raw_prefix: str = field(default_factory=lambda: unique("arbench-raw"))
    postgres_dsn: str | None = None  # the database, for raw clients and peers
    stores: list[Store] = field(default_factory=list)
    info: StoreInfo | None = None

    async def handles(self, writers: int) -> list[Store]:
        """Store handles for ``writers`` agents: one per 8 agents (as separate agents
        would each have their own connections), at most ``MAX_HANDLES``; the in-process
        store is a single one. Handles are reused while the count stays the same, and
        closed (with their connections) when it changes."""
        want = 1 if self.name == "memory" else max(1, min(MAX_HANDLES, writers // 8))
        if len(self.stores) != want and self.name != "memory":
            await self.close()  # idle pooled connections would pile up on the server
        while len(self.stores) < want:
            self.stores.append(await open_store(self.url))
        return list(self.stores)

    async def close(self) -> None:
        for store in self.stores:
            await store.close()
        self.stores.clear()


async def _drop_redis_prefix(url: str, *prefixes: str) -> None:
    import redis.asyncio as redis

    client = redis.Redis.from_url(url)
    try:
        for prefix in prefixes:
            batch: list[bytes] = []
            async for key in client.scan_iter(match=f"{prefix}*", count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    await client.delete(*batch)
                    batch.clear()
            if batch:
                await client.delete(*batch)
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def _postgres_database(admin_url: str) -> AsyncIterator[str]:
    import asyncpg

    name = unique("agentrooms_bench").replace("-", "_")
    admin = await asyncpg.connect(without_query(admin_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield _with_database(admin_url, name)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def provision(name: str | None = None, url: str | None = None) -> AsyncIterator[Target]:
    """A :class:`Target` for backend ``name`` (isolated, on the default local server) or
    for the store at ``url``; everything the run created is removed on exit."""
    with tempfile.TemporaryDirectory(prefix="agentrooms-bench-") as tmp:
        scratch = Path(tmp)
        if url is not None:
            target = Target(backend_of(url), url, scratch)
            if target.name == "redis":
                target.redis_url = without_query(url)
            elif target.name == "postgres":
                target.postgres_dsn = url
            try:
                yield target
            finally:
                await target.close()
                if target.redis_url is not None:
                    await _drop_redis_prefix(target.redis_url, target.raw_prefix)
            return
        if name == "memory":
            target = Target("memory", "memory://", scratch)
        elif name == "sqlite":
            target = Target("sqlite", f"sqlite:///{scratch / 'agentrooms.db'}", scratch)
        elif name == "redis":
            prefix = unique("arbench")
            target = Target("redis", _with_query(REDIS_URL, prefix=prefix), scratch)
            target.redis_url = REDIS_URL
            try:
                yield target
            finally:
                await target.close()
                await _drop_redis_prefix(REDIS_URL, prefix, target.raw_prefix)
            return
        elif name == "postgres":
            async with _postgres_database(POSTGRES_URL) as db_url:
                target = Target("postgres", db_url, scratch, postgres_dsn=db_url)
                try:
                    yield target
                finally:
                    await target.close()
            return
        else:
            raise BadRequest(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
        try:
            yield target
        finally:
            await target.close()
