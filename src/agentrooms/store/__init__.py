"""The store primitive and its backends, chosen by URL.

=====================  ==============================================================
URL                    backend
=====================  ==============================================================
``memory://``          in-process reference backend (tests; keeps nothing)
``sqlite:///rel.db``   embedded default; ``sqlite:////abs/path.db`` for an absolute path
``redis://host:port/db?prefix=ar``            Redis 6.2+ (extra ``agentrooms[redis]``)
``redis+cluster://h1:p1,h2:p2/?prefix=ar``    Redis Cluster 7+ (extra ``agentrooms[redis]``)
``postgresql://user@host:port/dbname``        PostgreSQL 13+ (extra ``agentrooms[postgres]``)
=====================  ==============================================================

Each backend's URL parameters are documented in its module (PostgreSQL's, including
``pooler``, ``listen_url`` and ``poll_interval`` for running behind pgbouncer, in
``agentrooms.store.postgres.config``) and in the README's table; docs/scaling.md says
how to run PostgreSQL behind a connection pooler.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

from agentrooms.errors import BadRequest
from agentrooms.store.base import Store
from agentrooms.store.types import (
    Absent,
    Append,
    Compare,
    Delete,
    Event,
    FenceAtMost,
    KeyPage,
    Limits,
    Present,
    Put,
    PutOutcome,
    Record,
    ScanPage,
    SetAdd,
    SetRemove,
    Snapshot,
    StoreInfo,
    TransactResult,
    VersionIs,
    Write,
)

__all__ = [
    "Absent",
    "Append",
    "Compare",
    "Delete",
    "Event",
    "FenceAtMost",
    "KeyPage",
    "Limits",
    "Present",
    "Put",
    "PutOutcome",
    "Record",
    "ScanPage",
    "SetAdd",
    "SetRemove",
    "Snapshot",
    "Store",
    "StoreInfo",
    "TransactResult",
    "VersionIs",
    "Write",
    "open_store",
]

# scheme -> (module, class, extra that provides its driver)
_BACKENDS: dict[str, tuple[str, str, str | None]] = {
    "memory": ("agentrooms.store.memory", "MemoryStore", None),
    "sqlite": ("agentrooms.store.sqlite.backend", "SqliteStore", None),
    "redis": ("agentrooms.store.redis.backend", "RedisStore", "redis"),
    "rediss": ("agentrooms.store.redis.backend", "RedisStore", "redis"),
    "redis+cluster": ("agentrooms.store.redis.cluster", "RedisClusterStore", "redis"),
    "rediss+cluster": ("agentrooms.store.redis.cluster", "RedisClusterStore", "redis"),
    "postgresql": ("agentrooms.store.postgres.backend", "PostgresStore", "postgres"),
    "postgres": ("agentrooms.store.postgres.backend", "PostgresStore", "postgres"),
}


async def open_store(url: str, *, limits: Limits | None = None) -> Store:
    """Open (and, where needed, create or migrate) the store named by ``url``.

    Raises :class:`~agentrooms.errors.BadRequest` for an unknown scheme or a backend
    whose driver is not installed (naming the extra to install), and
    :class:`~agentrooms.errors.StoreUnavailable` if the store cannot be reached.
    """
    if not isinstance(url, str) or "://" not in url:
        raise BadRequest(f"not a store URL: {url!r} (expected e.g. sqlite:///agentrooms.db)")
    scheme = urlsplit(url).scheme.lower()
    if scheme not in _BACKENDS:
        known = ", ".join(sorted(_BACKENDS))
        raise BadRequest(f"unknown store URL scheme {scheme!r} in {url!r}; known: {known}")
    module_name, class_name, extra = _BACKENDS[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f": pip install 'agentrooms[{extra}]'" if extra else ""
        raise BadRequest(f"the {scheme} backend needs a driver that is missing{hint}") from exc
    cls: type[Store] = getattr(module, class_name)
    return await cls.open(url, limits)
