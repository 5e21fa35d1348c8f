"""The PostgreSQL backend's SQL files, loaded once at import, and its schema migrations.

* ``queries.sql``: named queries (``-- name: NAME`` then a one-line description).
* ``schema.sql``: the full current schema, what a fresh store is created from.
* ``migrations/NNNN_name.sql``: the same schema built step by step; an existing store
  runs the ones it lacks. The ``schema_migrations`` table records what was applied.

To change the schema, add the next numbered migration and make the same change to
``schema.sql``; ``tests/unit/test_postgres_schema.py`` fails until both agree.

:func:`migrate` is safe to call from any number of processes at once: changes happen
under a transaction-scoped advisory lock per schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from agentrooms.errors import StoreUnavailable

_PACKAGE = resources.files(__package__ or "agentrooms.store.postgres")
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Query:
    name: str
    description: str
    sql: str


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def parse_queries(text: str) -> dict[str, Query]:
    """Split a named-query file: each ``-- name: NAME`` line starts a query, the comment
    line after it is its description, the rest up to the next name its SQL."""
    parts = _NAME.split(text)
    queries: dict[str, Query] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        first, _, sql = body.strip().partition("\n")
        if name in queries or not first.startswith("--") or not sql.strip():
            raise ValueError(f"query {name!r} is repeated, undescribed or empty")
        description = first.removeprefix("--").strip()
        queries[name] = Query(name, description, sql.strip().removesuffix(";"))
    return queries


def load_migrations() -> list[Migration]:
    """The numbered migrations, oldest first."""
    found = []
    for entry in _PACKAGE.joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise ValueError(f"migrations must be numbered 1..n without gaps: {found}")
    return found


QUERIES = parse_queries(_PACKAGE.joinpath("queries.sql").read_text("utf-8"))
SCHEMA = _PACKAGE.joinpath("schema.sql").read_text("utf-8")
MIGRATIONS = load_migrations()
LATEST = MIGRATIONS[-1].version


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def schema_version(conn: asyncpg.Connection) -> int:
    """The newest migration applied to the connection's schema (its search_path), 0 if
    the schema has none."""
    if not await conn.fetchval(QUERIES["schema_exists"].sql):
        return 0
    version: int = await conn.fetchval(QUERIES["schema_version"].sql)
    return version


async def migrate(conn: asyncpg.Connection, schema: str, *, stepwise: bool = False) -> int:
    """Create or upgrade ``schema`` (which must be the connection's search_path) to the
    latest version and return the version it was at.

    A fresh schema is created from ``schema.sql`` unless ``stepwise`` (tests use it to
    prove that the migrations build the same schema); an existing one runs the
    migrations it lacks. Raises ``StoreUnavailable`` if the schema is newer than this
    code knows.
    """
    found = await schema_version(conn)
    if found == LATEST:
        return found
    async with conn.transaction():
        await conn.execute(QUERIES["lock_migrations"].sql, schema)
        if not await conn.fetchval(QUERIES["namespace_exists"].sql, quote_ident(schema)):
            # A schema name cannot be a query argument; the backend validates it.
            await conn.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        found = await schema_version(conn)
        if found > LATEST:
            raise StoreUnavailable(
                f"schema {schema!r} is at version {found}, newer than this agentrooms "
                f"knows ({LATEST}): upgrade agentrooms"
            )
        pending = [m for m in MIGRATIONS if m.version > found]
        if found == 0 and not stepwise:
            await conn.execute(SCHEMA)
        else:
            for migration in pending:
                await conn.execute(migration.sql)
        for migration in pending:
            await conn.execute(QUERIES["record_migration"].sql, migration.version, migration.name)
    return found
