"""The PostgreSQL backend's connection pool: as small as what the store needs.

Why not ``asyncpg.Pool``: docs/why.md ("The PostgreSQL pool"). This pool:

* opens at most ``size`` connections, on demand, and reuses the most recent idle one;
* runs nothing on release: the store's sessions keep no state between statements (no
  explicit transactions but during migration, no ``SET``, no ``LISTEN``);
* retires a connection that raised anything (a server error, a broken socket, a
  cancelled call), since its state is then unknown: it is closed in the background, which
  first lets asyncpg's cancel request reach the server, so that a statement whose caller
  gave up is interrupted rather than left to commit unobserved;
* on :meth:`close`, closes the idle connections, and the busy ones as they come back;
* bounds each :meth:`fetch` by ``timeout`` seconds: the wait for a free connection and
  then the statement (asyncpg's own timeout, which also asks the server to cancel it);
  opening a connection has its own timeout (``connect``'s), not counted against it.

Errors are the driver's (``asyncpg.InterfaceError`` once closed); the backend translates
them at its one seam.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg

_CLOSE_TIMEOUT = 10.0  # seconds a retired connection gets to close before it is cut


class ConnectionPool:
    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        size: int,
        timeout: float | None = None,
    ) -> None:
        self.size = size
        self.timeout = timeout  # seconds a fetch may take (None: as long as it takes)
        self._connect = connect
        self._slots = asyncio.Semaphore(size)
        self._idle: list[asyncpg.Connection] = []
        self._retiring: set[asyncio.Task[None]] = set()
        self._closed = False

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection for the caller alone until the block ends."""
        async with self._slots:
            conn = await self._take()
            try:
                yield conn
            except BaseException:
                self._retire(conn)
                raise
            await self._give_back(conn)

    async def fetch(self, query: str, *args: object) -> list[Any]:
        """Run one statement on an idle connection (``acquire`` inlined: the hot path),
        within :attr:`timeout` (``TimeoutError`` past it: for a write, outcome unknown)."""
        timeout = self.timeout
        if timeout is not None and self._slots.locked():
            loop = asyncio.get_running_loop()
            start = loop.time()
            try:
                await asyncio.wait_for(self._slots.acquire(), timeout)
            except TimeoutError as exc:
                raise TimeoutError(f"no connection came free within {timeout:g} s") from exc
            timeout = max(0.001, timeout - (loop.time() - start))
        else:  # at once, without suspending, when a slot is free: nothing waited
            await self._slots.acquire()
        try:
            idle = self._idle
            conn = idle.pop() if idle and not self._closed else None
            if conn is None or conn.is_closed():
                conn = await self._take()
            try:
                rows: list[Any] = await conn.fetch(query, *args, timeout=timeout)
            except BaseException:
                self._retire(conn)
                raise
            if self._closed:
                await conn.close()
            else:
                idle.append(conn)
            return rows
        finally:
            self._slots.release()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()
        await asyncio.gather(*self._retiring)

    async def _take(self) -> asyncpg.Connection:
        if self._closed:
            raise asyncpg.InterfaceError("the store is closed")
        while self._idle:
            conn = self._idle.pop()
            if not conn.is_closed():  # the server may have closed it while idle
                return conn
        return await self._connect()

    async def _give_back(self, conn: asyncpg.Connection) -> None:
        if self._closed:
            await conn.close()
        else:
            self._idle.append(conn)

    def _retire(self, conn: asyncpg.Connection) -> None:
        task = asyncio.get_running_loop().create_task(self._close_or_cut(conn))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    @staticmethod
    async def _close_or_cut(conn: asyncpg.Connection) -> None:
        try:
            await asyncio.wait_for(conn.close(), _CLOSE_TIMEOUT)
        except Exception:
            conn.terminate()
        except asyncio.CancelledError:
            conn.terminate()
            raise
