"""The raw clients: the same compare-and-set on one document, without agentrooms.

Each keeps ``(value, version)`` for one document and offers ``read`` (value and version
together) and ``cas`` (write if the version is still the one read, bump it):

* redis:    redis-py (hiredis) ``HMGET`` and a small Lua script (``EVALSHA``)
* postgres: asyncpg ``SELECT`` and ``UPDATE ... WHERE version = $n RETURNING version``
* sqlite:   stdlib sqlite3, one connection per agent on its own thread, WAL with
            ``synchronous=FULL`` (agentrooms' default), ``BEGIN IMMEDIATE`` / ``UPDATE``
* memory:   a Python dict (what "no store at all" costs)

They are the denominators of the ratios in the summary: agentrooms' whole-document
compare-and-swap with full jitter against the raw client doing the same loop (read,
think, conditional write, full-jitter backoff on a conflict).
"""

from __future__ import annotations

import abc
import asyncio
import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrooms.reliability.stores import Target, unique, without_query

__all__ = ["RawDoc", "open_raw"]

REDIS_CAS = """
local v = redis.call('HGET', KEYS[1], 'ver')
if v ~= ARGV[1] then return -1 end
local n = redis.call('HINCRBY', KEYS[1], 'ver', 1)
redis.call('HSET', KEYS[1], 'val', ARGV[2])
return n
"""


class RawDoc(abc.ABC):
    """One document under compare-and-set with a bare client."""

    label = "raw"

    @abc.abstractmethod
    async def read(self, agent: int) -> tuple[dict[str, Any], int]: ...

    @abc.abstractmethod
    async def cas(self, agent: int, value: dict[str, Any], version: int) -> bool:
        """Write ``value`` if the version is still ``version``; False on a conflict."""

    async def close(self) -> None:
        return None


class RawMemory(RawDoc):
    label = "raw Python dict"

    def __init__(self, initial: dict[str, Any]) -> None:
        self._value, self._version = json.dumps(initial), 1

    async def read(self, agent: int) -> tuple[dict[str, Any], int]:
        value: dict[str, Any] = json.loads(self._value)
        return value, self._version

    async def cas(self, agent: int, value: dict[str, Any], version: int) -> bool:
        if self._version != version:
            return False
        self._value, self._version = json.dumps(value), version + 1
        return True


class RawRedis(RawDoc):
    label = "raw redis-py Lua CAS"

    def __init__(self, client: Any, key: str) -> None:
        self._client, self._key = client, key
        self._cas = client.register_script(REDIS_CAS)

    @classmethod
    async def open(cls, url: str, prefix: str, initial: dict[str, Any]) -> RawRedis:
        import redis.asyncio as redis

        client = redis.Redis.from_url(url)
        raw = cls(client, f"{prefix}:{unique('doc')}")
        await client.hset(raw._key, mapping={"ver": 1, "val": json.dumps(initial)})
        return raw

    async def read(self, agent: int) -> tuple[dict[str, Any], int]:
        version, value = await self._client.hmget(self._key, ["ver", "val"])
        return json.loads(value), int(version)

    async def cas(self, agent: int, value: dict[str, Any], version: int) -> bool:
        new = await self._cas(keys=[self._key], args=[version, json.dumps(value)])
        return int(new) != -1

    async def close(self) -> None:
        await self._client.delete(self._key)
        await self._client.aclose()


