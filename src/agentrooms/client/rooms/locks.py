"""A remote room's named locks: fencing tokens and a FIFO line."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from agentrooms.client.rooms.base import Part, parse, seg
from agentrooms.errors import BadRequest, LockHeld
from agentrooms.rooms.locks import DEFAULT_TTL as LOCK_TTL
from agentrooms.rooms.locks import Lock, LockInfo, WaiterInfo


class Locks(Part):
    """Named locks with fencing tokens and a FIFO line (:class:`agentrooms.rooms.Locks`)."""

    def _lock(self, name: str) -> str:
        return f"{self._room.path}/locks/{seg(name)}"

    async def _acquire(
        self, name: str, owner: str | None, ttl: float, wait: float, command_id: str | None
    ) -> Lock:
        body = {"agent": self._client.acting(owner), "ttl": ttl, "wait": wait}
        data = await self._http.json(
            "POST",
            f"{self._lock(name)}/acquire",
            safety="keyed",
            body=body,
            headers=self._key(command_id),
            read_timeout=wait + 30.0,
        )
        return parse(Lock, data)

    async def try_acquire(
        self,
        name: str,
        owner: str | None = None,
        *,
        ttl: float = LOCK_TTL,
        command_id: str | None = None,
    ) -> Lock:
        """Take the lock now or raise ``LockHeld`` naming the holder."""
        return await self._acquire(name, owner, ttl, 0.0, command_id)

    async def wait_acquire(
        self,
        name: str,
        owner: str | None = None,
        *,
        ttl: float = LOCK_TTL,
        timeout: float = 30.0,
        command_id: str | None = None,
    ) -> Lock:
        """Queue for the lock (FIFO) up to ``timeout`` seconds (the server caps it);
        ``LockHeld`` if it was not handed over."""
        return await self._acquire(name, owner, ttl, timeout, command_id)

    async def acquire(
        self,
        name: str,
        owner: str | None = None,
        *,
        ttl: float = LOCK_TTL,
        tries: int = 5,
        step: float = 0.15,
    ) -> Lock:
        """Try ``tries`` times, waiting ``step``, ``2*step``... between tries, then
        raise ``LockHeld``."""
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            raise BadRequest("tries must be a positive integer")
        for attempt in range(1, tries + 1):
            try:
                return await self.try_acquire(name, owner, ttl=ttl)
            except LockHeld:
                if attempt == tries:
                    raise
                await asyncio.sleep(step * attempt)
        raise AssertionError("unreachable")

    async def release(self, lock: Lock) -> bool:
        """Release if ``lock`` is still the current grant (owner-checked: a grant of
        another agent is ``Forbidden``); ``False`` if it had expired or changed hands.
        Not retried once sent: an unknown outcome is ``StoreUnavailable``."""
        data = await self._http.json(
            "POST",
            f"{self._lock(lock.name)}/release",
            safety="once",
            body={"token": lock.token, "fence": lock.fence},
        )
        released: bool = data["released"]
        return released

    async def extend(self, lock: Lock, ttl: float | None = None) -> Lock:
        """Extend a grant still held; ``StaleFence`` if it expired or changed hands."""
        data = await self._http.json(
            "POST",
            f"{self._lock(lock.name)}/extend",
            safety="idempotent",
            body={"token": lock.token, "fence": lock.fence, "ttl": ttl},
        )
        return parse(Lock, data)

    async def requeue(self, lock: Lock, *, timeout: float = 30.0) -> Lock:
        """Pass the grant on and queue again, in one write; the next grant within
        ``timeout`` seconds, else ``LockHeld``."""
        data = await self._http.json(
            "POST",
            f"{self._lock(lock.name)}/requeue",
            safety="once",
            body={"token": lock.token, "fence": lock.fence, "wait": timeout},
            read_timeout=timeout + 30.0,
        )
        return parse(Lock, data)

    async def holder(self, name: str) -> LockInfo | None:
        """The lock's holder, ``None`` if it is free."""
        data = await self._http.json("GET", self._lock(name), safety="idempotent")
        holder = data["holder"]
        return None if holder is None else parse(LockInfo, holder, name=name)

    async def waiters(self, name: str) -> list[WaiterInfo]:
        """The agents in the lock's line, first in line first."""
        data = await self._http.json("GET", self._lock(name), safety="idempotent")
        return [parse(WaiterInfo, w) for w in data["waiters"]]

    @contextlib.asynccontextmanager
    async def hold(
        self,
        name: str,
        owner: str | None = None,
        *,
        ttl: float = LOCK_TTL,
        tries: int = 5,
        step: float = 0.15,
        queue_timeout: float | None = None,
    ) -> AsyncIterator[Lock]:
        """``async with locks.hold("plan") as lock:`` — released even if the body
        raises. With ``queue_timeout`` it queues instead of polling."""
        if queue_timeout is None:
            lock = await self.acquire(name, owner, ttl=ttl, tries=tries, step=step)
        else:
            lock = await self.wait_acquire(name, owner, ttl=ttl, timeout=queue_timeout)
        try:
            yield lock
        finally:
            await self.release(lock)
