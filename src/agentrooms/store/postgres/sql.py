"""The PostgreSQL backend's SQL files, loaded once at import, and its schema migrations.

* ``queries.sql``: named queries (``-- name: NAME`` then a one-line description), every
  object qualified with ``{schema}`` (:meth:`Query.on` puts the schema there).
* ``migrations/NNNN_name.sql``: the tables, sequences and indexes, built step by step;
  :func:`migrate` runs the ones a schema lacks, oldest first, and records each in the
  ``schema_migrations`` table.
* ``functions/NAME.sql``: one function each (``CREATE OR REPLACE FUNCTION NAME``), its
  only definition. After the migrations, :func:`migrate` runs every file whose digest
  differs from the one recorded as its function's comment (none recorded: a function
  created otherwise), so changing a function is editing its file. A migration must drop a
  function whose arguments or result change (``CREATE OR REPLACE`` cannot change them)
  or that loses its file.

Migrations are squashed by replacing the oldest ones with one file that builds what they
built and takes the number of the newest of them: a schema at that number is already
there, one between the dropped ones is refused (it was built by migrations this code no
longer has). Nothing is squashed past a released version.

:func:`migrate` is safe to call from any number of processes at once: it runs in one
transaction under an advisory lock per schema.

Why it is built this way: ``docs/schema.md``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from agentrooms.errors import StoreUnavailable

_PACKAGE = resources.files(__package__ or "agentrooms.store.postgres")
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")
_FUNCTION = re.compile(r"^CREATE OR REPLACE FUNCTION (\w+)\(", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Query:
    name: str
    description: str
    sql: str

    def on(self, schema: str) -> str:
        """The SQL for the store in ``schema`` (a name the config validated)."""
        return self.sql.replace("{schema}", quote_ident(schema))


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
    """The numbered migrations, oldest first, numbered without gaps from the first."""
    found = []
    for entry in _PACKAGE.joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if not versions or versions != list(range(versions[0], versions[0] + len(found))):
        raise ValueError(f"migrations must be numbered without gaps: {versions}")
    return found


def load_functions() -> dict[str, str]:
    """Function name -> the ``functions/NAME.sql`` that defines it, in name order; each
    file must create exactly the function it is named after."""
    found = {}
    for entry in _PACKAGE.joinpath("functions").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        sql = entry.read_text("utf-8")
        if _FUNCTION.findall(sql) != [entry.name.removesuffix(".sql")]:
            raise ValueError(f"functions/{entry.name} must create exactly that function")
        found[entry.name.removesuffix(".sql")] = sql
    return dict(sorted(found.items()))


QUERIES = parse_queries(_PACKAGE.joinpath("queries.sql").read_text("utf-8"))
MIGRATIONS = load_migrations()
FUNCTIONS = load_functions()
# Function name -> the comment that records which file text created it.
DIGESTS = {
    name: f"agentrooms functions/{name}.sql sha256:{hashlib.sha256(sql.encode()).hexdigest()}"
    for name, sql in FUNCTIONS.items()
}
FIRST = MIGRATIONS[0].version
LATEST = MIGRATIONS[-1].version


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def schema_version(conn: asyncpg.Connection, schema: str) -> int:
    """The newest migration applied to ``schema``, 0 if the schema has none."""
    if not await conn.fetchval(QUERIES["schema_exists"].on(schema)):
        return 0
    version: int = await conn.fetchval(QUERIES["schema_version"].on(schema))
    return version


async def _outdated_functions(conn: asyncpg.Connection, schema: str) -> list[str]:
    """The functions of ``schema`` not created from their file as it is."""
    rows = await conn.fetch(QUERIES["function_digests"].on(schema))
    found = {row["name"]: row["digest"] for row in rows}
    return [name for name, digest in DIGESTS.items() if found.get(name) != digest]


async def migrate(conn: asyncpg.Connection, schema: str) -> int:
    """Create or upgrade ``schema`` to the latest version with every function as its
    file defines it; return the version it was at. The connection's own search_path
    does not matter (nor survives: behind a pooler it may not be ours): the migration's
    transaction sets its own (``SET LOCAL``), which the functions keep (``SET search_path
    FROM CURRENT``).

    All of it, or nothing, in one READ COMMITTED transaction; nothing when there is
    nothing to do.
    Raises ``StoreUnavailable`` if the schema is newer than this code knows, or at a
    version between those a squash replaced.
    """
    found = await schema_version(conn, schema)
    if found == LATEST and not await _outdated_functions(conn, schema):
        return found
    async with conn.transaction(isolation="read_committed"):
        await conn.execute(QUERIES["lock_migrations"].sql, schema)
        if not await conn.fetchval(QUERIES["namespace_exists"].sql, quote_ident(schema)):
            # A schema name cannot be a query argument; the backend validates it.
            await conn.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        await conn.execute(f"SET LOCAL search_path TO {quote_ident(schema)}")
        found = await schema_version(conn, schema)
        if found > LATEST:
            raise StoreUnavailable(
                f"schema {schema!r} is at version {found}, newer than this agentrooms "
                f"knows ({LATEST}): upgrade agentrooms"
            )
        if 0 < found < FIRST:
            raise StoreUnavailable(
                f"schema {schema!r} is at version {found}, from migrations since squashed "
                f"into version {FIRST}: drop the schema to recreate it"
            )
        for migration in MIGRATIONS:
            if migration.version > found:
                await conn.execute(migration.sql)
                await conn.execute(
                    QUERIES["record_migration"].on(schema), migration.version, migration.name
                )
        for name in await _outdated_functions(conn, schema):
            await conn.execute(FUNCTIONS[name])
            # A name and a hex digest: nothing to quote.
            await conn.execute(f"COMMENT ON FUNCTION {name} IS '{DIGESTS[name]}'")
    return found
