"""Sequential specifications for the checker (see :class:`~.checker.Model`).

* :class:`RegisterModel`: one register with read, write and compare-and-set, starting
  absent (Jepsen's etcd test; one partition).
* :class:`AppendModel`: string values per key with get, put and append (the key-value
  histories in Jepsen's map syntax; partitioned by key).
* :class:`StoreModel`: agentrooms' own histories, partitioned by key, one family of
  operations per key: a record (read, put, compare-and-set by version, delete), the
  room's log (append, read_log) or the commit key (commit with a command id,
  read_commits). The recorders write these operations
  (:mod:`agentrooms.reliability.recorder`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from typing import Any

from agentrooms.reliability.history import Operation

__all__ = ["AppendModel", "RegisterModel", "StoreModel", "chain"]


class RegisterModel:
    """A single register: ``read`` (output: the value, ``None`` when absent), ``write``
    (input: the value), ``cas`` (input: ``[from, to]``; output: whether it swapped).
    An unknown read carries no information and is left out."""

    def partition(self, op: Operation) -> str:
        return "register"

    def init(self) -> Hashable:
        return None

    def prepare(self, op: Operation) -> Any:
        if op.op == "read":
            return None if op.unknown else ("r", op.output)
        if op.op == "write":
            return ("w", op.input)
        if op.op == "cas":
            a, b = op.input
            return ("c", a, b, op.output)
        raise ValueError(f"the register model has no operation {op.op!r}")

    def observes(self, p: Any) -> bool:
        return p[0] == "r" or (p[0] == "c" and p[3] is False)

    def reaches(self, p: Any) -> tuple[Hashable, ...]:
        """The value a write or a compare-and-set not known to have failed may write."""
        if p[0] == "w":
            return (p[1],)
        return (p[2],) if p[0] == "c" and p[3] is not False else ()

    def unreachable(self, state: Any, observer: Any, reached: set[Any]) -> bool:
        if observer[0] == "r":  # the value read is there, or some candidate writes it
            return state != observer[1] and observer[1] not in reached
        a = observer[1]  # a failed cas: the value differs from ``a``, or can come to
        return state == a and reached <= {a}

    def step(self, state: Any, p: Any, unknown: bool) -> tuple[Hashable, ...]:
        kind = p[0]
        if kind == "r":
            return (state,) if state == p[1] else ()
        if kind == "w":
            return (p[1],)
        _, a, b, swapped = p
        if unknown or swapped:
            return (b,) if state == a else ()
        return (state,) if state != a else ()


class AppendModel:
    """String values per key, ``""`` when never written: ``get`` (output: the value),
    ``put`` and ``append`` (input: the string to store or to add at the end)."""

    def partition(self, op: Operation) -> str:
        return op.key

    def init(self) -> Hashable:
        return ""

    def prepare(self, op: Operation) -> Any:
        if op.op == "get":
            return None if op.unknown else ("g", op.output)
        if op.op in ("put", "append"):
            return (op.op[0], op.input)
        raise ValueError(f"the append model has no operation {op.op!r}")

    def observes(self, p: Any) -> bool:
        return bool(p[0] == "g")

    def reaches(self, p: Any) -> tuple[Hashable, ...]:
        """A put's value (an append only adds to the end of whatever is there)."""
        return (p[1],) if p[0] == "p" else ()

    def unreachable(self, state: Any, observer: Any, reached: set[Any]) -> bool:
        # a value only grows at its end, from the current value or from a put's
        seen: str = observer[1]
        return not seen.startswith(state) and not any(seen.startswith(v) for v in reached)

    def step(self, state: Any, p: Any, unknown: bool) -> tuple[Hashable, ...]:
        kind, arg = p
        if kind == "g":
            return (state,) if state == arg else ()
        return (arg,) if kind == "p" else (state + arg,)


def chain(digest: bytes, item: str) -> bytes:
    """The digest of a sequence extended by ``item`` (the log's state, in constant size)."""
    return hashlib.blake2b(digest + item.encode(), digest_size=16).digest()


_ABSENT = (None, None, 0)  # a record: (value, version or None if unknown, highest version seen)
_EMPTY_LOG = (0, b"")  # the log: (events, digest of their ids in order)


