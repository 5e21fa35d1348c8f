"""What a transition sees and returns: a tracked :class:`View` of a snapshot, and the
:class:`Change` it proposes. Pure: the commit loop (:mod:`agentrooms.commit`) does the IO.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from agentrooms.store.types import JSON, Append, Compare, Record, Snapshot, Write

__all__ = ["Change", "Transition", "Unread", "View"]

E = TypeVar("E")


class Unread(Exception):
    """The transition asked for keys outside the read set: re-read with them."""

    def __init__(self, *keys: str) -> None:
        self.keys = keys


class View:
    """What a transition sees: the snapshot's records, each access tracked.

    Reading a key that was not in the declared read set is allowed: the loop re-reads
    with that key added and runs the transition again (its versions are then compared
    like all the others), so a transition never decides on an unversioned value.
    """

    __slots__ = ("_keys", "_snapshot")

    def __init__(self, snapshot: Snapshot, keys: Iterable[str]) -> None:
        self._snapshot = snapshot
        self._keys = frozenset(keys)

    @property
    def now(self) -> float:
        """The store's clock when the snapshot was read."""
        return self._snapshot.now

    def record(self, key: str) -> Record | None:
        if key not in self._keys:
            raise Unread(key)
        return self._snapshot.get(key)

    def need(self, keys: Iterable[str]) -> None:
        """Declare keys about to be read: any outside the read set are read together, in
        one re-read (where reading them one by one would cost a re-read each)."""
        missing = [k for k in dict.fromkeys(keys) if k not in self._keys]
        if missing:
            raise Unread(*missing)

    def get(self, key: str, default: JSON = None) -> JSON:
        record = self.record(key)
        return default if record is None else record.value

    def version(self, key: str) -> int | None:
        record = self.record(key)
        return None if record is None else record.version

    def exists(self, key: str) -> bool:
        return self.record(key) is not None


@dataclass(frozen=True, slots=True)
class Change:
    """A transition's candidate: what to write and append if the snapshot still holds.

    ``requires`` adds compares beyond the automatic ones on every key read (for example
    ``FenceAtMost`` on a task's lease); ``result`` is the command's outcome, returned to
    the caller and, with a command id, recorded for retries.
    """

    writes: Sequence[Write] = ()
    appends: Sequence[Append] = ()
    requires: Sequence[Compare] = ()
    result: JSON = None


Transition = Callable[[View, E], Change]
