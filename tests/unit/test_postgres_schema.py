"""The PostgreSQL backend's schema and SQL, against the run's test database.

* migrate creates every function from its file, every time: a schema built by the
  migrations a squash replaced ends up as a fresh one, data kept; one between them, or
  newer than the code, is refused;
* concurrent openers of a fresh schema migrate it once;
* every named query prepares, and the SQL fence rule is ``fence_of``'s;
* what the conformance suite cannot see: lock placeholders never commit, absence is
  locked (no write skew), the one-statement compare-and-set path keeps the rules and
  its blocks of versions, and driver errors become ours;
* sets: net effects in lock order, the memory reference's answers, pickers that never
  share a member nor wait, claimers and opposing set operations that never deadlock, a
  pick whose cost does not grow with the set;
* watch: NOTIFY at commit only, one listening connection, reconnection, per-schema
  channels, close;
* delete_room: atomic against transacts in flight and amid writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from agentrooms.errors import (
    BadRequest,
    CursorCompacted,
    StaleFence,
    StoreUnavailable,
    VersionConflict,
)
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.store import (
    Absent,
    Append,
    Delete,
    FenceAtMost,
    Present,
    Put,
    PutOutcome,
    SetAdd,
    SetRemove,
    Store,
    VersionIs,
    Write,
    open_store,
)
from agentrooms.store.memory import MemoryStore
from agentrooms.store.postgres.backend import PostgresStore
from agentrooms.store.postgres.batches import set_args
from agentrooms.store.postgres.sql import (
    FIRST,
    FUNCTIONS,
    LATEST,
    MIGRATIONS,
    QUERIES,
    quote_ident,
)
from agentrooms.store.types import PreparedSetOp, fence_of

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
               pg_get_functiondef(p.oid), obj_description(p.oid, 'pg_proc')
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


async def _fresh(postgres_url: str) -> dict[str, list[str]]:
    """The catalog of a schema created by opening a store on it."""
    name = f"t_fresh_{uuid.uuid4().hex[:8]}"
    await (await open_store(_url(postgres_url, name))).close()
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": name})
    try:
        return await _dump(conn, name)
    finally:
        await conn.execute(f"DROP SCHEMA {quote_ident(name)} CASCADE")
        await conn.close()


async def test_a_fresh_schema_has_exactly_the_functions_of_the_files(
    postgres_url: str, pg: Store, schema: str, conn: asyncpg.Connection
) -> None:
    rows = await conn.fetch(
        """SELECT p.proname, p.proconfig
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = $1 ORDER BY 1""",
        schema,
    )
    assert [row["proname"] for row in rows] == list(FUNCTIONS)
    inlined = {"fence_of", "room_lock", "append_lock", "notify_channel"}  # see room_lock.sql
    for row in rows:
        config = set(row["proconfig"] or [])
        expected = set() if row["proname"] in inlined else {"plan_cache_mode=force_generic_plan"}
        assert {c for c in config if c.startswith("plan_cache_mode")} == expected, row
    history = await conn.fetch(f"SELECT version, name FROM {quote_ident(schema)}.schema_migrations")
    assert [tuple(row) for row in history] == [(m.version, m.name) for m in MIGRATIONS]


async def test_reopening_an_up_to_date_schema_writes_no_function(
    postgres_url: str, pg: Store, schema: str, conn: asyncpg.Connection
) -> None:
    """Functions are re-created only when their file changed: an open of a schema that
    has every one as its file defines it leaves their catalog rows as they were."""
    query = """SELECT p.proname, p.xmin::text
                 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = $1 ORDER BY 1"""
    before = [tuple(row) for row in await conn.fetch(query, schema)]
    await (await open_store(_url(postgres_url, schema))).close()
    assert [tuple(row) for row in await conn.fetch(query, schema)] == before
    assert len(before) == len(FUNCTIONS)


# The history a schema built by the migrations squashed into the first one records.
SQUASHED = [(1, "initial"), (2, "sets"), (3, "contention"), (4, "batches"), (5, "purge")]
# The migrations after the squash, which such a schema then got as every other did.
SINCE = [(m.version, m.name) for m in MIGRATIONS if m.version > FIRST]


async def test_a_schema_built_before_the_squash_keeps_working_with_its_data(
    postgres_url: str, schema: str
) -> None:
    """A schema at the squash's number (here built by the squash, with the history and an
    outdated function of one built by the migrations it replaced) migrates to the catalog
    of a fresh schema, history aside, its functions re-created from the files."""
    store = await open_store(_url(postgres_url, schema))
    try:
        await store.transact("r", writes=[Put("k", "kept")], appends=[Append("e")])
    finally:
        await store.close()
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
    try:
        await conn.execute("DELETE FROM schema_migrations")
        for version, name in [*SQUASHED, (FIRST, "outcomes"), *SINCE]:
            await conn.execute(QUERIES["record_migration"].on(schema), version, name)
        await conn.execute(
            "CREATE OR REPLACE FUNCTION trim_log(p_room text, p_before bigint) RETURNS bigint"
            " LANGUAGE sql AS $$ SELECT -1::bigint $$"
        )
        await conn.execute("COMMENT ON FUNCTION trim_log IS NULL")  # as they were created
    finally:
        await conn.close()
    store = await open_store(_url(postgres_url, schema))
    try:
        record = (await store.read("r", ["k"])).get("k")
        assert record is not None and record.value == "kept"
        assert [e.type for e in await store.read_log("r")] == ["e"]
        assert await store.trim_log("r", 2) == 2  # the file's trim_log again
        result = await store.transact(
            "r", [VersionIs("k", record.version)], [Put("k", 2), SetAdd("s", "m")], [Append("f")]
        )
        assert result.seqs == [2]
        assert await store.set_pick("r", "s") == ["m"]
        conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
        try:
            migrated = await _dump(conn, schema)
        finally:
            await conn.close()
    finally:
        await store.close()
    fresh = await _fresh(postgres_url)
    assert migrated["migrations"] == [repr(row) for row in [*SQUASHED, (FIRST, "outcomes"), *SINCE]]
    for what in CATALOG:
        if what != "migrations":
            assert migrated[what] == fresh[what], what


_OLD_ARGS = (  # transact()'s arguments before migration 0007 added p_authors
    "text, integer[], text[], text[], numeric[], integer[], text[], text[], bigint[], "
    "integer[], text[], integer[], text[], text[], text[], integer[], text[], text[]"
)


async def _as_at(postgres_url: str, schema: str, version: int, changes: list[str]) -> None:
    """Make ``schema`` look as ``version`` left it: the ``changes`` made (its tables back
    to that version), its later migrations unrecorded, and in place of today's
    transact() the two functions it had then, transact() with that version's arguments
    and transact_recording() with one more array (stubs: migrate must drop them)."""
    args = {6: _OLD_ARGS, 7: _OLD_ARGS + ", text[]", 8: _OLD_ARGS + ", text[], text[]"}[version]
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
    try:
        for change in changes:
            await conn.execute(change)
        await conn.execute("DELETE FROM schema_migrations WHERE version > $1", version)
        await conn.execute("DROP FUNCTION transact")
        for name, given in [("transact", args), ("transact_recording", args + ", text[]")]:
            await conn.execute(
                f"CREATE FUNCTION {name}({given}) RETURNS void LANGUAGE sql AS $$ SELECT $$"
            )
    finally:
        await conn.close()


async def _assert_fresh(postgres_url: str, schema: str) -> None:
    """``schema`` has the catalog of a fresh schema."""
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
    try:
        migrated = await _dump(conn, schema)
    finally:
        await conn.close()
    fresh = await _fresh(postgres_url)
    assert "transact_recording" not in repr(fresh["functions"])
    for what in CATALOG:
        assert migrated[what] == fresh[what], what


async def test_a_schema_at_version_6_gets_event_authors_and_keeps_its_events(
    postgres_url: str, schema: str
) -> None:
    """Migration 0007 on a schema as version 6 left it (no events.author; transact()
    and transact_recording() without p_authors): its old functions are dropped and
    replaced, its events read with no author, and it ends with a fresh schema's catalog."""
    store = await open_store(_url(postgres_url, schema))
    try:
        await store.transact("r", appends=[Append("old")])
    finally:
        await store.close()
    await _as_at(
        postgres_url, schema, 6, ["ALTER TABLE events DROP COLUMN author, DROP COLUMN recipients"]
    )
    store = await open_store(_url(postgres_url, schema))
    try:
        await store.transact("r", writes=[PutOutcome("o", {})], appends=[Append("new", author="a")])
        await store.transact("r", appends=[Append("newer", author="b")])
        log = await store.read_log("r")
        assert [(e.type, e.author) for e in log] == [("old", None), ("new", "a"), ("newer", "b")]
    finally:
        await store.close()
    await _assert_fresh(postgres_url, schema)


