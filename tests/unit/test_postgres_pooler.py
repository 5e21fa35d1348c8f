"""The PostgreSQL store behind pgbouncer (tests/pgbouncer_fixture.py), beyond the
conformance suites that run through it in both pooling modes (tests/conftest.py):

* schemas stay apart even when one server connection serves both stores and its
  session's search_path names the other's schema;
* the open check refuses a session that lost the store's settings (a pooler that drops
  startup parameters) or runs at another isolation level (a pooler's connect_query),
  and transact() itself refuses a session at another isolation level;
* watch through transaction pooling wakes by polling, within about ``poll_interval``,
  or by NOTIFY over ``listen_url``;
* a statement past the URL's timeout is cancelled on the server through the pooler;
* the URL options are checked before any IO, and ``listen_url``'s password is redacted.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from urllib.parse import quote

import asyncpg
import pytest

from agentrooms.errors import BadRequest, StoreUnavailable
from agentrooms.store import Append, Put, VersionIs, open_store
from agentrooms.store.postgres.config import parse_url, redact
from agentrooms.store.postgres.sql import quote_ident
from tests.conftest import pooled_url
from tests.pgbouncer_fixture import PgBouncer

Bouncers = Callable[..., PgBouncer]


def _schema() -> str:
    return f"p_{uuid.uuid4().hex[:12]}"


async def test_schemas_stay_apart_on_one_shared_server_connection(
    postgres_url: str, pgbouncers: Bouncers
) -> None:
    """One server connection (pool size 1) whose search_path is store b's schema serves
    stores a and b in turn: each reads its own records only, and reads no record of the
    other's schema even where its own has none."""
    a, b = _schema(), _schema()
    bouncer = pgbouncers(
        "transaction", default_pool_size="1", connect_query=f"SET search_path TO {b}"
    )
    store_a = await open_store(pooled_url(postgres_url, bouncer, "transaction", a))
    store_b = await open_store(pooled_url(postgres_url, bouncer, "transaction", b))
    try:
        await store_b.transact("room", writes=[Put("only-b", "b"), Put("k", "b")])
        await store_a.transact("room", writes=[Put("k", "a")], appends=[Append("e", "a")])
        assert (await store_a.read("room", ["k", "only-b"])).records.keys() == {"k"}
        assert (await store_a.read("room", ["k"])).value("k") == "a"
        assert (await store_b.read("room", ["k"])).value("k") == "b"
        assert [r.key for r in (await store_a.scan("room")).records] == ["k"]
        assert await store_b.last_seq("room") == 0
        assert [e.data for e in await store_a.read_log("room", 0, 10)] == ["a"]
        await store_b.delete_room("room")
        assert (await store_a.read("room", ["k"])).value("k") == "a"
    finally:
        await store_a.close()
        await store_b.close()


async def test_a_direct_url_through_a_pooler_that_drops_settings_is_refused(
    postgres_url: str, pgbouncers: Bouncers
) -> None:
    """Told to ignore the startup parameters, pgbouncer accepts a direct URL and drops
    its search_path: the open check names the lost schema and the pooler option."""
    bouncer = pgbouncers(
        "session",
        ignore_startup_parameters="search_path,default_transaction_isolation,plan_cache_mode,jit",
    )
    dbname = postgres_url.rsplit("/", 1)[1]
    with pytest.raises(BadRequest, match=r"current_schema\(\).*pooler=transaction"):
        await open_store(bouncer.url(dbname, f"schema={_schema()}"))


@pytest.mark.parametrize("pooler", ["transaction", "session"])
async def test_a_pooled_session_at_another_isolation_level_is_refused(
    postgres_url: str, pgbouncers: Bouncers, pooler: str
) -> None:
    bouncer = pgbouncers(
        pooler, connect_query="SET default_transaction_isolation TO 'repeatable read'"
    )
    with pytest.raises(BadRequest, match="transaction_isolation is 'repeatable read'"):
        await open_store(pooled_url(postgres_url, bouncer, pooler, _schema()))


async def test_transact_refuses_a_session_at_another_isolation_level(postgres_url: str) -> None:
    """transact() checks the level of every call itself (SQLSTATE AR001)."""
    schema = _schema()
    store = await open_store(f"{postgres_url}?schema={schema}")
    await store.close()
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute("SET default_transaction_isolation TO 'repeatable read'")
        none, zero = "'{}'::text[]", "'{0,0}'::integer[]"
        call = (
            f"SELECT * FROM {quote_ident(schema)}.transact('r', {zero}, {none}, {none},"
            f" '{{}}'::numeric[], '{{0,1}}'::integer[], ARRAY['k'], ARRAY['1'],"
            f" ARRAY[NULL::bigint], {zero}, {none}, {zero}, {none}, {none}, {none}, {zero},"
            f" {none}, {none}, {none}, {none})"
        )
        with pytest.raises(asyncpg.PostgresError, match="READ COMMITTED") as info:
            await conn.fetch(call)
        assert info.value.sqlstate == "AR001"
    finally:
        await conn.close()


