"""The observed-remove set (add-wins), kept without tombstones.

Every ``add`` tags the element with a *dot* ``(node, n)``: the adding node's next event
number, unique because a node numbers its own events. A ``remove`` drops the dots of the
element that this replica has observed. The set also keeps a *clock* ``{node: n}``
saying which dots it has seen, so a merge can tell "removed here" from "not yet seen
here" without keeping the removed dots (the "optimised OR-Set" of Bieniusa et al.,
2012, as in Riak's ORSWOT):

* a dot both replicas hold stays;
* a dot only one holds stays iff the other replica's clock has not seen it (it is a
  new add), and goes iff it has (the other replica removed it).

So an add concurrent with a remove of the same element wins (add-wins), and a remove
only removes what its replica had observed. State grows with elements and nodes, never
with removals. A node id names one replica that evolves sequentially: never add to two
copies of a value with the same node id.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from agentrooms.crdt.codec import check_count, check_counts, check_node, expect, register
from agentrooms.errors import BadRequest
from agentrooms.store.types import JSON

__all__ = ["ORSet"]

Dot = tuple[str, int]


def _check_element(element: object) -> str:
    if not isinstance(element, str):
        raise BadRequest(f"or-set elements are strings; got {type(element).__name__}")
    return element


def _check_entries(entries: object, clock: Mapping[str, int]) -> dict[str, frozenset[Dot]]:
    if not isinstance(entries, Mapping):
        raise BadRequest("or-set entries must be an object of element -> dots")
    out: dict[str, frozenset[Dot]] = {}
    owner: dict[Dot, str] = {}
    for element, dots in entries.items():
        _check_element(element)
        if not isinstance(dots, list | tuple | set | frozenset):
            raise BadRequest(f"the dots of or-set element {element!r} must be a list")
        checked = frozenset(_check_dot(d) for d in dots)
        for dot in checked:
            if dot[1] > clock.get(dot[0], 0):
                raise BadRequest(f"or-set dot {dot} is newer than the set's clock")
            if owner.setdefault(dot, element) != element:
                raise BadRequest(f"or-set dot {dot} tags two elements")
        if checked:
            out[element] = checked
    return {e: out[e] for e in sorted(out)}


def _check_dot(dot: object) -> Dot:
    if not isinstance(dot, list | tuple) or len(dot) != 2:
        raise BadRequest(f"an or-set dot is [node, n]; got {dot!r}")
    node, n = dot
    if check_count(n, "dot number") == 0:
        raise BadRequest("dot numbers start at 1")
    return check_node(node), n


@register
@dataclass(frozen=True, slots=True)
class ORSet:
    """Add-wins observed-remove set of strings."""

    kind: ClassVar[str] = "or-set"
    clock: Mapping[str, int] = field(default_factory=dict)
    entries: Mapping[str, frozenset[Dot]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clock = check_counts(self.clock, "or-set clock")
        object.__setattr__(self, "clock", clock)
        object.__setattr__(self, "entries", _check_entries(self.entries, clock))

    @property
    def value(self) -> frozenset[str]:
        return frozenset(self.entries)

    def __contains__(self, element: object) -> bool:
        return element in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, node: str, element: str) -> ORSet:
        """Add ``element`` with a fresh dot of ``node``; its older dots (all observed
        here) are replaced, which is the same as remove-then-add."""
        n = self.clock.get(check_node(node), 0) + 1
        entries = dict(self.entries)
        entries[_check_element(element)] = frozenset({(node, n)})
        return ORSet({**self.clock, node: n}, entries)

    def remove(self, element: str) -> ORSet:
        """Remove ``element`` as observed here (a no-op if absent); a concurrent add of
        it elsewhere survives the merge."""
        if _check_element(element) not in self.entries:
            return self
        return ORSet(self.clock, {e: d for e, d in self.entries.items() if e != element})

    def merge(self, other: ORSet) -> ORSet:
        entries: dict[str, frozenset[Dot]] = {}
        for element in set(self.entries) | set(other.entries):
            mine = self.entries.get(element, frozenset())
            theirs = other.entries.get(element, frozenset())
            kept = (
                (mine & theirs)
                | {d for d in mine - theirs if d[1] > other.clock.get(d[0], 0)}
                | {d for d in theirs - mine if d[1] > self.clock.get(d[0], 0)}
            )
            if kept:
                entries[element] = frozenset(kept)
        nodes = set(self.clock) | set(other.clock)
        clock = {n: max(self.clock.get(n, 0), other.clock.get(n, 0)) for n in nodes}
        return ORSet(clock, entries)

    def to_json(self) -> JSON:
        return {
            "crdt": self.kind,
            "clock": dict(self.clock),
            "entries": {e: sorted([n, c] for n, c in d) for e, d in self.entries.items()},
        }

    @classmethod
    def from_json(cls, data: JSON) -> ORSet:
        fields = expect(data, cls.kind, ("clock", "entries"))
        entries = fields["entries"]
        if not isinstance(entries, dict) or not all(isinstance(d, list) for d in entries.values()):
            raise BadRequest("or-set entries must be an object of element -> [[node, n], ...]")
        return cls(fields["clock"], {e: frozenset(map(_check_dot, d)) for e, d in entries.items()})