async def test_a_schema_at_version_7_gets_event_recipients_and_keeps_its_events(
    postgres_url: str, schema: str
) -> None:
    """Migration 0008 on a schema as version 7 left it (no events.recipients; transact()
    and transact_recording() without p_recipients): its old functions are dropped and
    replaced, its events read addressed to nobody, and it ends with a fresh schema's
    catalog."""
    store = await open_store(_url(postgres_url, schema))
    try:
        await store.transact("r", appends=[Append("old", author="a")])
    finally:
        await store.close()
    await _as_at(postgres_url, schema, 7, ["ALTER TABLE events DROP COLUMN recipients"])
    store = await open_store(_url(postgres_url, schema))
    try:
        await store.transact("r", writes=[PutOutcome("o", {})], appends=[Append("new", to=["b"])])
        await store.transact("r", appends=[Append("newer", to_roles=["rev"])])
        log = await store.read_log("r")
        assert [(e.type, e.author, e.to, e.to_roles) for e in log] == [
            ("old", "a", (), ()),
            ("new", None, ("b",), ()),
            ("newer", None, (), ("rev",)),
        ]
    finally:
        await store.close()
    await _assert_fresh(postgres_url, schema)


async def test_a_schema_at_version_8_gets_one_transact_and_keeps_its_outcomes(
    postgres_url: str, schema: str
) -> None:
    """Migration 0009 on a schema as version 8 left it (transact() without
    p_outcome_keys, beside transact_recording()): both are dropped, the one transact()
    records outcomes, an outcome recorded before reads as it was, and the schema ends
    with a fresh schema's catalog."""
    store = await open_store(_url(postgres_url, schema))
    try:
        before = await store.transact("r", writes=[PutOutcome("o", {"a": 1}), Put("k", 1)])
    finally:
        await store.close()
    await _as_at(postgres_url, schema, 8, [])
    store = await open_store(_url(postgres_url, schema))
    try:
        old = (await store.read("r", ["o"])).records["o"]
        recorded = {"versions": {"k": before.versions["k"]}, "seqs": []}
        assert old.value == {"outcome": recorded, "a": 1}
        after = await store.transact("r", writes=[PutOutcome("p", {})], appends=[Append("e")])
        new = (await store.read("r", ["p"])).records["p"]
        assert new.value == {"outcome": {"versions": {}, "seqs": after.seqs}}
    finally:
        await store.close()
    await _assert_fresh(postgres_url, schema)