async def _wake_delay(watcher_url: str, writer_url: str) -> float:
    """Seconds from an append's return to the wake-up of a watch already waiting on it
    (with a 20 s timeout)."""
    watcher = await open_store(watcher_url)
    writer = await open_store(writer_url)
    try:
        room = f"w-{uuid.uuid4().hex[:8]}"
        watch = asyncio.create_task(watcher.watch(room, 0, 20.0))
        await asyncio.sleep(0.5)  # the watch is waiting
        assert not watch.done()
        await writer.transact(room, appends=[Append("e")])
        appended = time.monotonic()
        assert await watch == 1
        return time.monotonic() - appended
    finally:
        await watcher.close()
        await writer.close()


@pytest.mark.parametrize("pooler", ["transaction", "session"])
async def test_a_call_past_the_timeout_is_cancelled_through_the_pooler(
    postgres_url: str, pgbouncers: Bouncers, pooler: str
) -> None:
    """A compare-and-set waiting for a row lock past the URL's timeout: the call raises
    ``StoreUnavailable``, the pooler passes the cancel request on to the server, and the
    write never happens."""
    schema = _schema()
    url = pooled_url(postgres_url, pgbouncers(pooler), pooler, schema) + "&timeout=0.3"
    store = await open_store(url)
    conn = await asyncpg.connect(postgres_url)
    try:
        v = (await store.transact("r", writes=[Put("k", "before")])).versions["k"]
        async with conn.transaction():
            await conn.execute(
                f"SELECT 1 FROM {quote_ident(schema)}.records WHERE room = 'r' AND key = 'k' "
                "FOR UPDATE"
            )
            with pytest.raises(StoreUnavailable, match="timed out"):
                await store.transact("r", [VersionIs("k", v)], [Put("k", "late")])
            # Lock waits are seen from outside the holder's transaction (its statistics
            # snapshot would not change).
            watcher = await asyncpg.connect(postgres_url)
            try:
                for _ in range(100):
                    waits = await watcher.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    )
                    if waits == 0:
                        break
                    await asyncio.sleep(0.05)
                assert waits == 0
            finally:
                await watcher.close()
        assert (await store.read("r", ["k"])).value("k") == "before"
        assert (await store.transact("r", [VersionIs("k", v)], [Put("k", "after")])).versions
    finally:
        await conn.close()
        await store.close()


async def test_watch_through_transaction_pooling_polls(
    postgres_url: str, pgbouncers: Bouncers
) -> None:
    schema = _schema()
    url = pooled_url(postgres_url, pgbouncers("transaction"), "transaction", schema)
    watcher = f"{url}&poll_interval=0.2"
    store = await open_store(watcher)
    try:
        assert (await store.info()).details["watch"] == "polls every 0.2 s"
    finally:
        await store.close()
    assert await _wake_delay(watcher, url) < 0.2 + 1.0  # the interval, and a loaded machine


async def test_watch_through_transaction_pooling_with_listen_url_is_notified(
    postgres_url: str, pgbouncers: Bouncers
) -> None:
    """With listen_url, the watch LISTENs directly: woken by NOTIFY, not by a poll
    (the interval is far longer than the wake-up)."""
    schema = _schema()
    url = pooled_url(postgres_url, pgbouncers("transaction"), "transaction", schema)
    watcher = f"{url}&poll_interval=30&listen_url={quote(postgres_url, safe='')}"
    store = await open_store(watcher)
    try:
        assert (await store.info()).details["watch"] == "LISTEN/NOTIFY over listen_url"
    finally:
        await store.close()
    assert await _wake_delay(watcher, url) < 2.0


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("pooler=statement", "pooler 'statement' must be one of transaction, session"),
        ("listen_url=redis%3A%2F%2Fh", "listen_url must be a postgresql:// URL"),
        ("listen_url=postgresql%3A%2F%2Fh%2Fdb%3Fschema%3Dx", "unknown postgresql listen_url"),
        ("poll_interval=0", "poll_interval must be a positive number"),
    ],
)
def test_bad_pooler_options_are_refused_before_any_io(query: str, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_url(f"postgresql://u@h/db?{query}")


def test_pooler_options_parse_and_listen_url_is_redacted() -> None:
    listen = quote("postgresql://u:secret@direct:5432/db", safe="")
    config = parse_url(f"postgresql://u@h:6432/db?pooler=transaction&listen_url={listen}")
    assert config.pooler == "transaction" and config.polls is False
    assert config.listen_dsn == "postgresql://u:secret@direct:5432/db"
    assert "pooler" not in config.dsn and "listen_url" not in config.dsn
    assert parse_url("postgresql://u@h/db?pooler=transaction").polls is True
    assert parse_url("postgresql://u@h/db?pooler=session").polls is False
    assert "secret" not in redact(f"postgresql://u@h/db?listen_url={listen}")
