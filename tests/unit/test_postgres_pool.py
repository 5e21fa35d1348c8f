"""The PostgreSQL backend's connection pool (store/postgres/pool.py), against the run's
test database: one ``fetch`` is bounded by the pool's timeout, the wait for a free
connection counted against it, each call by its own deadline though one timer serves
them all; a timed-out statement is cancelled on the server and retires its connection;
a caller cancelled by someone else is cancelled, not timed out; the pool reuses its idle
connections and opens no more than its size."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from agentrooms.store.postgres.pool import ConnectionPool


def _pool(postgres_url: str, size: int, timeout: float) -> ConnectionPool:
    return ConnectionPool(functools.partial(asyncpg.connect, postgres_url), size, timeout)


async def test_the_wait_for_a_connection_counts_against_the_timeout(postgres_url: str) -> None:
    pool = _pool(postgres_url, 1, 0.5)
    try:
        async with pool.acquire():  # the only connection, held past the timeout
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match=r"no connection came free within 0\.5 s"):
                await pool.fetch("SELECT 1")
            assert 0.45 < time.monotonic() - t0 < 2

        async def hold(seconds: float) -> None:
            async with pool.acquire():
                await asyncio.sleep(seconds)

        holder = asyncio.create_task(hold(0.3))
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):  # 0.25 s of waiting leaves 0.25 s for 0.4 s
            await pool.fetch("SELECT pg_sleep(0.4)")
        assert time.monotonic() - t0 < 1.0  # about the timeout: the wait was counted
        await holder
        assert [tuple(row) for row in await pool.fetch("SELECT $1::int", 7)] == [(7,)]
    finally:
        await pool.close()


async def test_idle_connections_are_reused_and_a_timed_out_one_retired(
    postgres_url: str,
) -> None:
    pool = _pool(postgres_url, 2, 0.3)
    try:
        pids = {(await pool.fetch("SELECT pg_backend_pid()"))[0][0] for _ in range(5)}
        assert len(pids) == 1  # one caller at a time: the same connection each time
        both = await asyncio.gather(
            *(pool.fetch("SELECT pg_backend_pid(), pg_sleep(0.05)") for _ in range(4))
        )
        assert len({rows[0][0] for rows in both}) <= 2
        with pytest.raises(TimeoutError):
            await pool.fetch("SELECT pg_sleep(5)")
        await asyncio.sleep(0.2)  # its connection closes in the background
        after = {(await pool.fetch("SELECT pg_backend_pid()"))[0][0] for _ in range(3)}
        assert len(after) == 1
    finally:
        await pool.close()


@pytest.fixture
async def table(postgres_url: str) -> AsyncIterator[str]:
    """A table of one row, ``(1, 'before')``, for this test alone."""
    name = f"pool_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, value text)")
        await conn.execute(f"INSERT INTO {name} VALUES (1, 'before')")
        yield name
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {name}")
        await conn.close()


async def test_a_statement_past_the_timeout_is_cancelled_on_the_server(
    postgres_url: str, table: str
) -> None:
    """An UPDATE waiting for a row lock past the timeout: ``TimeoutError``, and once the
    lock is released the UPDATE has not happened (cancelled, not left to commit)."""
    pool = _pool(postgres_url, 2, 0.3)
    holder = await asyncpg.connect(postgres_url)
    watcher = await asyncpg.connect(postgres_url)  # outside the holder's stats snapshot
    try:
        async with holder.transaction():
            await holder.execute(f"SELECT 1 FROM {table} WHERE id = 1 FOR UPDATE")
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match=r"no reply within 0\.3 s"):
                await pool.fetch(f"UPDATE {table} SET value = 'late' WHERE id = 1")
            assert 0.25 < time.monotonic() - t0 < 2
            for _ in range(100):  # the cancel request reaches the server
                waiting = await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE query LIKE $1 AND state = 'active'",
                    f"UPDATE {table}%",
                )
                if waiting == 0:
                    break
                await asyncio.sleep(0.05)
            assert waiting == 0
        assert await holder.fetchval(f"SELECT value FROM {table} WHERE id = 1") == "before"
        assert [tuple(row) for row in await pool.fetch("SELECT 1")] == [(1,)]
    finally:
        await watcher.close()
        await holder.close()
        await pool.close()


async def test_each_call_times_out_at_its_own_deadline(postgres_url: str) -> None:
    """Calls begun at different times each time out about ``timeout`` after their own
    start, while calls that finish in time are answered: the shared watchdog re-arms
    for the earliest deadline left."""
    pool = _pool(postgres_url, 4, 0.5)
    loop = asyncio.get_running_loop()

    async def timed(delay: float, query: str) -> tuple[float, BaseException | None]:
        await asyncio.sleep(delay)
        start = loop.time()
        try:
            await pool.fetch(query)
        except TimeoutError as exc:
            return loop.time() - start, exc
        return loop.time() - start, None

    try:
        results = await asyncio.gather(
            timed(0.0, "SELECT pg_sleep(3)"),
            timed(0.2, "SELECT pg_sleep(3)"),
            timed(0.1, "SELECT pg_sleep(0.1)"),
            timed(0.3, "SELECT 1"),
        )
        for elapsed, error in results[:2]:
            assert isinstance(error, TimeoutError)
            assert 0.45 < elapsed < 1.0
        for elapsed, error in results[2:]:
            assert error is None and elapsed < 0.45
    finally:
        await pool.close()


async def test_a_caller_cancelled_by_another_is_cancelled_not_timed_out(
    postgres_url: str,
) -> None:
    pool = _pool(postgres_url, 1, 0.3)
    try:
        call = asyncio.create_task(pool.fetch("SELECT pg_sleep(3)"))
        await asyncio.sleep(0.1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # Cancelled at the instant its deadline passes too: still cancelled.
        late = asyncio.create_task(pool.fetch("SELECT pg_sleep(3)"))
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time() + 0.3, late.cancel)
        with pytest.raises(asyncio.CancelledError):
            await late
        assert [tuple(row) for row in await pool.fetch("SELECT 2")] == [(2,)]
    finally:
        await pool.close()