async def test_a_schema_at_version_9_gets_version_blocks_and_reuses_no_version(
    postgres_url: str, schema: str
) -> None:
    """Migration 0010 on a schema as version 9 left it (the version sequence stepping by
    one): versions given before it keep rising through compare-and-set, a key deleted and
    re-created gets a version above every one it had, and the schema ends with a fresh
    schema's catalog."""
    store = await open_store(_url(postgres_url, schema))
    try:
        await store.transact("r", writes=[Put("k", 0)])
    finally:
        await store.close()
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
    try:
        await conn.execute("ALTER SEQUENCE record_version INCREMENT BY 1")
        await conn.execute("DELETE FROM schema_migrations WHERE version > 9")
    finally:
        await conn.close()
    store = await open_store(_url(postgres_url, schema))
    try:
        first = (await store.read("r", ["k"])).version("k")
        assert first is not None
        seen = [first]
        for value in range(1, 4):
            result = await store.transact("r", [VersionIs("k", seen[-1])], [Put("k", value)])
            seen.append(result.versions["k"])
        await store.transact("r", writes=[Delete("k")])
        again = (await store.transact("r", writes=[Put("k", "again")])).versions["k"]
        assert seen == sorted(seen) and len(set(seen)) == len(seen) and again > seen[-1]
        with pytest.raises(VersionConflict):
            await store.transact("r", [VersionIs("k", seen[-1])], [Put("k", "stale")])
    finally:
        await store.close()
    await _assert_fresh(postgres_url, schema)


async def test_compare_and_set_takes_a_new_block_at_the_end_of_one(
    pg: Store, conn: asyncpg.Connection, schema: str
) -> None:
    """Compare-and-set gives a record its version + 1 up to the end of its block of 1024,
    then a version from the sequence, above every block given out so far; a key deleted
    and re-created gets a new block, above every version it had."""
    records = f"{quote_ident(schema)}.records"
    base = (await pg.transact("r", writes=[Put("k", 0)])).versions["k"]
    await pg.transact("r", writes=[Put("other", 0)])  # another block after k's
    last = base - base % 1024 + 1023  # the last version of k's block
    await conn.execute(f"UPDATE {records} SET version = $1 WHERE key = 'k'", last - 1)
    step = (await pg.transact("r", [VersionIs("k", last - 1)], [Put("k", 1)])).versions["k"]
    assert step == last
    new = (await pg.transact("r", [VersionIs("k", last)], [Put("k", 2)])).versions["k"]
    sequence = await conn.fetchval(f"SELECT last_value FROM {quote_ident(schema)}.record_version")
    assert new == sequence > last
    chain = [new]
    for value in range(3, 6):
        result = await pg.transact("r", [VersionIs("k", chain[-1])], [Put("k", value)])
        chain.append(result.versions["k"])
    assert chain == list(range(new, new + 4))
    await pg.transact("r", writes=[Delete("k")])
    again = (await pg.transact("r", writes=[Put("k", "again")])).versions["k"]
    assert again > chain[-1]
    for stale in (*chain, last):
        with pytest.raises(VersionConflict):
            await pg.transact("r", [VersionIs("k", stale)], [Put("k", "stale")])


@pytest.mark.parametrize("version", [SQUASHED[2][0], LATEST + 1])
async def test_a_schema_between_squashed_versions_or_newer_is_refused(
    postgres_url: str, schema: str, version: int
) -> None:
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
    try:
        await conn.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        await conn.execute(MIGRATIONS[0].sql)
        await conn.execute(QUERIES["record_migration"].on(schema), version, "old")
    finally:
        await conn.close()
    with pytest.raises(StoreUnavailable, match="squashed" if version < FIRST else "newer"):
        await open_store(_url(postgres_url, schema))


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
            await conn.prepare(query.on(schema))
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


async def _null_rows(conn: asyncpg.Connection, schema: str) -> list[str]:
    """Keys of rows with a NULL value: placeholders (must never commit) and tombstones."""
    rows = await conn.fetch(
        f"SELECT key FROM {quote_ident(schema)}.records WHERE value IS NULL ORDER BY key"
    )
    return [row[0] for row in rows]


async def test_lock_placeholders_never_commit(
    pg: Store, conn: asyncpg.Connection, schema: str
) -> None:
    """A written key's placeholder never commits, whatever the outcome; a key only
    compared absent leaves a tombstone (its absence's shared lock), which no read, scan
    or compare sees, and which a write of the key turns into a record."""
    await pg.transact("r", [Absent("a")], [Put("b", 1)])  # compared, not written
    with pytest.raises(VersionConflict):
        await pg.transact("r", [Absent("b"), Absent("c")], [Put("c", 1)])
    with pytest.raises(StaleFence):
        await pg.transact("r", [FenceAtMost("nobody", 1)], [Put("d", 1)])
    assert await _null_rows(conn, schema) == ["a"]
    snap = await pg.read("r", ["a", "b", "c", "d"])
    assert set(snap.records) == {"b"}
    assert [r.key for r in (await pg.scan("r")).records] == ["b"]
    for version in (0, 1):  # the tombstone's version is 0: still absent to compares
        with pytest.raises(VersionConflict) as info:
            await pg.transact("r", [VersionIs("a", version)], [Put("a", 2)])
        assert info.value.conflicts == {"a": None}
    with pytest.raises(VersionConflict):
        await pg.transact("r", [Present("a")], [Put("e", 1)])
    await pg.transact("r", [Absent("a")], [Put("a", 3)])
    assert await _null_rows(conn, schema) == []
    assert (await pg.read("r", ["a"])).value("a") == 3


