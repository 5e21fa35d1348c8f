"""A writer's ownership of LangGraph threads: one room lock per thread, with its fence.

:class:`ThreadLeases` takes, renews (on a write once half the TTL has passed, or in the
background while :meth:`~agentrooms.integrations.langgraph.AgentroomsSaver.owning`
runs), checks and releases the leases of one writer; :meth:`ThreadLeases.write` commits
a write only while this writer's grant is the newest of the thread's lock (the fence is
compared in the same atomic write). The errors a refused write raises are here too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrooms.errors import AgentroomsError, LockHeld, StaleFence, StoreUnavailable
from agentrooms.integrations.langgraph import layout
from agentrooms.rooms import Lock, Room
from agentrooms.store import Write

__all__ = ["ThreadHeld", "ThreadLeases", "ThreadOwnershipLost"]


class ThreadHeld(LockHeld):
    """Another writer owns the thread: this writer's ``put``/``put_writes`` (or ``take``)
    wrote nothing. Wait for the lease (``take(thread_id, timeout=...)``) or leave the
    thread to its owner. ``thread_id`` and ``holder`` (the owner's name) say who."""

    code = "thread_held"

    def __init__(self, thread_id: str, holder: str | None, writer: str) -> None:
        self.thread_id, self.writer = thread_id, writer
        super().__init__(
            layout.lock_name(thread_id),
            holder,
            f"thread {thread_id!r} is owned by {holder!r}, not by this writer "
            f"({writer!r}): nothing was written",
        )

    def details(self) -> dict[str, Any]:
        return {**super().details(), "thread_id": self.thread_id, "writer": self.writer}


class ThreadOwnershipLost(StaleFence):
    """This writer's lease on the thread was superseded: another writer was granted it
    since, so the write was refused (nothing written) rather than fork the thread. The
    thread may have moved on: re-read it before writing again. ``holder`` is the owner
    now (``None`` if nobody holds it at this moment)."""

    code = "thread_ownership_lost"

    def __init__(
        self, thread_id: str, writer: str, holder: str | None, fence: int, current: int | None
    ) -> None:
        self.key, self.fence, self.current = layout.lock_name(thread_id), fence, current
        self.thread_id, self.writer, self.holder = thread_id, writer, holder
        AgentroomsError.__init__(
            self,
            f"writer {writer!r} no longer owns thread {thread_id!r} (now held by "
            f"{holder!r}; fence {fence} is stale, the newest is {current}): the write "
            "was refused and nothing was written; re-read the thread",
        )

    def details(self) -> dict[str, Any]:
        return {
            **super().details(),
            "thread_id": self.thread_id,
            "writer": self.writer,
            "holder": self.holder,
        }


@dataclass
class _Lease:
    lock: Lock
    renew_at: float  # time.monotonic(): renew on the first write after this


class ThreadLeases:
    """The leases ``owner`` holds on threads of ``room``, each lasting ``ttl`` seconds
    from its grant or renewal; ``setup`` runs before a lease is first taken or looked up
    (it creates the room). One call at a time per thread (a turn each)."""

    def __init__(
        self, room: Room, owner: str, ttl: float, setup: Callable[[], Awaitable[None]]
    ) -> None:
        self.room, self.owner, self.ttl, self._setup = room, owner, ttl, setup
        self.leases: dict[str, _Lease] = {}
        self._turns: dict[str, asyncio.Lock] = {}
        self._keepers: dict[str, asyncio.Task[None]] = {}

    def _turn(self, thread_id: str) -> asyncio.Lock:
        return self._turns.setdefault(thread_id, asyncio.Lock())

    def _leased(self, thread_id: str, lock: Lock) -> Lock:
        self.leases[thread_id] = _Lease(lock, time.monotonic() + lock.ttl / 2)
        return lock

    async def _take(self, thread_id: str, timeout: float | None) -> Lock:
        await self._setup()
        name = layout.lock_name(thread_id)
        try:
            if timeout is None:
                lock = await self.room.locks.try_acquire(name, self.owner, ttl=self.ttl)
            else:
                lock = await self.room.locks.wait_acquire(
                    name, self.owner, ttl=self.ttl, timeout=timeout
                )
        except LockHeld as exc:
            raise ThreadHeld(thread_id, exc.holder, self.owner) from exc
        return self._leased(thread_id, lock)

    async def lease(self, thread_id: str) -> Lock:
        """This writer's grant on the thread: the one it holds (renewed once half its TTL
        has passed), else a new one if the thread is free (``ThreadHeld`` if not)."""
        async with self._turn(thread_id):
            lease = self.leases.get(thread_id)
            if lease is None:
                return await self._take(thread_id, None)
            if time.monotonic() < lease.renew_at:
                return lease.lock
            try:
                return self._leased(thread_id, await self.room.locks.extend(lease.lock))
            except StaleFence:
                pass  # it lapsed: take it again, if nobody was granted it in between
            del self.leases[thread_id]
            try:
                lock = await self._take(thread_id, None)
            except ThreadHeld as exc:
                raise await self._lost(thread_id, lease.lock, None) from exc
            if lock.fence != lease.lock.fence + 1:
                await self.drop(thread_id)
                raise await self._lost(thread_id, lease.lock, lock.fence - 1)
            return lock

    def _forget(self, thread_id: str) -> _Lease | None:
        """Forget the thread's lease (and its turn, unless a call is in it)."""
        turn = self._turns.get(thread_id)
        if turn is not None and not turn.locked():
            del self._turns[thread_id]
        return self.leases.pop(thread_id, None)

    async def drop(self, thread_id: str) -> bool:
        keeper = self._keepers.pop(thread_id, None)
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        lease = self._forget(thread_id)
        return lease is not None and await self.room.locks.release(lease.lock)

    async def _keep(self, thread_id: str) -> None:
        """Renew the thread's lease each time half its TTL has passed, until it is
        released or lost (the next write then says which)."""
        try:
            await self._keeping(thread_id)
        finally:
            if self._keepers.get(thread_id) is asyncio.current_task():
                del self._keepers[thread_id]

    async def _keeping(self, thread_id: str) -> None:
        while (lease := self.leases.get(thread_id)) is not None:
            await asyncio.sleep(max(0.0, lease.renew_at - time.monotonic()))
            async with self._turn(thread_id):
                lease = self.leases.get(thread_id)
                if lease is None or time.monotonic() < lease.renew_at:
                    continue  # released, or a write renewed it meanwhile
                try:
                    self._leased(thread_id, await self.room.locks.extend(lease.lock))
                except StaleFence:
                    return  # lapsed or taken: the next write takes it back or is refused
                except StoreUnavailable:
                    await asyncio.sleep(min(1.0, self.ttl / 10))  # try again

    async def start_keeping(self, thread_id: str) -> None:
        if thread_id not in self._keepers:
            self._keepers[thread_id] = asyncio.create_task(self._keep(thread_id))

    async def _lost(self, thread_id: str, lock: Lock, current: int | None) -> ThreadOwnershipLost:
        holder = await self.room.locks.holder(lock.name)
        return ThreadOwnershipLost(
            thread_id,
            self.owner,
            None if holder is None else holder.owner,
            lock.fence,
            current if holder is None else holder.fence,
        )

    async def write(self, thread_id: str, writes: list[Write], compares: Sequence[Any]) -> None:
        """Commit ``writes`` fenced by this writer's grant on the thread."""
        lock = await self.lease(thread_id)
        try:
            await self.room.scope.transact([lock.guard(), *compares], writes)
        except StaleFence as exc:
            self._forget(thread_id)
            raise await self._lost(thread_id, lock, exc.current) from exc

    async def acquire(self, thread_id: str, timeout: float | None) -> Lock:
        async with self._turn(thread_id):
            lease = self.leases.get(thread_id)
            return lease.lock if lease is not None else await self._take(thread_id, timeout)

    async def owner_of(self, thread_id: str) -> str | None:
        await self._setup()
        holder = await self.room.locks.holder(layout.lock_name(thread_id))
        return None if holder is None else holder.owner
