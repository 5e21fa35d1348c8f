"""The JSON form every CRDT value shares, and the checks that guard it.

A CRDT value travels and is stored as one JSON object whose ``"crdt"`` field names its
kind (``"g-counter"``, ``"pn-counter"``, ``"lww-register"``, ``"or-set"``, ``"text"``);
the other fields are the kind's state. ``decode`` turns any such object back into its
value and ``merge_json`` merges two of them without the caller knowing the kind.

Every decoder validates what it is given: malformed input raises
:class:`~agentrooms.errors.BadRequest` naming what is wrong, never a half-built value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, Self, TypeVar

from agentrooms.errors import BadRequest
from agentrooms.store.types import JSON

__all__ = ["Crdt", "check_count", "check_node", "decode", "expect", "merge_json", "register"]

KIND_FIELD = "crdt"
MAX_NODE = 200


class Crdt(Protocol):
    """What every CRDT value offers: a commutative, associative, idempotent ``merge``
    and a JSON form that round-trips (``from_json(x.to_json()) == x``)."""

    kind: ClassVar[str]

    def merge(self, other: Self, /) -> Self: ...

    def to_json(self) -> JSON: ...

    @classmethod
    def from_json(cls, data: JSON, /) -> Self: ...


C = TypeVar("C", bound=Crdt)

_KINDS: dict[str, type[Crdt]] = {}


def register(cls: type[C]) -> type[C]:
    """Class decorator: make ``decode`` know the kind ``cls.kind``."""
    _KINDS[cls.kind] = cls
    return cls


def decode(data: JSON) -> Crdt:
    """The CRDT value held in ``data`` (any registered kind)."""
    if not isinstance(data, dict) or not isinstance(data.get(KIND_FIELD), str):
        raise BadRequest('a CRDT value is a JSON object with a string "crdt" field')
    cls = _KINDS.get(data[KIND_FIELD])
    if cls is None:
        raise BadRequest(f"unknown CRDT kind {data[KIND_FIELD]!r}; known: {sorted(_KINDS)}")
    return cls.from_json(data)


def merge_json(a: JSON, b: JSON) -> JSON:
    """Merge two CRDT values in JSON form; ``BadRequest`` if they are of different kinds."""
    left, right = decode(a), decode(b)
    if type(left) is not type(right):
        raise BadRequest(f"cannot merge a {left.kind} with a {right.kind}")
    return left.merge(right).to_json()


def expect(data: JSON, kind: str, fields: tuple[str, ...]) -> dict[str, Any]:
    """``data`` as a dict of kind ``kind`` with exactly ``fields`` besides ``"crdt"``."""
    if not isinstance(data, dict):
        raise BadRequest(f"a {kind} must be a JSON object, not {type(data).__name__}")
    if data.get(KIND_FIELD) != kind:
        raise BadRequest(f"expected a {kind}, found crdt={data.get(KIND_FIELD)!r}")
    extra = set(data) - {KIND_FIELD, *fields}
    missing = set(fields) - set(data)
    if extra or missing:
        raise BadRequest(f"a {kind} has fields {sorted(fields)}; got {sorted(set(data))}")
    return data


def check_node(node: object) -> str:
    """Node (replica) ids: non-empty strings of at most 200 characters, no control
    characters. A node id names ONE replica that evolves sequentially."""
    if not isinstance(node, str) or not 0 < len(node) <= MAX_NODE:
        raise BadRequest(f"a node id must be a string of 1-{MAX_NODE} characters; got {node!r}")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in node):
        raise BadRequest(f"node id {node!r} contains a control character")
    return node


def check_count(value: object, what: str) -> int:
    """A non-negative integer (``bool`` is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{what} must be a non-negative integer; got {value!r}")
    return value


def check_counts(data: object, what: str) -> dict[str, int]:
    """A ``{node: count}`` object, validated, without zero entries, sorted by node."""
    if not isinstance(data, Mapping):
        raise BadRequest(f"{what} must be an object of node -> count")
    out = {check_node(n): check_count(c, f"{what}[{n!r}]") for n, c in data.items()}
    return {n: out[n] for n in sorted(out) if out[n]}
