"""One worker (thread + connection) per database file per process, shared by its stores.

Several :class:`~agentrooms.store.sqlite.backend.SqliteStore` objects opened in one
process on the same file and settings use one :class:`~.worker.Worker`: their writes
join one batch and one commit instead of taking turns at SQLite's file lock (whose busy
handler sleeps in steps of milliseconds). The worker stops when its last store closes
(or is garbage-collected). An in-memory database is private to its store, never shared.
After a fork the child forgets the parent's workers: their threads did not survive.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from agentrooms.store.sqlite.worker import Worker


@dataclass(slots=True)
class _Entry:
    worker: Worker
    stores: int = 0


class Pool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry] = {}
        self._all: weakref.WeakSet[Worker] = weakref.WeakSet()

    def acquire(self, key: Hashable | None, start: Callable[[], Worker]) -> Worker:
        """The running worker for ``key`` (``None``: a private one), started if needed."""
        with self._lock:
            entry = None if key is None else self._entries.get(key)
            if entry is None:
                entry = _Entry(start())
                self._all.add(entry.worker)
                if key is not None:
                    self._entries[key] = entry
            entry.stores += 1
            return entry.worker

    def release(self, key: Hashable | None, worker: Worker) -> bool:
        """One store of ``worker`` is done; ``True`` when it was the last (the caller then
        stops the worker, which no later :meth:`acquire` returns)."""
        with self._lock:
            entry = None if key is None else self._entries.get(key)
            if entry is None or entry.worker is not worker:
                return True  # a private worker, or one already forgotten
            entry.stores -= 1
            if entry.stores > 0:
                return False
            del self._entries[key]
            return True

    def release_nowait(self, key: Hashable | None, worker: Worker) -> None:
        """:meth:`release`, stopping the worker without waiting (for finalizers)."""
        if self.release(key, worker):
            worker.stop_nowait()

    def forget_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._entries.clear()
        for worker in list(self._all):
            worker.orphan()


POOL = Pool()
os.register_at_fork(after_in_child=POOL.forget_after_fork)