async def test_tombstones_do_not_grow_with_the_work_done(
    pg: Store, conn: asyncpg.Connection, schema: str
) -> None:
    """Tombstones are per key compared absent and never written: the room's
    ``_archived``, not one per lock grant, queued wait or task."""
    room = await Rooms(pg).create("r")
    for i in range(10):
        lock = await room.locks.try_acquire("l", f"a{i}")
        assert await room.locks.release(lock)
        lock = await room.locks.wait_acquire("l", f"b{i}", timeout=5)
        assert await room.locks.release(lock)
    held = await room.locks.try_acquire("l", "holder")
    waiting = asyncio.create_task(room.locks.wait_acquire("l", "waiter", timeout=10))
    await asyncio.sleep(0.2)
    assert await room.locks.release(held)
    assert await room.locks.release(await waiting)
    await room.plan.add([TaskSpec(f"t{i}") for i in range(5)])
    for _ in range(5):
        lease = await room.plan.claim_next("worker")
        assert lease is not None
        await room.plan.complete(lease)
    assert await _null_rows(conn, schema) == ["_archived"]


async def test_a_failing_compare_takes_no_lock(
    pg: Store, postgres_url: str, schema: str, conn: asyncpg.Connection
) -> None:
    """A transact whose compare already fails in the committed state returns at once,
    even while another transaction holds the rows it names."""
    v = (await pg.transact("r", writes=[Put("k", 1)])).versions["k"]
    await pg.transact("r", [VersionIs("k", v)], [Put("k", 2)])
    holder = conn.transaction()
    await holder.start()
    try:
        await conn.execute(
            f"SELECT 1 FROM {quote_ident(schema)}.records WHERE room = 'r' FOR UPDATE"
        )
        for compares in ([VersionIs("k", v)], [Absent("k")]):
            with pytest.raises(VersionConflict):
                await asyncio.wait_for(pg.transact("r", compares, [Put("k", 3)]), 5)
            with pytest.raises(VersionConflict):
                await asyncio.wait_for(
                    pg.transact("r", compares, [Put("other", 1)], [Append("e")]), 5
                )
    finally:
        await holder.rollback()


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
    with pytest.raises(VersionConflict) as info:  # stale: the record's version, unchanged
        await pg.transact("r", [VersionIs("k", v)], [Put("k", 3)])
    assert info.value.conflicts == {"k": r.versions["k"]}
    assert (await pg.read("r", ["k"])).get("k") == record
    with pytest.raises(VersionConflict) as info:  # never written: absent
        await pg.transact("r", [VersionIs("never", v)], [Put("never", 3)])
    assert info.value.conflicts == {"never": None}
    assert not (await pg.read("r", ["never"])).records
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
    with pytest.raises(BadRequest):  # base.py rejects it before the driver sees it
        await pg.transact("r", writes=[Put("k", "lone \ud800 surrogate")])
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


@pytest.mark.parametrize("guarded", [True, False], ids=["compare-and-set", "transact"])
async def test_a_call_past_the_timeout_is_cancelled_on_the_server(
    postgres_url: str, conn: asyncpg.Connection, schema: str, guarded: bool
) -> None:
    """A statement waiting for a lock past the URL's timeout: the call raises
    ``StoreUnavailable`` after about the timeout, the statement is cancelled on the
    server rather than left to commit later, and the store keeps working."""
    store = await open_store(f"{_url(postgres_url, schema)}&timeout=0.3")
    try:
        v = (await store.transact("r", writes=[Put("k", "before")])).versions["k"]
        compares = [VersionIs("k", v)] if guarded else []
        holder = conn.transaction()
        await holder.start()
        await conn.execute(
            f"SELECT 1 FROM {quote_ident(schema)}.records WHERE room = 'r' AND key = 'k' FOR UPDATE"
        )
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable, match="timed out"):
            await store.transact("r", compares, [Put("k", "late")])
        assert 0.25 < time.monotonic() - t0 < 2
        await _wait_until_no_lock_waits(conn)
        await holder.rollback()
        assert (await store.read("r", ["k"])).value("k") == "before"
        after = await store.transact("r", [VersionIs("k", v)], [Put("k", "after")])
        assert after.versions["k"] > v
    finally:
        await store.close()


# ------------------------------------------------------------------ v2: sets and picks


async def _open_many(postgres_url: str, schema: str, n: int) -> list[Store]:
    return [await open_store(_url(postgres_url, schema)) for _ in range(n)]


async def _close_all(stores: list[Store]) -> None:
    for store in stores:
        await store.close()


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([("s", "b", True), ("s", "a", True)], [("s", "a", "add"), ("s", "b", "add")]),
        ([("s", "a", True), ("s", "a", False)], [("s", "a", "remove")]),
        ([("s", "a", False), ("s", "a", True)], [("s", "a", "reset")]),
        ([("s", "a", False), ("s", "a", True), ("s", "a", True)], [("s", "a", "reset")]),
        ([("s", "a", True), ("s", "a", True)], [("s", "a", "add")]),
        ([("t", "a", True), ("s", "z", False)], [("s", "z", "remove"), ("t", "a", "add")]),
    ],
)
def test_set_ops_become_one_net_effect_per_member_in_lock_order(
    ops: list[tuple[str, str, bool]], expected: list[tuple[str, str, str]]
) -> None:
    names, members, kinds = set_args([PreparedSetOp(*op) for op in ops])
    assert list(zip(names, members, kinds, strict=True)) == expected


