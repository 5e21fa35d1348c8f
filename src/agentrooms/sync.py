"""The synchronous facade: the async core, driven from blocking code.

It is derived mechanically, never written twice: each blocking method or function is
``_blocking(async_twin)``, which runs the coroutine on an event loop that the facade owns
in a background thread. A test checks that every public coroutine of :class:`Store`
has its blocking twin here, so the two cannot drift.

    with SyncStore.open("sqlite:///agentrooms.db") as store:
        store.transact("room", writes=[Put("doc", {"v": 1})])
        commit(store, "room", transition, event, keys=["doc"])
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar

from agentrooms.commit import apply_intent as _apply_intent
from agentrooms.commit import commit as _commit
from agentrooms.store import Limits, Store, open_store

__all__ = ["SyncStore", "apply_intent", "commit"]

A = TypeVar("A")
P = ParamSpec("P")
R = TypeVar("R")


class _Portal:
    """An event loop running in a daemon thread; ``run`` blocks until a coroutine ends."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="agentrooms-sync", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError("this SyncStore is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


class _Twin(Generic[A]):
    """A blocking view of the async object ``inner``, its coroutines run on ``portal``."""

    def __init__(self, inner: A, portal: _Portal) -> None:
        self.inner, self.portal = inner, portal


def _blocking(
    fn: Callable[Concatenate[A, P], Awaitable[R]],
) -> Callable[Concatenate[_Twin[A], P], R]:
    """The blocking twin of an async function or method whose first argument is an ``A``:
    called on a :class:`_Twin`, it runs ``fn(twin.inner, ...)`` on the twin's portal."""

    def call(twin: _Twin[A], /, *args: P.args, **kwargs: P.kwargs) -> R:
        async def run() -> R:
            return await fn(twin.inner, *args, **kwargs)

        return twin.portal.run(run())

    call.__name__ = getattr(fn, "__name__", "call")
    call.__doc__ = fn.__doc__
    return call


class SyncStore(_Twin[Store]):
    """A :class:`~agentrooms.store.Store` for blocking code. Thread-safe."""

    @classmethod
    def open(cls, url: str, *, limits: Limits | None = None) -> Self:
        portal = _Portal()
        try:
            return cls(portal.run(open_store(url, limits=limits)), portal)
        except BaseException:
            portal.stop()
            raise

    read = _blocking(Store.read)
    transact = _blocking(Store.transact)
    scan = _blocking(Store.scan)
    glance = _blocking(Store.glance)
    scan_rooms = _blocking(Store.scan_rooms)
    scan_keys = _blocking(Store.scan_keys)
    read_log = _blocking(Store.read_log)
    trim_log = _blocking(Store.trim_log)
    last_seq = _blocking(Store.last_seq)
    set_pick = _blocking(Store.set_pick)
    set_size = _blocking(Store.set_size)
    watch = _blocking(Store.watch)
    follow_log = _blocking(Store.follow_log)
    delete_room = _blocking(Store.delete_room)
    info = _blocking(Store.info)
    _close = _blocking(Store.close)

    @property
    def backend(self) -> str:
        return self.inner.backend

    def close(self) -> None:
        if not self.portal.loop.is_closed():
            self._close()
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


commit = _blocking(_commit)
apply_intent = _blocking(_apply_intent)
