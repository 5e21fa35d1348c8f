"""The PostgreSQL store's URL and session settings.

URL query parameters of our own, removed before the rest reaches asyncpg:

* ``schema`` (default ``agentrooms``): the PostgreSQL schema holding the store, so that
  several stores can share a database. Created and migrated by
  :meth:`~agentrooms.store.postgres.backend.PostgresStore.open`.
* ``pool_size`` (default 10): the most connections this store opens.
* ``connect_timeout`` (seconds, default 10): opening one connection.
* ``timeout`` (seconds, default 30): one call, waiting for a free connection and then
  for its statement's reply (a call that must open a connection may also take
  ``connect_timeout`` for that). A statement past it is cancelled on the server and the
  call raises ``StoreUnavailable``; for a write, its outcome is unknown.

The libpq parameters asyncpg reads (``sslmode``, ``passfile``, ...: :data:`DRIVER_PARAMETERS`)
go to asyncpg; any other parameter is a ``BadRequest`` at open, naming it and the
accepted ones (asyncpg would send it to the server as a setting, failing the connection).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from agentrooms.errors import BadRequest
from agentrooms.store.params import check_names, seconds
from agentrooms.store.postgres.sql import quote_ident

DEFAULT_SCHEMA = "agentrooms"
DEFAULT_POOL_SIZE = 10
DEFAULT_CONNECT_TIMEOUT = 10.0  # seconds to open a connection
DEFAULT_TIMEOUT = 30.0  # seconds a call may wait for a connection and its statement
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

DRIVER_PARAMETERS = (
    "host",
    "port",
    "dbname",
    "database",
    "user",
    "password",
    "passfile",
    "service",
    "sslmode",
    "sslcert",
    "sslkey",
    "sslrootcert",
    "sslnegotiation",
    "sslcrl",
    "sslpassword",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "target_session_attrs",
    "krbsrvname",
    "gsslib",
)
"""The libpq connection parameters asyncpg reads from a URL (it would send any other to
the server as a session setting, which fails the connection)."""

PARAMETERS = ("schema", "pool_size", "connect_timeout", "timeout", *DRIVER_PARAMETERS)
"""Every URL parameter a PostgreSQL store accepts; any other is a ``BadRequest``."""


@dataclass(frozen=True, slots=True)
class PostgresConfig:
    dsn: str  # the URL for asyncpg, without our own parameters
    schema: str = DEFAULT_SCHEMA
    pool_size: int = DEFAULT_POOL_SIZE
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    timeout: float = DEFAULT_TIMEOUT


def parse_url(url: str) -> PostgresConfig:
    """Our own query parameters, split off ``url``, and the DSN for asyncpg with the
    rest; ``BadRequest`` for an unknown parameter or a bad value (before any IO)."""
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in params if k in PARAMETERS[:4]}
    check_names("postgresql", (k for k, _ in params), PARAMETERS)
    rest = [(k, v) for k, v in params if k not in own]
    schema = own.get("schema", DEFAULT_SCHEMA)
    if not _SCHEMA_NAME.match(schema):
        raise BadRequest(f"schema {schema!r} must be a lowercase SQL identifier ([a-z0-9_])")
    size = own.get("pool_size", str(DEFAULT_POOL_SIZE))
    if not size.isdigit() or not 1 <= int(size) <= 1000:
        raise BadRequest(f"pool_size {size!r} must be an integer from 1 to 1000")
    dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), ""))
    return PostgresConfig(
        dsn,
        schema,
        int(size),
        seconds(own, "connect_timeout", DEFAULT_CONNECT_TIMEOUT),
        seconds(own, "timeout", DEFAULT_TIMEOUT),
    )


def redact(url: str) -> str:
    """``url`` without its password (in the authority or as a query parameter)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = userinfo.split(":", 1)[0] + "@" + host
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, True) if k != "password"])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def session_settings(schema: str) -> dict[str, str]:
    """Settings of every session the store opens. Our statements are written to plan
    well for any argument, so they use generic plans (re-planning costs more than they
    take to run) and never JIT; transact relies on READ COMMITTED, whatever the server's
    default."""
    return {
        "search_path": quote_ident(schema),
        "application_name": "agentrooms",
        "default_transaction_isolation": "read committed",
        "plan_cache_mode": "force_generic_plan",
        "jit": "off",
    }
