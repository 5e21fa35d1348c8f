"""Counters that merge without conflict: the G-Counter and the PN-Counter.

A G-Counter keeps one slot per node; a node only ever raises its own slot, and a merge
takes the slot-wise maximum. Its value is the sum of the slots, so no
increment is lost and none is counted twice however replicas are merged. A PN-Counter is
two G-Counters, one for increments and one for decrements.

Every operation returns a new value (values are immutable); a node id names one replica
that evolves sequentially: never update two copies of a value with the same node id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from agentrooms.crdt.codec import check_counts, check_node, expect, register
from agentrooms.errors import BadRequest
from agentrooms.store.types import JSON

__all__ = ["GCounter", "PNCounter"]


def _amount(by: object) -> int:
    if isinstance(by, bool) or not isinstance(by, int):
        raise BadRequest(f"an increment must be an integer; got {by!r}")
    return by


@register
@dataclass(frozen=True, slots=True)
class GCounter:
    """Grow-only counter: ``{node: count}``, merged by slot-wise maximum."""

    kind: ClassVar[str] = "g-counter"
    counts: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", check_counts(self.counts, "g-counter counts"))

    @property
    def value(self) -> int:
        return sum(self.counts.values())

    def increment(self, node: str, by: int = 1) -> GCounter:
        """Add ``by`` (>= 0) to ``node``'s slot."""
        by = _amount(by)
        if by < 0:
            raise BadRequest("a g-counter only grows; use a pn-counter to decrement")
        counts = dict(self.counts)
        counts[check_node(node)] = counts.get(node, 0) + by
        return GCounter(counts)

    def merge(self, other: GCounter) -> GCounter:
        nodes = set(self.counts) | set(other.counts)
        return GCounter({n: max(self.counts.get(n, 0), other.counts.get(n, 0)) for n in nodes})

    def to_json(self) -> JSON:
        return {"crdt": self.kind, "counts": dict(self.counts)}

    @classmethod
    def from_json(cls, data: JSON) -> GCounter:
        return cls(expect(data, cls.kind, ("counts",))["counts"])


@register
@dataclass(frozen=True, slots=True)
class PNCounter:
    """Counter that goes both ways: increments and decrements in two G-Counters."""

    kind: ClassVar[str] = "pn-counter"
    p: GCounter = field(default_factory=GCounter)
    n: GCounter = field(default_factory=GCounter)

    @property
    def value(self) -> int:
        return self.p.value - self.n.value

    def increment(self, node: str, by: int = 1) -> PNCounter:
        """Add ``by`` (any integer; a negative one decrements)."""
        by = _amount(by)
        if by >= 0:
            return PNCounter(self.p.increment(node, by), self.n)
        return PNCounter(self.p, self.n.increment(node, -by))

    def decrement(self, node: str, by: int = 1) -> PNCounter:
        return self.increment(node, -_amount(by))

    def merge(self, other: PNCounter) -> PNCounter:
        return PNCounter(self.p.merge(other.p), self.n.merge(other.n))

    def to_json(self) -> JSON:
        return {"crdt": self.kind, "p": dict(self.p.counts), "n": dict(self.n.counts)}

    @classmethod
    def from_json(cls, data: JSON) -> PNCounter:
        fields = expect(data, cls.kind, ("p", "n"))
        return cls(GCounter(fields["p"]), GCounter(fields["n"]))
