"""CRDT values that agents update without coordination and merge without conflict.

=================  ==========================================================
kind               value
=================  ==========================================================
``GCounter``       grow-only counter (one slot per node, merged by maximum)
``PNCounter``      counter with increments and decrements
``LWWRegister``    last-writer-wins value, ordered by a hybrid logical clock
``ORSet``          add-wins observed-remove set of strings, without tombstones
``Text``           collaborative text (Yjs through ``pycrdt``)
=================  ==========================================================

Merges are pure functions of immutable values (no IO), commutative, associative and
idempotent; each value has a JSON form (``to_json`` / ``from_json``, and ``decode`` /
``merge_json`` for any kind). In a room each replica writes only its own record
(``push``), a read merges them (``load``), ``sync`` does both, and ``compact`` folds
replica records into the value's base record: no write is ever rejected
(:mod:`agentrooms.crdt.sync`).

Node ids: every update names the node (replica) making it, and a node id must name ONE
replica that evolves sequentially. Never update two copies of one value under the same
node id, and never restart a node from an empty value: a process either uses a fresh
node id (``uuid4().hex``) or starts from the room's copy (``load``, or ``sync`` of an
empty value) so its own earlier updates are already in its replica. The replica id a
value is pushed under is the node id its updates are made with.
"""

from agentrooms.crdt.codec import Crdt, decode, merge_json
from agentrooms.crdt.counters import GCounter, PNCounter
from agentrooms.crdt.hlc import HybridClock, Timestamp
from agentrooms.crdt.registers import LWWRegister
from agentrooms.crdt.sets import ORSet
from agentrooms.crdt.sync import (
    COMPACT_ABOVE,
    SYNC_POLICY,
    compact,
    load,
    push,
    replica_key,
    sync,
)
from agentrooms.crdt.text import Editor, Text

__all__ = [
    "COMPACT_ABOVE",
    "SYNC_POLICY",
    "Crdt",
    "Editor",
    "GCounter",
    "HybridClock",
    "LWWRegister",
    "ORSet",
    "PNCounter",
    "Text",
    "Timestamp",
    "compact",
    "decode",
    "load",
    "merge_json",
    "push",
    "replica_key",
    "sync",
]
