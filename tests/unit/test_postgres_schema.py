"""The PostgreSQL backend's schema and SQL, against the run's test database.

* the numbered migrations build exactly the schema that ``schema.sql`` creates;
* concurrent openers of a fresh schema migrate it once;
* every named query prepares, and the SQL fence rule is ``fence_of``'s;
* what the conformance suite cannot see: lock placeholders never commit, absence is
  locked (no write skew), the one-statement compare-and-set path keeps the rules, and
  driver errors become ours.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from agentrooms.errors import BadRequest, StaleFence, StoreUnavailable, VersionConflict
from agentrooms.store import Absent, FenceAtMost, Put, Store, VersionIs, open_store
from agentrooms.store.base import fence_of
from agentrooms.store.postgres.sql import MIGRATIONS, QUERIES, migrate, quote_ident

# What a schema holds, each row with the schema's name replaced by "<schema>".
CATALOG = {
    "relations": """
        SELECT c.relname, c.relkind, c.reloptions
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               co.collname, pg_get_expr(d.adbin, d.adrelid)
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_collation co ON co.oid = a.attcollation
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE n.nspname = $1 AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY c.relname, a.attnum""",
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
          FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
         WHERE n.nspname = $1 ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY 1""",
    "sequences": """
        SELECT sequencename, data_type::text, start_value, increment_by, max_value, cycle
          FROM pg_sequences WHERE schemaname = $1 ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.proconfig,
               pg_get_functiondef(p.oid)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = $1 ORDER BY 1, 2""",
    "migrations": "SELECT version, name FROM {schema}.schema_migrations ORDER BY 1",
}


async def _dump(conn: asyncpg.Connection, schema: str) -> dict[str, list[str]]:
    dump = {}
    for what, query in CATALOG.items():
        if "{schema}" in query:
            rows = await conn.fetch(query.format(schema=quote_ident(schema)))
        else:
            rows = await conn.fetch(query, schema)
        dump[what] = [repr(tuple(row)).replace(schema, "<schema>") for row in rows]
    return dump


def _url(postgres_url: str, schema: str) -> str:
    return f"{postgres_url}?schema={schema}"


