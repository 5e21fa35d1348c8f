"""The PostgreSQL backend's connection pool (store/postgres/pool.py), against the run's
test database: one ``fetch`` is bounded by the pool's timeout, the wait for a free
connection counted against it; a timed-out statement retires its connection; the
pool reuses its idle connections and opens no more than its size."""

from __future__ import annotations

import asyncio
import functools
import time

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
