"""Expired records leave storage, not only every read: the writes of a room delete a few
expired records of it (at most a purge limit per write, oldest first), on the in-memory
and PostgreSQL backends as on SQLite (``test_sqlite_backend.py``); Redis expires keys
itself (``PEXPIREAT``).

Without this, every record written with a TTL and never written again (a command
outcome kept for its retention window, a dead waiter's lock queue entry) would stay in
storage for good.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg

from agentrooms.store import Append, Delete, Put, open_store
from agentrooms.store.memory import MemoryStore
from agentrooms.store.postgres.backend import PostgresStore
from agentrooms.store.types import PURGE_LIMIT


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _rows(store: MemoryStore, room: str) -> int:
    return len(store._rooms[room].rows)


async def test_memory_writes_purge_a_few_expired_rows_of_their_room() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    await store.transact("r", writes=[Put(f"p/{i:03}", i, ttl=1) for i in range(100)])
    await store.transact("other", writes=[Put("p", 0, ttl=1)])
    await store.transact("r", writes=[Put("keep", 1, ttl=5)])
    clock.now += 2
    await store.transact("r", appends=[Append("no records written")])
    assert _rows(store, "r") == 101
    await store.transact("r", writes=[Put("x", 1)])
    assert _rows(store, "r") == 102 - PURGE_LIMIT
    for _ in range(4):
        await store.transact("r", writes=[Delete("x")])
    assert _rows(store, "r") == 1  # "keep", not expired
    assert _rows(store, "other") == 1  # another room's writes purge it
    assert (await store.read("r", ["keep"])).value("keep") == 1
    assert (await store.scan("r", "")).records[0].key == "keep"


async def test_memory_purge_spares_a_record_rewritten_after_its_first_expiry_was_due() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    await store.transact("r", writes=[Put("lock", "first", ttl=1)])
    await store.transact("r", writes=[Put("lock", "again", ttl=10)])  # a later expiry
    clock.now += 2  # the first expiry is due; the record's own is not
    await store.transact("r", writes=[Put("x", 1)])
    assert (await store.read("r", ["lock"])).value("lock") == "again"
    clock.now += 10
    await store.transact("r", writes=[Put("x", 2)])
    assert (await store.read("r", ["lock"])).get("lock") is None
    assert _rows(store, "r") == 1


# ------------------------------------------------------------------------ PostgreSQL

SCHEMA = f"t_purge_{uuid.uuid4().hex[:10]}"


async def _pg_rows(postgres_url: str, room: str) -> int:
    conn = await asyncpg.connect(postgres_url)
    try:
        count: int = await conn.fetchval(
            f'SELECT count(*) FROM "{SCHEMA}".records WHERE room = $1', room
        )
        return count
    finally:
        await conn.close()


async def test_postgres_writes_purge_a_few_expired_rows_of_their_room(postgres_url: str) -> None:
    store = await open_store(f"{postgres_url}?schema={SCHEMA}")
    assert isinstance(store, PostgresStore)
    room = f"r-{uuid.uuid4().hex[:8]}"
    try:
        await store.transact(room, writes=[Put(f"p/{i:03}", i, ttl=0.2) for i in range(40)])
        await store.transact("other-" + room, writes=[Put("p", 0, ttl=0.2)])
        await store.transact(room, writes=[Put("keep", 1, ttl=60)])
        await asyncio.sleep(0.3)
        await store.transact(room, appends=[Append("no records written")])
        assert await _pg_rows(postgres_url, room) == 41
        await store.transact(room, writes=[Put("x", 1)])
        assert await _pg_rows(postgres_url, room) == 42 - PURGE_LIMIT
        await store.transact(room, writes=[Delete("x")])
        assert await _pg_rows(postgres_url, room) == 1  # "keep", not expired
        assert await _pg_rows(postgres_url, "other-" + room) == 1
        assert (await store.read(room, ["keep"])).value("keep") == 1
    finally:
        await store.close()


async def test_postgres_purge_skips_a_row_another_transaction_holds(postgres_url: str) -> None:
    """The purge never waits: an expired row locked by another transaction is left for a
    later write, and the write that purges returns without waiting for that lock."""
    store = await open_store(f"{postgres_url}?schema={SCHEMA}")
    room = f"r-{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(postgres_url)
    try:
        await store.transact(room, writes=[Put("held", 1, ttl=0.2), Put("free", 2, ttl=0.2)])
        await asyncio.sleep(0.3)
        async with conn.transaction():
            await conn.execute(
                f"SELECT 1 FROM \"{SCHEMA}\".records WHERE room = $1 AND key = 'held' FOR UPDATE",
                room,
            )
            t0 = time.monotonic()
            await asyncio.wait_for(store.transact(room, writes=[Put("x", 1)]), 10)
            assert time.monotonic() - t0 < 2
            assert await _pg_rows(postgres_url, room) == 2  # "held" and "x"
        await store.transact(room, writes=[Put("x", 2)])
        assert await _pg_rows(postgres_url, room) == 1
    finally:
        await conn.close()
        await store.close()