async def test_sets_match_the_memory_reference(pg: Store) -> None:
    """Random set operations (several per transact, repeats of one member included) and
    picks give the same answers as the reference implementation, step by step."""
    rng = random.Random(20261129)
    ref = MemoryStore()
    members = [f"m{i}" for i in range(7)] + ["\u00e9", "\U0001f600", "Z"]
    for step in range(300):
        name = rng.choice(["a", "b"])
        if rng.random() < 0.6:
            writes: list[Write] = [
                (SetAdd if rng.random() < 0.6 else SetRemove)(name, rng.choice(members))
                for _ in range(rng.randint(1, 5))
            ]
            for store in (ref, pg):
                await store.transact("r", writes=writes)
        else:
            count = rng.randint(1, 4)
            want = await ref.set_pick("r", name, count)
            assert await pg.set_pick("r", name, count) == want, step
        assert await pg.set_size("r", name) == await ref.set_size("r", name), step


async def test_pick_skips_a_locked_member_without_waiting(
    pg: Store, conn: asyncpg.Connection, schema: str
) -> None:
    await pg.transact("r", writes=[SetAdd("s", m) for m in "abcd"])
    holder = conn.transaction()
    await holder.start()
    await conn.execute(
        f"SELECT 1 FROM {quote_ident(schema)}.set_members WHERE member = 'a' FOR UPDATE"
    )
    assert await asyncio.wait_for(pg.set_pick("r", "s", 2), 5) == ["b", "c"]
    await holder.rollback()
    assert await pg.set_pick("r", "s", 2) == ["a", "d"]


async def test_concurrent_pickers_never_share_a_member(postgres_url: str, schema: str) -> None:
    """Many rounds of pickers released together on a fresh set: a member picked (and
    committed) by one while another's walk is under way must not be handed out again,
    which a plain ORDER BY ... LIMIT ... FOR UPDATE SKIP LOCKED would do."""
    stores = await _open_many(postgres_url, schema, 12)
    try:
        for trial in range(25):
            name = f"s{trial}"
            await stores[0].transact("r", writes=[SetAdd(name, f"t{i:02}") for i in range(40)])
            barrier = asyncio.Barrier(len(stores))

            async def pick(store: Store, name: str = name, barrier: Any = barrier) -> list[str]:
                await barrier.wait()
                return await store.set_pick("r", name, 3)

            picks = [m for ms in await asyncio.gather(*(pick(s) for s in stores)) for m in ms]
            assert sorted(picks) == [f"t{i:02}" for i in range(36)], trial
    finally:
        await _close_all(stores)


async def test_concurrent_claimers_claim_every_member_once_without_deadlock(
    postgres_url: str, schema: str
) -> None:
    """claim_next's pattern: pick candidates, then claim one in a transact that removes
    it from the ready set and adds it to another, with an event; meanwhile a producer
    adds members in shuffled batches. Every member is claimed exactly once and nothing
    fails but the expected conflicts (a deadlock would surface as StoreUnavailable)."""
    stores = await _open_many(postgres_url, schema, 9)
    rng = random.Random(7)
    first = [f"t{i:03}" for i in range(150)]
    later = [f"u{i:03}" for i in range(150)]
    await stores[0].transact("r", writes=[SetAdd("ready", m) for m in first])
    claims: dict[str, str] = {}
    produced = asyncio.Event()

    async def produce(store: Store) -> None:
        batch = later[:]
        rng.shuffle(batch)
        for i in range(0, len(batch), 10):
            await store.transact("r", writes=[SetAdd("ready", m) for m in batch[i : i + 10]])
        produced.set()

    async def claim(store: Store, who: str) -> None:
        while True:
            picked = await store.set_pick("r", "ready", 2)
            if not picked:
                if produced.is_set() and await store.set_size("r", "ready") == 0:
                    return
                await asyncio.sleep(0.005)
                continue
            for m in picked:
                with contextlib.suppress(VersionConflict):
                    await store.transact(
                        "r",
                        [Absent(f"claim/{m}")],
                        [Put(f"claim/{m}", who), SetRemove("ready", m), SetAdd("claimed", m)],
                        [Append("claimed", {"task": m, "by": who})],
                    )
                    assert m not in claims
                    claims[m] = who

    try:
        await asyncio.gather(
            produce(stores[0]), *(claim(s, f"w{i}") for i, s in enumerate(stores[1:]))
        )
        assert sorted(claims) == sorted(first + later)
        assert await stores[0].set_size("r", "claimed") == 300
        assert await stores[0].set_size("r", "ready") == 0
        assert await stores[0].last_seq("r") == 300
    finally:
        await _close_all(stores)


