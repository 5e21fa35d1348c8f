"""What this process knows about a store: one :class:`Session` per store handle.

Nothing here is a source of truth. It is what lets common paths skip a read or a
collision, and every write that relies on it still compares the versions it assumed, so
a session that knows nothing (a new handle, a new process) changes costs, never results.

A handle's session (``store.session``, made on first use) holds:

* ``turns``: per event loop, the keys that conflicted lately and the local FIFO turns on
  them (:mod:`agentrooms.commit`);
* ``locks``: what the process last learned of each lock (:mod:`agentrooms.rooms.locks`);
* ``heads``: per aggregate, the streams this process appended to last and the versions it
  wrote them at (:mod:`agentrooms.sourcing.aggregates`);
* ``shared``: what every handle of the same :attr:`~agentrooms.store.base.Store.identity`
  shares (they reach the same data): the one follower of each room's log per event loop
  (:mod:`agentrooms.rooms.follow`), the queue entries of this process's lock waiters, and
  the last depth read of each writer queue (:mod:`agentrooms.writer`).

It also holds ``groups``: per writer queue and event loop, the submissions made through
this handle in the current step of the loop, to be sent in one transact
(:mod:`agentrooms.writer.groups`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from agentrooms.turns import Turns

if TYPE_CHECKING:
    from agentrooms.rooms.follow import Follower
    from agentrooms.rooms.locks.knowledge import ProcessKnowledge
    from agentrooms.sourcing.fold import Aggregate
    from agentrooms.store.base import Store

__all__ = ["Session", "Shared"]


class Shared:
    """What the handles of one store identity share in this process."""

    __slots__ = ("__weakref__", "depths", "entries", "followers")

    def __init__(self) -> None:
        self.followers: dict[tuple[str, asyncio.AbstractEventLoop], Follower] = {}
        """(room, event loop) -> its follower, while it has subscriptions."""
        self.entries: dict[tuple[str, str, str], dict[str, Any]] = {}
        """(room, lock, waiter) -> the queue entry of a waiter of this process in line."""
        self.depths: dict[tuple[str, str], tuple[int, float]] = {}
        """(room, writer queue) -> its last depth read in this process, and when (monotonic)."""


_shared: weakref.WeakValueDictionary[Hashable, Shared] = weakref.WeakValueDictionary()
"""Identity -> its shared part, for identities other than a handle itself (URLs, files):
alive while a session of that identity is."""


class Session:
    """What this process knows about the data one store handle reaches (see the module)."""

    __slots__ = ("_heads", "_locks", "_turns", "groups", "shared")

    def __init__(self, store: Store) -> None:
        identity = store.identity
        if identity is store:
            self.shared = Shared()  # only this handle reaches its data
        else:
            shared = _shared.get(identity)
            if shared is None:
                shared = _shared[identity] = Shared()
            self.shared = shared
        self._turns: dict[asyncio.AbstractEventLoop, Turns] = {}
        self._locks: ProcessKnowledge | None = None
        self._heads: dict[int, tuple[Aggregate[Any], OrderedDict[Any, Any]]] = {}
        self.groups: dict[tuple[str, str, asyncio.AbstractEventLoop], Any] = {}

    def turns(self) -> Turns:
        """The running event loop's hot keys and turns."""
        loop = asyncio.get_running_loop()
        turns = self._turns.get(loop)
        if turns is None:
            turns = self._turns[loop] = Turns()
        return turns

    @property
    def locks(self) -> ProcessKnowledge:
        """What this process knows of the locks reached through this handle."""
        if self._locks is None:
            from agentrooms.rooms.locks.knowledge import ProcessKnowledge

            self._locks = ProcessKnowledge(self.shared.entries)
        return self._locks

    def heads(self, aggregate: Aggregate[Any]) -> OrderedDict[Any, Any]:
        """The streams of ``aggregate`` this process appended to last (least recently
        first): what :class:`~agentrooms.sourcing.Aggregates` remembers of them. One table
        per definition object (held here, so its ``id`` is not reused)."""
        found = self._heads.get(id(aggregate))
        if found is None:
            found = self._heads[id(aggregate)] = (aggregate, OrderedDict())
        return found[1]
