"""What a process knows of its locks: an optional policy that lets common paths skip a read.

The lock operations ask a :class:`Knowledge` for guesses (is the lock free, at which
fencing token; when does the holder's lease run out; who is next in line) and tell it what
they learn. A guess only picks which write to try first: a wrong one fails that write's
compare and costs one write more, never a wrong grant. The base class knows nothing (every
operation then reads what it needs); :class:`ProcessKnowledge` remembers, one per store
handle, in its session (:func:`knowledge_of`). Why: docs/why-locks.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agentrooms.store.base import Store, seen

if TYPE_CHECKING:
    from agentrooms.rooms.locks.line import Line
    from agentrooms.rooms.locks.records import Lock

SEEN = 4096  # locks per store handle whose state a process remembers


class Knowledge:
    """Knows nothing: every answer is "unknown", and what it is told is dropped."""

    def free_at(self, room: str, name: str) -> int | None:
        """The newest fencing token of a lock believed free (``None``: not believed free)."""
        return None

    def believes_held(self, room: str, name: str) -> bool:
        return False

    def holder_until(self, room: str, name: str) -> float | None:
        """The local monotonic time a lock believed held runs out (``None``: unknown)."""
        return None

    def mark_of(self, lock: Lock) -> int | None:
        """For ``lock``, a grant of ours of the free lock: the version that grant gave
        ``lockline/<name>`` (while it is unchanged, nobody has joined the line since)."""
        return None

    def ahead_of(self, lock: Lock) -> asyncio.Task[Line] | None:
        """For ``lock``, a grant of ours from the line: the lookup of the next in line
        started when it was handed over."""
        return None

    def entry_of(self, room: str, name: str, waiter: str) -> dict[str, Any] | None:
        """The queue entry (with its ticket) of a waiter of this process, while in line."""
        return None

    def granted(self, lock: Lock, until: float | None, mark: int | None) -> None:
        """We took ``lock`` free; it runs out at local time ``until``."""

    def handed(self, lock: Lock, look_ahead: Callable[[], Coroutine[Any, Any, Line]]) -> None:
        """``lock`` was handed to us from the line; ``look_ahead`` finds the next in line."""

    def found_held(self, room: str, name: str, fence: int, until: float | None) -> None:
        """A read found the lock held, the newest token ``fence``, running out at ``until``."""

    def released(self, lock: Lock, next_ttl: float | None) -> None:
        """We released ``lock``: freed (``next_ttl`` None) or handed on for ``next_ttl``."""

    def extended(self, lock: Lock, until: float) -> None:
        """We extended ``lock`` to local time ``until``."""

    @contextlib.contextmanager
    def waiting(self, room: str, name: str, waiter: str, entry: dict[str, Any]) -> Iterator[None]:
        """A waiter of this process is in line with ``entry`` for the duration."""
        yield


@dataclass(frozen=True, slots=True)
class _Belief:
    held: bool
    fence: int  # the newest fencing token seen
    until: float | None = None  # local monotonic time the holder's lease runs out, if known
    line: asyncio.Task[Line] | None = None  # see Knowledge.ahead_of
    mark: int | None = None  # see Knowledge.mark_of


class ProcessKnowledge(Knowledge):
    """Remembers the last thing learned of up to :data:`SEEN` locks (the least recently
    learned is forgotten first), and the entries of this process's waiters in ``entries``
    (by room, lock and waiter: shared by the handles that reach the same data)."""

    def __init__(self, entries: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        self._entries = entries
        self._beliefs: dict[tuple[str, str], _Belief] = {}

    def known(self) -> list[tuple[str, str]]:
        """The (room, lock) pairs remembered, least recently learned first."""
        return list(self._beliefs)

    def _get(self, room: str, name: str) -> _Belief | None:
        return self._beliefs.get((room, name))

    def _of(self, lock: Lock) -> _Belief | None:
        belief = self._get(lock.room, lock.name)
        return belief if belief is not None and belief.fence == lock.fence else None

    def _set(self, room: str, name: str, belief: _Belief) -> None:
        self._beliefs.pop((room, name), None)  # newest last
        self._beliefs[(room, name)] = belief
        while len(self._beliefs) > SEEN:
            del self._beliefs[next(iter(self._beliefs))]

    def free_at(self, room: str, name: str) -> int | None:
        belief = self._get(room, name)
        return None if belief is None or belief.held else belief.fence

    def believes_held(self, room: str, name: str) -> bool:
        belief = self._get(room, name)
        return belief is not None and belief.held

    def holder_until(self, room: str, name: str) -> float | None:
        belief = self._get(room, name)
        return None if belief is None or not belief.held else belief.until

    def mark_of(self, lock: Lock) -> int | None:
        belief = self._of(lock)
        return None if belief is None else belief.mark

    def ahead_of(self, lock: Lock) -> asyncio.Task[Line] | None:
        belief = self._of(lock)
        return None if belief is None else belief.line

    def entry_of(self, room: str, name: str, waiter: str) -> dict[str, Any] | None:
        return self._entries.get((room, name, waiter))

    def granted(self, lock: Lock, until: float | None, mark: int | None) -> None:
        self._set(lock.room, lock.name, _Belief(True, lock.fence, until, mark=mark))

    def handed(self, lock: Lock, look_ahead: Callable[[], Coroutine[Any, Any, Line]]) -> None:
        task: asyncio.Task[Line] = asyncio.get_running_loop().create_task(look_ahead())
        task.add_done_callback(seen)  # a failure costs the release one scan
        until = time.monotonic() + lock.ttl
        self._set(lock.room, lock.name, _Belief(True, lock.fence, until, line=task))

    def found_held(self, room: str, name: str, fence: int, until: float | None) -> None:
        self._set(room, name, _Belief(True, fence, until))

    def released(self, lock: Lock, next_ttl: float | None) -> None:
        if next_ttl is None:
            self._set(lock.room, lock.name, _Belief(False, lock.fence))
        else:
            until = time.monotonic() + next_ttl
            self._set(lock.room, lock.name, _Belief(True, lock.fence + 1, until))

    def extended(self, lock: Lock, until: float) -> None:
        belief = self._of(lock)  # keep what the release will use
        if belief is not None:
            self._set(lock.room, lock.name, replace(belief, held=True, until=until))
        else:
            self._set(lock.room, lock.name, _Belief(True, lock.fence, until))

    @contextlib.contextmanager
    def waiting(self, room: str, name: str, waiter: str, entry: dict[str, Any]) -> Iterator[None]:
        key, entries = (room, name, waiter), self._entries
        entries[key] = entry
        try:
            yield
        finally:
            if entries.get(key) is entry:
                del entries[key]


def knowledge_of(store: Store) -> ProcessKnowledge:
    """This process's knowledge of the locks reached through ``store`` (one per handle,
    kept in its :attr:`~agentrooms.store.base.Store.session`)."""
    return store.session.locks