async def test_set_ops_in_any_order_never_deadlock(postgres_url: str, schema: str) -> None:
    """Transacts adding and removing the same members in opposite orders, with keys and
    appends: each locks members in (set, member) order after its keys and the room's
    row, so they queue, and never deadlock (PostgreSQL would abort one: StoreUnavailable)."""
    stores = await _open_many(postgres_url, schema, 8)
    members = list("abcdef")

    async def churn(store: Store, seed: int) -> None:
        rng = random.Random(seed)
        for i in range(30):
            order = members[:]
            rng.shuffle(order)
            writes: list[Write] = [
                (SetAdd if rng.random() < 0.5 else SetRemove)(rng.choice("xy"), m) for m in order
            ]
            writes.append(Put(f"own/{seed}", i))
            appends = [Append("churn")] if rng.random() < 0.5 else []
            await store.transact("r", writes=writes, appends=appends)

    try:
        await asyncio.gather(*(churn(s, i) for i, s in enumerate(stores)))
    finally:
        await _close_all(stores)


async def _pick_buffers(conn: asyncpg.Connection, room: str) -> int:
    """Shared buffers one set_pick of one member touches (statements inside included)."""
    plan = json.loads(
        await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM set_pick($1, 's', 1)", room
        )
    )[0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


async def test_pick_cost_does_not_grow_with_the_set(
    pg: Store, postgres_url: str, schema: str
) -> None:
    """A 10,000-member set picks as cheaply as a 10-member one (within 2x): in buffers
    touched (deterministic) and in time (the best of interleaved batches)."""
    big = [f"m{i:05}" for i in range(10_000)]
    for i in range(0, len(big), 2500):
        await pg.transact("big", writes=[SetAdd("s", m) for m in big[i : i + 2500]])
    await pg.transact("small", writes=[SetAdd("s", m) for m in big[:10]])
    conn = await asyncpg.connect(postgres_url, server_settings={"search_path": schema})
    try:
        picks = conn.transaction()  # EXPLAIN ANALYZE picks for real: rolled back below
        await picks.start()
        buffers = {}
        for room in ("small", "big", "small", "big"):  # the second round: plans cached
            buffers[room] = await _pick_buffers(conn, room)
        await picks.rollback()
    finally:
        await conn.close()
    assert buffers["big"] <= 2 * buffers["small"], buffers

    best = {"small": float("inf"), "big": float("inf")}
    for _ in range(7):
        for room in ("small", "big"):
            t0 = time.perf_counter()
            for _ in range(20):
                await pg.set_pick(room, "s", 1)
            best[room] = min(best[room], time.perf_counter() - t0)
    assert best["big"] <= 2 * best["small"], best


# ------------------------------------------------------------------------ v2: watch


async def _channel(conn: asyncpg.Connection, schema: str) -> str:
    """The store's channel, asked as its sessions ask (the schema is their search_path;
    notify_channel() names the caller's schema, see functions/room_lock.sql)."""
    async with conn.transaction():
        await conn.execute(f"SET LOCAL search_path = {quote_ident(schema)}")
        channel: str = await conn.fetchval("SELECT notify_channel()")
    return channel


async def _listener_pids(conn: asyncpg.Connection, channel: str) -> list[int]:
    rows = await conn.fetch(
        """SELECT pid FROM pg_stat_activity
            WHERE datname = current_database() AND query = $1""",
        f"LISTEN {quote_ident(channel)}",
    )
    return [row[0] for row in rows]


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.02)


async def test_transact_notifies_the_newest_seq_at_commit_only(
    pg: Store, conn: asyncpg.Connection, schema: str
) -> None:
    got: asyncio.Queue[str] = asyncio.Queue()
    channel = await _channel(conn, schema)
    assert channel == f"agentrooms.{schema}"
    await conn.add_listener(channel, lambda *args: got.put_nowait(args[3]))
    await pg.transact("a:b", appends=[Append("x"), Append("y")])
    assert await asyncio.wait_for(got.get(), 5) == "a:b:2"
    await pg.transact("a:b", writes=[Put("k", 1), SetAdd("s", "m")])  # no append: silent
    with pytest.raises(VersionConflict):  # rolled back: silent
        await pg.transact("a:b", [Absent("k")], appends=[Append("z")])
    await pg.transact("other", writes=[Put("k", 1)], appends=[Append("z")])
    assert await asyncio.wait_for(got.get(), 5) == "other:1"
    assert got.empty()


async def test_watchers_share_one_listening_connection(
    postgres_url: str, schema: str, conn: asyncpg.Connection
) -> None:
    waiter, writer = await _open_many(postgres_url, schema, 2)
    channel = await _channel(conn, schema)
    try:
        assert await _listener_pids(conn, channel) == []  # opened lazily
        rooms = [f"room:{i}" for i in range(20)]
        watches = [asyncio.create_task(waiter.watch(r, 0, 30)) for r in rooms]
        await _until(lambda: _one(conn, channel), "one listener")
        for room in rooms:
            await writer.transact(room, appends=[Append("wake")])
        assert await asyncio.wait_for(asyncio.gather(*watches), 5) == [1] * len(rooms)
        assert len(await _listener_pids(conn, channel)) == 1
    finally:
        await _close_all([waiter, writer])
    await _until(lambda: _none(conn, channel), "the listener closed")


async def _one(conn: asyncpg.Connection, channel: str) -> bool:
    return len(await _listener_pids(conn, channel)) == 1


async def _none(conn: asyncpg.Connection, channel: str) -> bool:
    return not await _listener_pids(conn, channel)


class SeqReads:
    """Counts a PostgreSQL store's reads of a room's last seq (step 3 of a watch)."""

    def __init__(self, store: Store) -> None:
        assert isinstance(store, PostgresStore)
        self.count = 0
        last_seq = store._last_seq

        async def counted(room: str) -> int:
            self.count += 1
            return await last_seq(room)

        store._last_seq = counted  # type: ignore[method-assign]