class RawPostgres(RawDoc):
    label = "raw asyncpg conditional UPDATE"

    def __init__(self, pool: Any, table: str) -> None:
        self._pool, self._table = pool, table
        self._read = f"SELECT value, version FROM {table} WHERE key = 'doc'"
        self._update = (
            f"UPDATE {table} SET value = $1, version = version + 1 "
            "WHERE key = 'doc' AND version = $2 RETURNING version"
        )

    @classmethod
    async def open(cls, dsn: str, connections: int, initial: dict[str, Any]) -> RawPostgres:
        import asyncpg

        pool = await asyncpg.create_pool(
            without_query(dsn), min_size=1, max_size=max(1, connections)
        )
        table = unique("arbench_raw").replace("-", "_")
        await pool.execute(
            f"CREATE TABLE {table} (key text PRIMARY KEY, value text NOT NULL, "
            "version bigint NOT NULL)"
        )
        await pool.execute(f"INSERT INTO {table} VALUES ('doc', $1, 1)", json.dumps(initial))
        return cls(pool, table)

    async def read(self, agent: int) -> tuple[dict[str, Any], int]:
        row = await self._pool.fetchrow(self._read)
        return json.loads(row["value"]), int(row["version"])

    async def cas(self, agent: int, value: dict[str, Any], version: int) -> bool:
        new = await self._pool.fetchval(self._update, json.dumps(value), version)
        return new is not None

    async def close(self) -> None:
        try:
            await self._pool.execute(f"DROP TABLE IF EXISTS {self._table}")
        finally:
            await self._pool.close()


class RawSqlite(RawDoc):
    label = "raw sqlite3 BEGIN IMMEDIATE/UPDATE"

    def __init__(self, path: Path, agents: int) -> None:
        self._path = path
        self._pool = ThreadPoolExecutor(max_workers=max(1, agents), thread_name_prefix="rawsql")
        self._conns: dict[int, sqlite3.Connection] = {}
        self._lock = threading.Lock()

    @classmethod
    async def open(cls, directory: Path, agents: int, initial: dict[str, Any]) -> RawSqlite:
        path = directory / f"{unique('raw')}.db"
        setup = sqlite3.connect(path, isolation_level=None)
        try:
            setup.execute("PRAGMA journal_mode=WAL")
            setup.execute("CREATE TABLE t (key TEXT PRIMARY KEY, value TEXT, version INTEGER)")
            setup.execute("INSERT INTO t VALUES ('doc', ?, 1)", (json.dumps(initial),))
        finally:
            setup.close()
        return cls(path, agents)

    def _conn(self, agent: int) -> sqlite3.Connection:
        with self._lock:
            conn = self._conns.get(agent)
            if conn is None:
                conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA busy_timeout=30000")
                self._conns[agent] = conn
            return conn

    def _read_sync(self, agent: int) -> tuple[dict[str, Any], int]:
        row = self._conn(agent).execute("SELECT value, version FROM t WHERE key='doc'").fetchone()
        return json.loads(row[0]), int(row[1])

    def _cas_sync(self, agent: int, text: str, version: int) -> bool:
        conn = self._conn(agent)
        conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.execute(
                "UPDATE t SET value = ?, version = version + 1 WHERE key = 'doc' AND version = ?",
                (text, version),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return cur.rowcount == 1

    async def read(self, agent: int) -> tuple[dict[str, Any], int]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._read_sync, agent)

    async def cas(self, agent: int, value: dict[str, Any], version: int) -> bool:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, self._cas_sync, agent, json.dumps(value), version
        )

    async def close(self) -> None:
        def close_all() -> None:
            with self._lock:
                for conn in self._conns.values():
                    conn.close()
                self._conns.clear()
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self._path}{suffix}").unlink(missing_ok=True)

        await asyncio.get_running_loop().run_in_executor(self._pool, close_all)
        self._pool.shutdown(wait=True)


async def open_raw(target: Target, agents: int, initial: dict[str, Any]) -> RawDoc:
    """The raw client of ``target``'s backend, holding ``initial`` at version 1."""
    if target.name == "redis" and target.redis_url is not None:
        return await RawRedis.open(target.redis_url, target.raw_prefix, initial)
    if target.name == "postgres" and target.postgres_dsn is not None:
        connections = min(agents, 10 * max(1, min(8, agents // 8)))  # as many as ours may
        return await RawPostgres.open(target.postgres_dsn, connections, initial)
    if target.name == "sqlite":
        return await RawSqlite.open(target.scratch, agents, initial)
    return RawMemory(initial)
