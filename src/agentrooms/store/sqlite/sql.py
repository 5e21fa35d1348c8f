"""The SQLite backend's SQL, loaded once from the package's ``.sql`` files.

* ``queries.sql``: every statement the backend runs, as named queries (``-- name: x``
  header, a one-line description, one statement). :data:`QUERIES` maps name to SQL.
* ``migrations/NNNN_*.sql``: the schema, built step by step. :func:`migrate` applies the
  ones a database lacks under ``BEGIN IMMEDIATE`` and records the last in
  ``PRAGMA user_version``.

Migrations are squashed by replacing the oldest ones with one file that builds what they
built and takes the number of the newest of them: a database at that number is already
there, one between the dropped ones is refused (it was built by migrations this code no
longer has). Nothing is squashed past a released version.

Why it is built this way: ``docs/schema.md``.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from importlib.resources import files

from agentrooms.errors import StoreUnavailable

_PACKAGE = "agentrooms.store.sqlite"
_NAME = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Query:
    name: str
    description: str
    sql: str


def read_text(name: str) -> str:
    """A ``.sql`` file shipped in this package (``name`` may be ``migrations/x.sql``)."""
    resource = files(_PACKAGE)
    for part in name.split("/"):
        resource = resource.joinpath(part)
    return resource.read_text(encoding="utf-8")


def parse_queries(text: str) -> dict[str, Query]:
    """Named queries from ``text``; ``ValueError`` on a malformed or duplicated one."""
    parts = _NAME.split(text)
    queries: dict[str, Query] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = body.strip().splitlines()
        if not lines or not lines[0].startswith("-- "):
            raise ValueError(f"query {name!r} has no one-line description")
        sql = "\n".join(lines[1:]).strip()
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        if len(split_statements(sql)) != 1:
            raise ValueError(f"query {name!r} must be exactly one statement")
        queries[name] = Query(name, lines[0][3:].strip(), sql)
    return queries


def split_statements(script: str) -> list[str]:
    """The complete statements of ``script`` in order (comments between them dropped)."""
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statement = pending.strip()
            if _strip_comments(statement):
                statements.append(statement)
            pending = ""
    if _strip_comments(pending):
        raise ValueError(f"incomplete SQL statement: {pending.strip()[:80]!r}")
    return statements


def _strip_comments(sql: str) -> str:
    lines = (line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return "\n".join(lines).strip().strip(";").strip()


def load_migrations() -> list[tuple[int, str]]:
    """``(number, script)`` of every migration, in order, numbered without gaps from the
    first."""
    found = []
    for entry in files(_PACKAGE).joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text(encoding="utf-8")))
    found.sort()
    numbers = [n for n, _ in found]
    if not numbers or numbers != list(range(numbers[0], numbers[0] + len(found))):
        raise ValueError(f"migrations must be numbered without gaps: {numbers}")
    return found


QUERIES: dict[str, str] = {q.name: q.sql for q in parse_queries(read_text("queries.sql")).values()}
MIGRATIONS: list[tuple[int, str]] = load_migrations()
FIRST = MIGRATIONS[0][0]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def schema_version(conn: sqlite3.Connection) -> int:
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the database up to the last migration; returns the schema version.

    Runs under ``BEGIN IMMEDIATE`` and re-reads ``user_version`` inside it, so of several
    processes opening a fresh file at once exactly one applies each migration (the others
    wait on the lock, or get ``SQLITE_BUSY`` for the caller to retry, then find nothing to
    do). A database newer than this code, or at a version between those a squash
    replaced, raises ``StoreUnavailable``.
    """
    latest = SCHEMA_VERSION
    if schema_version(conn) == latest:
        return latest
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = schema_version(conn)
        if current > latest:
            raise StoreUnavailable(
                f"the database has schema version {current}, newer than the {latest} this "
                "agentrooms knows: upgrade agentrooms"
            )
        if 0 < current < FIRST:
            raise StoreUnavailable(
                f"the database has schema version {current}, from migrations since squashed "
                f"into version {FIRST}: delete the file to recreate it"
            )
        for number, script in MIGRATIONS:
            if number <= current:
                continue
            for statement in split_statements(script):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number:d}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return latest