@pytest.fixture
async def conn(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(postgres_url)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
def schema(postgres_url: str) -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def pg(postgres_url: str, schema: str) -> AsyncIterator[Store]:
    store = await open_store(_url(postgres_url, schema))
    try:
        yield store
    finally:
        await store.close()


async def test_migrations_build_the_same_schema_as_schema_sql(postgres_url: str) -> None:
    dumps = []
    for stepwise in (False, True):
        name = f"t_{'steps' if stepwise else 'fresh'}_{uuid.uuid4().hex[:8]}"
        conn = await asyncpg.connect(postgres_url, server_settings={"search_path": name})
        try:
            assert await migrate(conn, name, stepwise=stepwise) == 0
            assert await migrate(conn, name) == MIGRATIONS[-1].version  # now a no-op
            dumps.append(await _dump(conn, name))
        finally:
            await conn.execute(f"DROP SCHEMA {quote_ident(name)} CASCADE")
            await conn.close()
    fresh, steps = dumps
    assert fresh["relations"], "the dump found nothing: the comparison would be empty"
    for what in CATALOG:
        assert fresh[what] == steps[what], what


async def test_concurrent_openers_migrate_once(
    postgres_url: str, schema: str, conn: asyncpg.Connection
) -> None:
    stores = await asyncio.gather(*(open_store(_url(postgres_url, schema)) for _ in range(6)))
    try:
        rows = await conn.fetch(f"SELECT version FROM {quote_ident(schema)}.schema_migrations")
        assert sorted(row[0] for row in rows) == [m.version for m in MIGRATIONS]
    finally:
        for store in stores:
            await store.close()


async def test_every_named_query_is_described_and_prepares(
    postgres_url: str, pg: Store, schema: str
) -> None:
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
    try:
        for query in QUERIES.values():
            assert query.description, query.name
            await conn.prepare(query.sql)
    finally:
        await conn.close()


FENCE_VALUES: list[Any] = [
    {"fence": 7},
    {"fence": -3},
    {"fence": 0},
    {"fence": 2**70},
    {"fence": 7.0},
    {"fence": 1e3},
    {"fence": True},
    {"fence": "7"},
    {"fence": None},
    {"fence": [7]},
    {"owner": "a", "nested": {"fence": 3}},
    [{"fence": 4}],
    "fence",
    5,
    None,
]


async def test_sql_fence_rule_is_fence_of(pg: Store, conn: asyncpg.Connection, schema: str) -> None:
    for value in FENCE_VALUES:
        text = json.dumps(value)
        got = await conn.fetchval(f"SELECT {quote_ident(schema)}.fence_of($1)", text)
        assert got == fence_of(json.loads(text)), text


async def _placeholders(conn: asyncpg.Connection, schema: str) -> int:
    count: int = await conn.fetchval(
        f"SELECT count(*) FROM {quote_ident(schema)}.records WHERE value IS NULL"
    )
    return count


async def test_lock_placeholders_never_commit(
    pg: Store, conn: asyncpg.Connection, schema: str
) -> None:
    await pg.transact("r", [Absent("a")], [Put("b", 1)])  # compared, not written
    with pytest.raises(VersionConflict):
        await pg.transact("r", [Absent("b"), Absent("c")], [Put("c", 1)])
    with pytest.raises(StaleFence):
        await pg.transact("r", [FenceAtMost("nobody", 1)], [Put("d", 1)])
    assert await _placeholders(conn, schema) == 0
    snap = await pg.read("r", ["a", "b", "c", "d"])
    assert set(snap.records) == {"b"}


async def test_absence_is_locked_so_no_write_skew(postgres_url: str, schema: str) -> None:
    """Each writer requires the other's key to be absent: at most one may win, every
    time (without locking absent keys, both could see both keys absent)."""
    one = await open_store(_url(postgres_url, schema))
    two = await open_store(_url(postgres_url, schema))
    try:
        for trial in range(40):
            room = f"skew-{trial}"
            outcomes = await asyncio.gather(
                one.transact(room, [Absent("a")], [Put("b", 1)]),
                two.transact(room, [Absent("b")], [Put("a", 1)]),
                return_exceptions=True,
            )
            wins = [o for o in outcomes if not isinstance(o, BaseException)]
            assert len(wins) == 1, outcomes
            assert all(isinstance(o, VersionConflict) for o in outcomes if o not in wins)
    finally:
        await one.close()
        await two.close()


async def test_compare_and_set_path_keeps_the_rules(pg: Store) -> None:
    v = (await pg.transact("r", writes=[Put("k", 1)])).versions["k"]
    r = await pg.transact("r", [VersionIs("k", v)], [Put("k", 2, ttl=0.3)])
    record = (await pg.read("r", ["k"])).get("k")
    assert record is not None
    assert (record.value, record.version) == (2, r.versions["k"])
    assert r.versions["k"] > v
    assert record.expires_at is not None
    assert 0.2 < record.expires_at - r.now <= 0.31
    with pytest.raises(VersionConflict) as info:  # a version no store reaches: no overflow
        await pg.transact("r", [VersionIs("k", 2**70)], [Put("k", 3)])
    assert info.value.conflicts == {"k": r.versions["k"]}
    await asyncio.sleep(0.4)
    with pytest.raises(VersionConflict) as info:  # expired is absent
        await pg.transact("r", [VersionIs("k", r.versions["k"])], [Put("k", 3)])
    assert info.value.conflicts == {"k": None}


async def test_fences_beyond_bigint(pg: Store) -> None:
    await pg.transact("r", writes=[Put("task", {"fence": 2**70})])
    await pg.transact("r", [FenceAtMost("task", 2**70)], [Put("out", 1)])
    with pytest.raises(StaleFence) as info:
        await pg.transact("r", [FenceAtMost("task", 2**70 - 1)], [Put("out", 2)])
    assert info.value.current == 2**70


async def test_scan_prefixes_at_the_edges_of_unicode(pg: Store) -> None:
    keys = ["\U0010ffff", "\U0010ffff/x", "a\ud7ff", "a\ud7ffz", "a\ue000", "b"]
    await pg.transact("r", writes=[Put(k, k) for k in keys])
    for prefix in ["\U0010ffff", "a\ud7ff", "a", "", "\x00", "\ud800"]:
        got = [rec.key for rec in (await pg.scan("r", prefix)).records]
        assert got == sorted(k for k in keys if k.startswith(prefix)), prefix


async def test_invalid_unicode_in_a_value_is_a_bad_request(pg: Store) -> None:
    with pytest.raises(BadRequest) as info:
        await pg.transact("r", writes=[Put("k", "lone \ud800 surrogate")])
    assert isinstance(info.value.__cause__, asyncpg.PostgresError)
    assert (await pg.read("r", ["k"])).get("k") is None


async def test_info_reports_durability_without_the_password(postgres_url: str, schema: str) -> None:
    url = _url(postgres_url, schema).replace("postgres@", "postgres:s3cret@", 1)
    store = await open_store(url)
    try:
        info = await store.info()
    finally:
        await store.close()
    assert info.backend == "postgres"
    assert "s3cret" not in info.url
    assert f"schema={schema}" in info.url
    assert info.details["fsync"] in ("on", "off")
    if info.details["fsync"] == "on" and info.details["synchronous_commit"] != "off":
        assert info.durability.startswith("commit")
    else:
        assert info.warnings


async def test_unreachable_server_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable) as info:
        await open_store("postgresql://postgres@127.0.0.1:1/nothing")
    assert info.value.__cause__ is not None


async def test_closed_store_is_store_unavailable(postgres_url: str, schema: str) -> None:
    store = await open_store(_url(postgres_url, schema))
    await store.close()
    with pytest.raises(StoreUnavailable) as info:
        await store.read("r", ["k"])
    assert info.value.__cause__ is not None


@pytest.mark.parametrize("query", ["schema=Bad-Name", "schema=", "pool_size=0"])
async def test_bad_url_parameters(postgres_url: str, query: str) -> None:
    with pytest.raises(BadRequest):
        await open_store(f"{postgres_url}?{query}")


async def _wait_until_no_lock_waits(conn: asyncpg.Connection) -> None:
    query = """SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock'"""
    for _ in range(100):
        if await conn.fetchval(query) == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("a statement is still waiting for a lock")


@pytest.mark.parametrize("guarded", [True, False], ids=["compare-and-set", "transact"])
async def test_a_cancelled_call_is_cancelled_on_the_server(
    pg: Store, conn: asyncpg.Connection, schema: str, guarded: bool
) -> None:
    """The caller gives up while its statement waits for a lock: the statement is
    cancelled rather than left to commit later, and the store keeps working."""
    v = (await pg.transact("r", writes=[Put("k", "before")])).versions["k"]
    compares = [VersionIs("k", v)] if guarded else []
    holder = conn.transaction()
    await holder.start()
    await conn.execute(
        f"SELECT 1 FROM {quote_ident(schema)}.records WHERE room = 'r' AND key = 'k' FOR UPDATE"
    )
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pg.transact("r", compares, [Put("k", "late")]), 0.3)
    await _wait_until_no_lock_waits(conn)
    await holder.rollback()
    assert (await pg.read("r", ["k"])).value("k") == "before"
    assert (await pg.transact("r", [VersionIs("k", v)], [Put("k", "after")])).versions["k"] > v