@pytest.mark.parametrize("shared_channel", [False, True])
async def test_a_notified_seq_is_the_watch_answer_on_a_channel_of_its_own(
    postgres_url: str, shared_channel: bool
) -> None:
    """A notification carries the room's newest sequence number, committed: on a channel
    that is this schema's alone it answers the watch without a re-read. A schema name of
    52 bytes or more is cut to fit the channel, which any schema of the same first 52
    bytes shares; there the number may be another store's, and only wakes the watch to
    re-read it."""
    schema = f"t_{uuid.uuid4().hex[:12]}" + ("_" + "x" * 40 if shared_channel else "")
    waiter, writer = await _open_many(postgres_url, schema, 2)
    reads = SeqReads(waiter)
    try:
        watch = asyncio.create_task(waiter.watch("r", 0, 30))

        async def registered() -> bool:  # listening, and has read the seq once
            return reads.count == 1

        await _until(registered, "the watch is registered")
        await writer.transact("r", appends=[Append("x"), Append("y")])
        assert await asyncio.wait_for(watch, 5) == 2
        assert reads.count == (2 if shared_channel else 1)
    finally:
        await _close_all([waiter, writer])


async def test_a_watch_after_a_notification_waits_without_a_query(
    postgres_url: str, schema: str, conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the listening connection has seen of a room stands for step 3's read while it
    stays open: a follower's next watch waits on the notification alone. A wait that
    outlasts the re-check interval without one reads again (the connection may have
    died unnoticed), and so does every watch after the connection is replaced."""
    from agentrooms.store.postgres import backend

    waiter, writer = await _open_many(postgres_url, schema, 2)
    reads = SeqReads(waiter)
    channel = await _channel(conn, schema)
    try:
        first = asyncio.create_task(waiter.watch("r", 0, 30))
        await _until(lambda: _true(reads.count == 1), "the first watch has read")
        await writer.transact("r", appends=[Append("a")])
        assert await asyncio.wait_for(first, 5) == 1
        second = asyncio.create_task(waiter.watch("r", 1, 30))  # as a follower does
        await asyncio.sleep(0.1)
        await writer.transact("r", appends=[Append("b")])
        assert await asyncio.wait_for(second, 5) == 2
        assert reads.count == 1
        assert await waiter.watch("r", 1, 5) == 2 and reads.count == 1  # known past after

        monkeypatch.setattr(backend, "_RECHECK", 0.2)
        assert await waiter.watch("r", 2, 0.5) == 2
        assert reads.count > 1  # read again after each silent 0.2 s
        monkeypatch.undo()

        [old] = await _listener_pids(conn, channel)
        await conn.execute("SELECT pg_terminate_backend($1)", old)
        await _until(lambda: _none(conn, channel), "the listener is gone")
        before = reads.count
        third = asyncio.create_task(waiter.watch("r", 2, 30))
        await _until(lambda: _true(reads.count == before + 1), "a read on the new connection")
        await writer.transact("r", appends=[Append("c")])
        assert await asyncio.wait_for(third, 5) == 3
    finally:
        await _close_all([waiter, writer])


async def _true(value: bool) -> bool:
    return value


async def test_watch_reconnects_when_the_listener_is_killed(
    postgres_url: str, schema: str, conn: asyncpg.Connection
) -> None:
    """The listening connection dies while a watch waits: the watch reconnects, and an
    append after that wakes it by notification (well before the fallback re-read)."""
    waiter, writer = await _open_many(postgres_url, schema, 2)
    channel = await _channel(conn, schema)
    try:
        watch = asyncio.create_task(waiter.watch("r", 0, 60))
        await _until(lambda: _one(conn, channel), "a listener")
        [old] = await _listener_pids(conn, channel)
        await conn.execute("SELECT pg_terminate_backend($1)", old)

        async def replaced() -> bool:
            pids = await _listener_pids(conn, channel)
            return len(pids) == 1 and pids != [old]

        await _until(replaced, "a new listener", timeout=3)  # woken by the drop, at once
        assert not watch.done()
        t0 = time.monotonic()
        await writer.transact("r", appends=[Append("wake")])
        assert await asyncio.wait_for(watch, 8) == 1
        assert time.monotonic() - t0 < 5
    finally:
        await _close_all([waiter, writer])


async def test_watch_hears_only_its_own_schema(postgres_url: str, schema: str) -> None:
    other = f"{schema}_other"
    waiter = await open_store(_url(postgres_url, schema))
    stranger = await open_store(_url(postgres_url, other))
    try:
        t0 = time.monotonic()
        watch = asyncio.create_task(waiter.watch("r", 0, 0.6))
        await asyncio.sleep(0.2)
        await stranger.transact("r", appends=[Append("elsewhere")])  # same room name
        assert await watch == 0
        assert time.monotonic() - t0 >= 0.55
        watch = asyncio.create_task(waiter.watch("r", 0, 30))
        await asyncio.sleep(0.2)
        await waiter.transact("r", appends=[Append("here")])
        assert await asyncio.wait_for(watch, 5) == 1
    finally:
        await _close_all([waiter, stranger])


async def test_close_fails_a_waiting_watch(postgres_url: str, schema: str) -> None:
    store = await open_store(_url(postgres_url, schema))
    watch = asyncio.create_task(store.watch("r", 0, 60))
    await asyncio.sleep(0.3)
    await store.close()
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(watch, 5)
    with pytest.raises(StoreUnavailable):
        await store.watch("r", 0, 1)


# ------------------------------------------------------------------ v2: delete_room


async def test_delete_room_waits_for_a_transact_in_flight(
    pg: Store, postgres_url: str, schema: str, conn: asyncpg.Connection
) -> None:
    """A transact has locked x, created y (not yet visible to anyone) and waits for z;
    delete_room starts meanwhile. Without the room lock the delete would wait for x,
    then delete x but not y (invisible to its snapshot): half of the transact. With it,
    the delete runs after the whole transact and removes all of it."""
    await pg.transact("r", writes=[Put("x", 0), Put("z", 0), SetAdd("s", "old")])
    other = await open_store(_url(postgres_url, schema))
    holder = conn.transaction()
    await holder.start()
    held = True
    try:
        await conn.execute(
            f"SELECT 1 FROM {quote_ident(schema)}.records WHERE room = 'r' AND key = 'z' FOR UPDATE"
        )
        writes: list[Write] = [Put("x", 1), Put("y", 1), Put("z", 1), SetAdd("s", "new")]
        transact = asyncio.create_task(pg.transact("r", writes=writes, appends=[Append("e")]))
        await _until(lambda: _lock_waits(conn, 1), "the transact waits for z")
        delete = asyncio.create_task(other.delete_room("r"))
        await _until(lambda: _lock_waits(conn, 2), "the delete waits")
        await holder.rollback()
        held = False
        await asyncio.wait_for(asyncio.gather(transact, delete), 10)
        assert (await pg.read("r", ["x", "y", "z"])).records == {}
        assert await pg.set_size("r", "s") == 0
        assert await pg.last_seq("r") == 1
        with pytest.raises(CursorCompacted):
            await pg.read_log("r", 0)
    finally:
        if held:  # a failure above
            await holder.rollback()
        await other.close()


async def _lock_waits(conn: asyncpg.Connection, n: int) -> bool:
    count = await conn.fetchval(
        """SELECT count(*) FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock'"""
    )
    return bool(count == n)


