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
``merge_json`` for any kind). ``sync`` merges a local replica with a room's copy through
the commit loop and is never rejected for contention.

Node ids: every update names the node (replica) making it, and a node id must name ONE
replica that evolves sequentially. Never update two copies of one value under the same
node id, and never restart a node from an empty value: a process either uses a fresh
node id (``uuid4().hex``) or starts from the room's copy (``load``, or ``sync`` of an
empty value) so its own earlier updates are already in its replica.
"""

from agentrooms.crdt.codec import Crdt, decode, merge_json
from agentrooms.crdt.counters import GCounter, PNCounter
from agentrooms.crdt.hlc import HybridClock, Timestamp
from agentrooms.crdt.registers import LWWRegister
from agentrooms.crdt.sets import ORSet
from agentrooms.crdt.sync import SYNC_POLICY, load, sync
from agentrooms.crdt.text import Editor, Text

__all__ = [
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
    "decode",
    "load",
    "merge_json",
    "sync",
]
