"""Named locks: a TTL, a fencing token on every grant, owner-checked release and extend,
and a FIFO line that a release hands the lock to in the same atomic write.

* :mod:`.records`: :class:`Lock`, :class:`LockInfo`, and what a lock's records hold.
* :mod:`.core`: grants, release (freeing the lock or handing it to the head of the line),
  extend.
* :mod:`.line`: finding the head of a lock's line.
* :mod:`.queue`: :class:`Locks`, with waiting in line (``wait_acquire``), ``requeue`` and
  the ``async with`` form (``hold``).
* :mod:`.knowledge`: the optional policy of what a process remembers of its locks, which
  lets common paths skip a read (:func:`knowledge_of`).

Why it is built this way: docs/why-locks.md.
"""

from agentrooms.rooms.locks.core import LockCore
from agentrooms.rooms.locks.knowledge import Knowledge, ProcessKnowledge, knowledge_of
from agentrooms.rooms.locks.queue import Locks
from agentrooms.rooms.locks.records import DEFAULT_TTL, READ, Lock, LockInfo, WaiterInfo

__all__ = [
    "DEFAULT_TTL",
    "READ",
    "Knowledge",
    "Lock",
    "LockCore",
    "LockInfo",
    "Locks",
    "ProcessKnowledge",
    "WaiterInfo",
    "knowledge_of",
]
