"""Who is waiting in ``watch`` for a room's log to pass a sequence number.

One :class:`Watchers` per worker (so per database file per process), shared by the
event loops of its stores. A coroutine in ``watch`` :meth:`~Watchers.add`\\ s a waiter
*before* it reads the room's last sequence number, so an append committed after that
read always finds it. The worker's thread calls :meth:`~Watchers.notify` with the rooms
its own commits appended to (at once) and with the rooms another process has changed
(found by its slow poll); each waiter whose room passed its ``after`` is woken on its own
event loop with ``call_soon_threadsafe`` (one call per loop), its future resolved to the
room's sequence number.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agentrooms.errors import StoreUnavailable


@dataclass(eq=False, slots=True)
class Waiter:
    """One ``watch`` call: woken with the room's sequence number once it exceeds ``after``."""

    room: str
    after: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int] = field(init=False)

    def __post_init__(self) -> None:
        self.future = self.loop.create_future()


class Watchers:
    """Thread-safe: waiters come and go on event loops, wake-ups come from the worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rooms: dict[str, set[Waiter]] = {}

    def add(self, room: str, after: int) -> Waiter:
        """A waiter for ``room`` passing ``after``, on the running event loop."""
        waiter = Waiter(room, after, asyncio.get_running_loop())
        with self._lock:
            self._rooms.setdefault(room, set()).add(waiter)
        return waiter

    def discard(self, waiter: Waiter) -> None:
        """Forget ``waiter`` (woken, timed out or cancelled); idempotent."""
        with self._lock:
            waiters = self._rooms.get(waiter.room)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._rooms[waiter.room]

    def waiting(self) -> bool:
        """Is anyone waiting?"""
        with self._lock:
            return bool(self._rooms)

    def rooms(self) -> list[str]:
        """The rooms someone is waiting on (empty: nobody is, no need to poll)."""
        with self._lock:
            return list(self._rooms)

    def notify(self, seqs: Mapping[str, int]) -> None:
        """Rooms' last sequence numbers are now ``seqs``: wake (and forget) every waiter
        whose room passed its ``after``. Called from any thread."""
        if not seqs:
            return
        woken: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[int], int]]] = {}
        with self._lock:
            for room, seq in seqs.items():
                waiters = self._rooms.get(room)
                if not waiters:
                    continue
                for waiter in [w for w in waiters if seq > w.after]:
                    waiters.discard(waiter)
                    woken.setdefault(waiter.loop, []).append((waiter.future, seq))
                if not waiters:
                    del self._rooms[room]
        for loop, wakes in woken.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_wake, wakes)

    def fail(self, message: str, waiters: Iterable[Waiter] | None = None) -> None:
        """Forget ``waiters`` (``None``: all) and make their ``watch`` raise
        ``StoreUnavailable(message)``: the store they wait through has closed."""
        failed: dict[asyncio.AbstractEventLoop, list[asyncio.Future[int]]] = {}
        with self._lock:
            if waiters is None:
                waiters = [w for ws in self._rooms.values() for w in ws]
                self._rooms.clear()
            else:
                waiters = list(waiters)
                for waiter in waiters:
                    room = self._rooms.get(waiter.room)
                    if room is not None:
                        room.discard(waiter)
                        if not room:
                            del self._rooms[waiter.room]
            for waiter in waiters:
                failed.setdefault(waiter.loop, []).append(waiter.future)
        for loop, futures in failed.items():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_fail, futures, message)


def _fail(futures: list[asyncio.Future[int]], message: str) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(StoreUnavailable(message))


def _wake(wakes: list[tuple[asyncio.Future[int], int]]) -> None:
    for future, seq in wakes:
        if not future.done():  # timed out or cancelled meanwhile
            future.set_result(seq)
