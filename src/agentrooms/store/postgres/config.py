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
* ``pooler`` (``transaction`` or ``session``; default none, a direct connection): the URL
  reaches PostgreSQL through a connection pooler such as pgbouncer in that pooling mode.
  Then the store sends no startup setting but ``application_name`` (poolers refuse or
  drop the others), relies on its statements being schema-qualified, and checks at open
  that the server's ``transaction_isolation`` is READ COMMITTED. ``transaction`` also
  turns off named prepared statements (each call is then parsed anew, unnamed: one more
  round trip) and, since NOTIFY cannot reach a pooled LISTEN, makes ``watch`` poll
  unless ``listen_url`` is given.
* ``listen_url``: a direct ``postgresql://`` URL (percent-encoded) of the same database
  for the one connection that LISTENs for ``watch``; by default the store's own URL.
* ``poll_interval`` (seconds, default 0.25): how often a ``watch`` re-reads the room when
  it cannot be notified (``pooler=transaction`` without ``listen_url``).

Without ``pooler``, :meth:`~agentrooms.store.postgres.backend.PostgresStore.open` checks
that its startup settings arrived (``current_schema()`` is the schema, the isolation READ
COMMITTED) and refuses a connection that lost them, as behind a pooler that drops startup
parameters, with a ``BadRequest`` naming ``pooler``. docs/scaling.md, "PostgreSQL behind
a pooler", says what each mode supports.

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
DEFAULT_POLL_INTERVAL = 0.25  # seconds between a polling watch's reads
POOLERS = ("transaction", "session")
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

OWN_PARAMETERS = (
    "schema",
    "pool_size",
    "connect_timeout",
    "timeout",
    "pooler",
    "listen_url",
    "poll_interval",
)
PARAMETERS = (*OWN_PARAMETERS, *DRIVER_PARAMETERS)
"""Every URL parameter a PostgreSQL store accepts; any other is a ``BadRequest``."""


@dataclass(frozen=True, slots=True)
class PostgresConfig:
    dsn: str  # the URL for asyncpg, without our own parameters
    schema: str = DEFAULT_SCHEMA
    pool_size: int = DEFAULT_POOL_SIZE
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    timeout: float = DEFAULT_TIMEOUT
    pooler: str | None = None  # "transaction", "session" or None (direct)
    listen_dsn: str | None = None  # the direct URL LISTEN uses, None: dsn
    poll_interval: float = DEFAULT_POLL_INTERVAL

    @property
    def polls(self) -> bool:
        """Whether ``watch`` polls: NOTIFY cannot reach a LISTEN made through it."""
        return self.pooler == "transaction" and self.listen_dsn is None


def parse_url(url: str) -> PostgresConfig:
    """Our own query parameters, split off ``url``, and the DSN for asyncpg with the
    rest; ``BadRequest`` for an unknown parameter or a bad value (before any IO)."""
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in params if k in OWN_PARAMETERS}
    check_names("postgresql", (k for k, _ in params), PARAMETERS)
    rest = [(k, v) for k, v in params if k not in own]
    schema = own.get("schema", DEFAULT_SCHEMA)
    if not _SCHEMA_NAME.match(schema):
        raise BadRequest(f"schema {schema!r} must be a lowercase SQL identifier ([a-z0-9_])")
    size = own.get("pool_size", str(DEFAULT_POOL_SIZE))
    if not size.isdigit() or not 1 <= int(size) <= 1000:
        raise BadRequest(f"pool_size {size!r} must be an integer from 1 to 1000")
    pooler = own.get("pooler")
    if pooler is not None and pooler not in POOLERS:
        raise BadRequest(f"pooler {pooler!r} must be one of {', '.join(POOLERS)}")
    listen = own.get("listen_url")
    if listen is not None:
        listen_parts = urlsplit(listen)
        if listen_parts.scheme not in ("postgresql", "postgres") or listen_parts.fragment:
            raise BadRequest("listen_url must be a postgresql:// URL (percent-encoded)")
        listen_names = (k for k, _ in parse_qsl(listen_parts.query, keep_blank_values=True))
        check_names("postgresql listen_url", listen_names, DRIVER_PARAMETERS)
    dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), ""))
    return PostgresConfig(
        dsn,
        schema,
        int(size),
        seconds(own, "connect_timeout", DEFAULT_CONNECT_TIMEOUT),
        seconds(own, "timeout", DEFAULT_TIMEOUT),
        pooler,
        listen,
        seconds(own, "poll_interval", DEFAULT_POLL_INTERVAL),
    )


def redact(url: str) -> str:
    """``url`` without its password (in the authority or as a query parameter)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = userinfo.split(":", 1)[0] + "@" + host
    query = urlencode(
        [
            (k, redact(v) if k == "listen_url" else v)
            for k, v in parse_qsl(parts.query, True)
            if k != "password"
        ]
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def session_settings(schema: str, pooler: str | None = None) -> dict[str, str]:
    """Settings of every session the store opens. Our statements are written to plan
    well for any argument, so they use generic plans (re-planning costs more than they
    take to run) and never JIT; transact relies on READ COMMITTED, whatever the server's
    default. Behind a pooler, only ``application_name`` (the one a pooler passes on:
    the others are refused or dropped, and the open check stands in for them)."""
    if pooler is not None:
        return {"application_name": "agentrooms"}
    return {
        "search_path": quote_ident(schema),
        "application_name": "agentrooms",
        "default_transaction_isolation": "read committed",
        "plan_cache_mode": "force_generic_plan",
        "jit": "off",
    }