class StoreModel:
    """agentrooms' store as the recorders exercise it, one key per partition.

    A record is ``(value, version, floor)``: versions are chosen by the store, so a put's
    or a successful compare-and-set's version must be above every version the key had
    (``floor``). A write whose outcome is unknown leaves the version unknown: a read or
    a failed compare-and-set may then report any version above ``floor`` (reads and
    failed compare-and-sets never change the state, which lets the checker place them
    greedily). Written values are unique, so a read names the write it saw.

    The log is its length and a digest of its event ids in order: an append must get the
    next sequence number, and a ``read_log`` must return exactly the events appended so
    far, numbered 1, 2, ... without a gap.

    The commit key holds the command ids applied, in order: a commit of a new id applies
    it (result: its position), a commit of an id already applied is a replay of the
    recorded result (``replayed`` must not be False), and ``read_commits`` returns the
    list. A new id may answer ``replayed`` True: the commit loop's retry of an attempt
    whose reply was lost finds that attempt's outcome. A surface that does not say
    whether a commit was a replay records ``replayed`` as ``None``: its position is then
    checked alone.
    """

    def partition(self, op: Operation) -> str:
        return op.key

    def init(self) -> Hashable:
        return None

    def prepare(self, op: Operation) -> Any:
        known = not op.unknown
        out = op.output or {}
        match op.op:
            case "read":
                return ("read", out["value"], out["version"]) if known else None
            case "put":
                return ("put", op.input["value"], out.get("version"))
            case "cas":
                expected, value = op.input["version"], op.input["value"]
                return ("cas", expected, value, out.get("ok"), out.get("version"))
            case "delete":
                return ("delete",)
            case "append":
                return ("append", op.input["id"], out.get("seq"))
            case "read_log":
                if not known:
                    return None
                seqs = [seq for seq, _ in out["events"]]
                digest = b""
                for _, item in out["events"]:
                    digest = chain(digest, item)
                return ("read_log", len(seqs), digest, seqs == list(range(1, len(seqs) + 1)))
            case "commit":
                if known and "error" in out:
                    return None  # gave up after conflicts only: it had no effect
                return ("commit", op.input["id"], out.get("result"), out.get("replayed"))
            case "read_commits":
                return ("read_commits", tuple(out["ids"])) if known else None
        raise ValueError(f"the store model has no operation {op.op!r}")

    def observes(self, p: Any) -> bool:
        kind = p[0]
        if kind == "cas":
            return p[3] is False
        if kind == "commit":
            return p[3] is True
        return kind in ("read", "read_log", "read_commits")

    def reaches(self, p: Any) -> tuple[Hashable, ...]:
        return ()

    def unreachable(self, state: Any, observer: Any, reached: set[Any]) -> bool:
        return False  # no cut beyond the search's own

    def step(self, state: Any, p: Any, unknown: bool) -> tuple[Hashable, ...]:
        kind = p[0]
        if kind in ("append", "read_log"):
            return _log_step(state or _EMPTY_LOG, p, unknown)
        if kind in ("commit", "read_commits"):
            return _commit_step(state or (), p, unknown)
        return _record_step(state or _ABSENT, p, unknown)


def _record_step(state: Any, p: Any, unknown: bool) -> tuple[Hashable, ...]:
    value, version, floor = state
    kind = p[0]
    if kind == "read":
        _, seen, seen_version = p
        if seen != value:
            return ()
        if value is None:
            return (state,) if seen_version is None else ()
        if version is not None:
            return (state,) if seen_version == version else ()
        return (state,) if seen_version > floor else ()
    if kind == "put":
        _, new, new_version = p
        if unknown:
            return ((new, None, floor),)
        return ((new, new_version, new_version),) if new_version > floor else ()
    if kind == "delete":
        return ((None, None, floor),)
    _, expected, new, swapped, reported = p  # cas
    if expected is None:
        matches, may_match = value is None, value is None
    else:
        matches = value is not None and version == expected
        may_match = value is not None and (matches or (version is None and expected > floor))
    if unknown:
        return ((new, None, max(floor, expected or 0)),) if may_match else ()
    if swapped:
        ok = may_match and reported > max(floor, expected or 0)
        return ((new, reported, reported),) if ok else ()
    # failed: ``reported`` is the current version (None: absent)
    if value is None:
        return (state,) if reported is None and expected is not None else ()
    if reported is None or reported == expected:
        return ()
    if version is not None:
        return (state,) if reported == version else ()
    return (state,) if reported > floor else ()


def _log_step(state: Any, p: Any, unknown: bool) -> tuple[Hashable, ...]:
    count, digest = state
    if p[0] == "append":
        _, item, seq = p
        if not unknown and seq != count + 1:
            return ()
        return ((count + 1, chain(digest, item)),)
    _, seen_count, seen_digest, gapless = p
    return (state,) if gapless and (seen_count, seen_digest) == state else ()


def _commit_step(state: Any, p: Any, unknown: bool) -> tuple[Hashable, ...]:
    if p[0] == "read_commits":
        return (state,) if p[1] == state else ()
    _, cid, result, replayed = p
    if cid in state:
        if unknown:
            return (state,)
        # a replay (``replayed`` None: the surface does not say) of the recorded position
        return (state,) if replayed is not False and result == state.index(cid) + 1 else ()
    if unknown:
        return ((*state, cid),)
    # a new id takes the next position. ``replayed`` may be True: the commit loop retries
    # an attempt whose outcome was unknown, finds that attempt's recorded outcome and
    # answers it as a replay (docs/reliability.md, "Store faults")
    return ((*state, cid),) if result == len(state) + 1 else ()