async def test_delete_room_amid_writers_is_atomic_and_never_deadlocks(
    postgres_url: str, schema: str, conn: asyncpg.Connection
) -> None:
    """Writers put a key, add it to a set and append an event, in one transact; deletes
    of the room interleave. In every snapshot the room holds as many records as set
    members as readable events (seq - low + 1): no delete ever removes part of a
    transact, and nothing fails (a deadlock would surface as StoreUnavailable)."""
    stores = await _open_many(postgres_url, schema, 6)
    stop = asyncio.Event()
    s = quote_ident(schema)
    census = f"""
        SELECT (SELECT count(*) FROM {s}.records WHERE room = 'r'),
               (SELECT count(*) FROM {s}.set_members WHERE room = 'r' AND name = 's'),
               (SELECT count(*) FROM {s}.events WHERE room = 'r'),
               (SELECT seq - low + 1 FROM {s}.rooms WHERE room = 'r')"""
    censuses = 0

    async def write(store: Store, w: int) -> None:
        for i in range(40):
            key = f"k{w}-{i:02}"
            await store.transact("r", writes=[Put(key, i), SetAdd("s", key)], appends=[Append("w")])

    async def delete(store: Store) -> None:
        while not stop.is_set():
            await store.delete_room("r")
            await asyncio.sleep(0.01)

    async def check() -> None:
        nonlocal censuses
        while not stop.is_set():
            row = await conn.fetchrow(census)
            assert row is not None
            if row[3] is not None:
                assert row[0] == row[1] == row[2] == row[3], tuple(row)
                censuses += 1
            await asyncio.sleep(0.005)

    try:
        background = [asyncio.create_task(delete(stores[0])), asyncio.create_task(check())]
        try:
            await asyncio.gather(*(write(st, w) for w, st in enumerate(stores[1:])))
        finally:
            stop.set()
            await asyncio.gather(*background)
        assert censuses > 10
        row = await conn.fetchrow(census)
        assert row is not None and row[0] == row[1] == row[2] == row[3]
        assert await stores[0].last_seq("r") == 5 * 40
    finally:
        await _close_all(stores)


async def test_a_read_looks_up_each_key_whatever_the_plan_cache_knows(
    pg: Store, postgres_url: str, schema: str
) -> None:
    """The read's generic plan (made once per connection, here while the table is
    nearly empty, as a new store's first connection makes it) looks each key up by the
    primary key, never scanning the room's whole key range and filtering."""
    await pg.transact("r", writes=[Put("seed", 0)])
    conn = await asyncpg.connect(
        postgres_url,
        server_settings={"search_path": schema, "plan_cache_mode": "force_generic_plan"},
    )
    try:
        await conn.execute(f"PREPARE rd (text, text[]) AS {QUERIES['read'].on(schema)}")
        await conn.execute("EXECUTE rd ('r', ARRAY['seed'])")  # the plan is made here
        await pg.transact("r", writes=[Put(f"k{i:04}", i) for i in range(2000)])
        plan = "\n".join(
            row[0]
            for row in await conn.fetch(
                "EXPLAIN (ANALYZE, COSTS OFF) EXECUTE rd ('r', ARRAY['k0007', 'k1500', 'no'])"
            )
        )
    finally:
        await conn.close()
    assert "Index Cond: ((room = $1) AND (key = k.key))" in plan, plan
    assert "Rows Removed by Filter" not in plan, plan
    assert [r.value for r in (await pg.read("r", ["k0007", "k1500", "no"])).records.values()] == [
        7,
        1500,
    ]
