"""The client for blocking code, derived from the async one as :mod:`agentrooms.sync` is
from the library: each blocking method is ``_blocking(AsyncMethod)``, run on an event
loop the :class:`SyncClient` owns in a background thread. A test checks that every
public coroutine method of the async parts has its blocking twin here.

    with SyncClient("http://127.0.0.1:8787", token) as client:
        room = client.room("demo")
        lease = room.plan.claim_next()
        room.plan.complete(lease, {"ok": True})
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any, Self

import httpx

from agentrooms.rooms.locks import DEFAULT_TTL as LOCK_TTL
from agentrooms.rooms.locks import Lock
from agentrooms.rooms.plan import Lease, LeaseKeeper
from agentrooms.store.types import Event
from agentrooms.sync import _blocking, _Portal, _Twin

from .rooms import Client, Documents, Events, Locks, Plan, Presence, Room, Rooms
from .rooms.base import Ack

__all__ = [
    "SyncClient",
    "SyncDocuments",
    "SyncEvents",
    "SyncLocks",
    "SyncPlan",
    "SyncPresence",
    "SyncRoom",
    "SyncRooms",
]


class SyncPlan(_Twin[Plan]):
    get = _blocking(Plan.get)
    tasks = _blocking(Plan.tasks)
    page = _blocking(Plan.page)
    add = _blocking(Plan.add)
    claim_next = _blocking(Plan.claim_next)
    claim = _blocking(Plan.claim)
    finished = _blocking(Plan.finished)
    renew = _blocking(Plan.renew)
    complete = _blocking(Plan.complete)
    fail = _blocking(Plan.fail)
    cancel = _blocking(Plan.cancel)

    @contextlib.contextmanager
    def keep_alive(
        self, lease: Lease, *, ttl: float | None = None, every: float | None = None
    ) -> Iterator[LeaseKeeper]:
        """Renew ``lease`` from the client's loop while the body runs. A blocking body
        cannot be interrupted: it should check ``keeper.lost``; if the lease was lost,
        ``StaleFence`` is raised when the block ends."""
        entered = asyncio.Event()
        leave = asyncio.Event()
        kept: list[LeaseKeeper] = []

        async def keep() -> None:
            async with self.inner.keep_alive(lease, ttl=ttl, every=every) as keeper:
                kept.append(keeper)
                entered.set()
                waiting = asyncio.ensure_future(leave.wait())
                lost = asyncio.ensure_future(keeper.lost_event.wait())
                await asyncio.wait({waiting, lost}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                lost.cancel()
                if keeper.lost is None:
                    return
                await asyncio.sleep(3600)  # cancelled by keep_alive: raises StaleFence

        loop = self.portal.loop
        task = asyncio.run_coroutine_threadsafe(keep(), loop)
        self.portal.run(entered.wait())
        try:
            yield kept[0]
        finally:
            loop.call_soon_threadsafe(leave.set)
            task.result()


class SyncDocuments(_Twin[Documents]):
    get = _blocking(Documents.get)
    list = _blocking(Documents.list)
    put = _blocking(Documents.put)
    delete = _blocking(Documents.delete)


class SyncEvents(_Twin[Events]):
    post = _blocking(Events.post)
    read = _blocking(Events.read)
    cursor = _blocking(Events.cursor)
    read_new = _blocking(Events.read_new)
    read_inbox = _blocking(Events.read_inbox)
    ack = _blocking(Events.ack)

    def subscribe(
        self, agent: str | None = None, *, ack: Ack = "auto", batch: int = 100, wait: float = 30.0
    ) -> Iterator[Event]:
        """:meth:`Events.subscribe` as a blocking iterator (close it to stop)."""
        return self._blocking_iter(self.inner.subscribe(agent, ack=ack, batch=batch, wait=wait))

    def stream(self, after: int = 0, *, wait: float = 30.0) -> Iterator[Event]:
        """:meth:`Events.stream` as a blocking iterator (close it to stop)."""
        return self._blocking_iter(self.inner.stream(after, wait=wait))

    def _blocking_iter(self, events: AsyncIterator[Event]) -> Iterator[Event]:

        async def step() -> Event:
            return await anext(events)

        async def close() -> None:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

        try:
            while True:
                try:
                    yield self.portal.run(step())
                except StopAsyncIteration:
                    return
        finally:
            self.portal.run(close())


class SyncPresence(_Twin[Presence]):
    heartbeat = _blocking(Presence.heartbeat)
    who_is_online = _blocking(Presence.who_is_online)
    page = _blocking(Presence.page)
    leave = _blocking(Presence.leave)


class SyncLocks(_Twin[Locks]):
    try_acquire = _blocking(Locks.try_acquire)
    wait_acquire = _blocking(Locks.wait_acquire)
    acquire = _blocking(Locks.acquire)
    release = _blocking(Locks.release)
    extend = _blocking(Locks.extend)
    requeue = _blocking(Locks.requeue)
    holder = _blocking(Locks.holder)
    waiters = _blocking(Locks.waiters)

    @contextlib.contextmanager
    def hold(
        self,
        name: str,
        owner: str | None = None,
        *,
        ttl: float = LOCK_TTL,
        tries: int = 5,
        step: float = 0.15,
        queue_timeout: float | None = None,
    ) -> Iterator[Lock]:
        """``with locks.hold("plan") as lock:`` — released even if the body raises."""
        if queue_timeout is None:
            lock = self.acquire(name, owner, ttl=ttl, tries=tries, step=step)
        else:
            lock = self.wait_acquire(name, owner, ttl=ttl, timeout=queue_timeout)
        try:
            yield lock
        finally:
            self.release(lock)


class SyncRoom(_Twin[Room]):
    describe = _blocking(Room.describe)

    def __init__(self, inner: Room, portal: _Portal) -> None:
        super().__init__(inner, portal)
        self.name = inner.name
        self.plan = SyncPlan(inner.plan, portal)
        self.docs = SyncDocuments(inner.docs, portal)
        self.events = SyncEvents(inner.events, portal)
        self.presence = SyncPresence(inner.presence, portal)
        self.locks = SyncLocks(inner.locks, portal)


class SyncRooms(_Twin[Rooms]):
    describe = _blocking(Rooms.describe)
    page = _blocking(Rooms.page)
    list = _blocking(Rooms.list)
    archive = _blocking(Rooms.archive)
    delete = _blocking(Rooms.delete)

    def room(self, name: str) -> SyncRoom:
        return SyncRoom(self.inner.room(name), self.portal)

    def get(self, name: str) -> SyncRoom:
        return SyncRoom(self.portal.run(self.inner.get(name)), self.portal)

    def create(self, name: str, description: str = "", metadata: Any = None) -> SyncRoom:
        return SyncRoom(
            self.portal.run(self.inner.create(name, description, metadata)), self.portal
        )


class SyncClient:
    """:class:`~agentrooms.client.Client` for blocking code. Thread-safe."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        agent: str | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.portal = _Portal()

        async def make() -> Client:  # the connection pool belongs to the portal's loop
            return Client(
                url, token, agent=agent, timeout=timeout, retries=retries, transport=transport
            )

        self.inner = self.portal.run(make())
        self.url, self.agent = self.inner.url, agent
        self.rooms = SyncRooms(self.inner.rooms, self.portal)

    def room(self, name: str) -> SyncRoom:
        return SyncRoom(self.inner.room(name), self.portal)

    def close(self) -> None:
        if not self.portal.loop.is_closed():
            self.portal.run(self.inner.close())
            self.portal.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
