"""The SQLite backend's SQL files: named queries and the migrations that build the schema."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from agentrooms.errors import StoreUnavailable
from agentrooms.store import Put, SetAdd, open_store
from agentrooms.store.sqlite import operations
from agentrooms.store.sqlite.config import SqliteConfig
from agentrooms.store.sqlite.engine import Engine
from agentrooms.store.sqlite.sql import (
    FIRST,
    MIGRATIONS,
    SCHEMA_VERSION,
    migrate,
    parse_queries,
    read_text,
    schema_version,
    split_statements,
)


def test_every_query_is_named_described_and_used() -> None:
    queries = parse_queries(read_text("queries.sql"))
    primitives = "read|transact|scan|trim_log|last_seq|set_pick|set_size|glance|watch|delete_room"
    used = set(re.findall(rf'"((?:{primitives})\w*)"', _source()))
    assert set(queries) == used
    for query in queries.values():
        assert query.description
        assert not query.description.startswith("--")
        assert re.match(rf"(?:{primitives})(?:_|$)", query.name), query.name


def _source() -> str:
    return Path(operations.__file__).read_text(encoding="utf-8")


def test_parse_queries_rejects_malformed_files() -> None:
    with pytest.raises(ValueError, match="description"):
        parse_queries("-- name: a\nSELECT 1;\n")
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a\n-- one\nSELECT 1;\n-- name: a\n-- two\nSELECT 2;\n")
    with pytest.raises(ValueError, match="exactly one"):
        parse_queries("-- name: a\n-- two statements\nSELECT 1;\nSELECT 2;\n")


def test_split_statements_respects_strings_and_comments() -> None:
    script = "-- a; comment\nINSERT INTO t VALUES ('x;y');\n\n/* b; */ SELECT 1;\n-- trailing\n"
    assert split_statements(script) == [
        "-- a; comment\nINSERT INTO t VALUES ('x;y');",
        "/* b; */ SELECT 1;",
    ]
    with pytest.raises(ValueError, match="incomplete"):
        split_statements("SELECT 1")


def _shape(conn: sqlite3.Connection) -> dict[str, object]:
    """Tables, columns, indexes and seed rows: what a migration must reproduce."""
    shape: dict[str, object] = {}
    names = conn.execute(
        "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_stat%' ORDER BY name"
    ).fetchall()
    for kind, name in names:
        if kind == "table":
            shape[name] = (
                conn.execute(f"PRAGMA table_xinfo({name})").fetchall(),
                [tuple(r)[1:] for r in conn.execute(f"PRAGMA index_list({name})")],
                conn.execute(f"SELECT * FROM {name}").fetchall() if name == "revision" else None,
            )
        elif kind == "index":
            shape[name] = conn.execute(f"PRAGMA index_xinfo({name})").fetchall()
    return shape


def test_migrate_builds_the_schema_once() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    assert migrate(conn) == SCHEMA_VERSION == MIGRATIONS[-1][0]
    assert schema_version(conn) == SCHEMA_VERSION
    shape = _shape(conn)
    assert {"records", "events", "rooms", "revision", "set_members"} <= set(shape)
    assert migrate(conn) == SCHEMA_VERSION  # idempotent
    assert _shape(conn) == shape


def test_a_database_between_squashed_versions_is_refused() -> None:
    assert FIRST > 1, "no squash to test"
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute(f"PRAGMA user_version = {FIRST - 1}")
    with pytest.raises(StoreUnavailable, match="squashed"):
        migrate(conn)
    assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_a_newer_database_is_refused() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(conn)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreUnavailable, match="newer"):
        migrate(conn)


def test_concurrent_openers_of_a_fresh_file_migrate_once(tmp_path: Path) -> None:
    """Separate connections (as separate processes have) race to set WAL and migrate."""
    config = SqliteConfig(str(tmp_path / "deep" / "fresh.db"), busy_timeout_ms=10)
    engines = [Engine(config, time.time, retry_for=30.0) for _ in range(8)]
    errors: list[Exception | None] = []
    barrier = threading.Barrier(len(engines))

    def start(engine: Engine) -> None:
        barrier.wait()
        errors.append(engine.start())
        engine.close()  # on the thread that owns the connection

    threads = [threading.Thread(target=start, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [None] * len(engines)
    conn = sqlite3.connect(config.path)
    assert schema_version(conn) == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT id, last FROM revision").fetchall() == [(1, 0)]
    conn.close()


async def test_a_database_built_before_the_squash_keeps_working_with_its_data(
    tmp_path: Path,
) -> None:
    """A file at the squash's number (built by the squash here: the migrations it replaced
    built the same tables) opens with its data, the migrations after the squash applied
    (its events, appended before authors were stored, read with none)."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    number, script = MIGRATIONS[0]
    assert number == FIRST
    for statement in split_statements(script):
        conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {FIRST}")
    conn.execute("INSERT INTO records VALUES ('r', 'k', '\"old\"', 7, NULL)")
    conn.execute("INSERT INTO rooms (room, seq) VALUES ('r', 1)")
    conn.execute("INSERT INTO events VALUES ('r', 1, 'e', 'null', 0)")
    conn.execute("UPDATE revision SET last = 7")
    conn.close()
    store = await open_store(f"sqlite:///{path}")
    try:
        assert (await store.info()).details["schema_version"] == SCHEMA_VERSION
        record = (await store.read("r", ["k"])).get("k")
        assert record is not None
        assert (record.value, record.version) == ("old", 7)
        assert [(e.type, e.author) for e in await store.read_log("r")] == [("e", None)]
        result = await store.transact("r", writes=[Put("k", "new"), SetAdd("s", "m")])
        assert result.versions == {"k": 8}
        assert await store.set_pick("r", "s", 2) == ["m"]
    finally:
        await store.close()
