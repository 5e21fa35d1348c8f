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
  then the statement; opening a connection has its own timeout (``connect``'s), not
  counted against it. Past it the call's task is cancelled where it waits, as
  ``asyncio.timeout`` would, which for a statement in flight makes asyncpg ask the server
  to cancel it, and the call raises ``TimeoutError``. One timer per pool serves every
  call (a watchdog armed for the earliest deadline), not one per call: a call only
  notes its deadline (docs/why.md). ``connect`` should therefore set no
  ``command_timeout`` of its own, which would arm asyncpg's timer on every statement.

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
        # The calls in flight -> their deadline and how often their task had been
        # cancelled when they began; the ones the watchdog cancelled -> the latter.
        self._deadlines: dict[asyncio.Task[Any], tuple[float, int]] = {}
        self._expired: dict[asyncio.Task[Any], int] = {}
        self._alarm: asyncio.TimerHandle | None = None

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
        task = None
        if self.timeout is not None:
            task = asyncio.current_task()
            assert task is not None
            self._watch(task)
        try:
            await self._slots.acquire()  # at once, without suspending, when a slot is free
        except asyncio.CancelledError:
            self._timed_out(task, "no connection came free")
            raise
        try:
            idle = self._idle
            conn = idle.pop() if idle and not self._closed else None
            if conn is None or conn.is_closed():
                conn = await self._connect_unwatched(task)
            try:
                rows: list[Any] = await conn.fetch(query, *args)
            except BaseException:
                self._retire(conn)
                raise
            if self._closed:
                await conn.close()
            else:
                idle.append(conn)
            return rows
        except asyncio.CancelledError:
            self._timed_out(task, "no reply")
            raise
        finally:
            self._slots.release()
            if task is not None:
                self._deadlines.pop(task, None)

    def _watch(self, task: asyncio.Task[Any]) -> None:
        """Note ``task``'s deadline, ``timeout`` from now, arming the watchdog if it is
        not armed for an earlier one."""
        assert self.timeout is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        self._deadlines[task] = (deadline, task.cancelling())
        if self._alarm is None or deadline < self._alarm.when():
            self._arm(loop, deadline)

    def _timed_out(self, task: asyncio.Task[Any] | None, what: str) -> None:
        """In a call that got ``CancelledError``: if the watchdog cancelled it and nobody
        else did too, ``TimeoutError`` instead (as ``asyncio.timeout`` decides)."""
        if task is None:
            return
        self._deadlines.pop(task, None)
        if task not in self._expired:
            return
        cancelling = self._expired.pop(task)
        if task.uncancel() <= cancelling:
            raise TimeoutError(f"{what} within {self.timeout:g} s") from None

    async def _connect_unwatched(self, task: asyncio.Task[Any] | None) -> asyncpg.Connection:
        """A new connection (``_take``), the time it takes to open added to the call's
        deadline: opening has its own timeout."""
        if task is None:
            return await self._take()
        loop = asyncio.get_running_loop()
        deadline, cancelling = self._deadlines.pop(task, (loop.time(), 0))
        start = loop.time()
        try:
            return await self._take()
        finally:
            deadline += loop.time() - start
            self._deadlines[task] = (deadline, cancelling)
            if self._alarm is None or deadline < self._alarm.when():
                self._arm(loop, deadline)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
        self._alarm = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        """The watchdog: cancel the calls past their deadline, then re-arm for the
        earliest deadline left."""
        self._alarm = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        earliest = None
        for task, (deadline, cancelling) in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[task]
                self._expired[task] = cancelling
                task.cancel()
            elif earliest is None or deadline < earliest:
                earliest = deadline
        if earliest is not None:
            self._arm(loop, earliest)

    async def close(self) -> None:
        self._closed = True
        if self._alarm is not None and not self._deadlines:  # nothing left to bound
            self._alarm.cancel()
            self._alarm = None
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
