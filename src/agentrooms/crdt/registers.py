"""The last-writer-wins register, ordered by hybrid logical clock stamps.

A register holds one JSON value and the :class:`~agentrooms.crdt.hlc.Timestamp` of the
write that set it. A merge keeps the value with the greater stamp. Because stamps come
from a hybrid logical clock that has observed the register's current stamp, a write made
after reading the register always wins over what it read, whatever the wall clocks say;
only truly concurrent writes are decided by the clock, then by node id.

Equal stamps with different values can only come from misuse (one node id used by two
replicas); the merge still picks one deterministically (by the value's canonical JSON),
so it stays commutative, associative and idempotent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from agentrooms.crdt.codec import expect, register
from agentrooms.crdt.hlc import HybridClock, Timestamp
from agentrooms.errors import BadRequest
from agentrooms.store.types import JSON

__all__ = ["LWWRegister"]


def _canonical(value: JSON) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"a register value must be JSON: {exc}") from exc


@register
@dataclass(frozen=True, slots=True)
class LWWRegister:
    """Last-writer-wins register. An unset register has ``stamp`` None and loses to any
    write."""

    kind: ClassVar[str] = "lww-register"
    value: JSON = None
    stamp: Timestamp | None = None

    def __post_init__(self) -> None:
        _canonical(self.value)
        if self.stamp is None and self.value is not None:
            raise BadRequest("an unset register (no stamp) holds no value")
        if self.stamp is not None and not isinstance(self.stamp, Timestamp):
            raise BadRequest("a register's stamp must be a Timestamp")

    def set(self, value: JSON, clock: HybridClock) -> LWWRegister:
        """Write ``value`` stamped by ``clock`` after it observed the current stamp, so
        the write orders after the value it replaces."""
        clock.observe(self.stamp)
        return LWWRegister(value, clock.now())

    def merge(self, other: LWWRegister) -> LWWRegister:
        if other.stamp is None:
            return self
        if self.stamp is None:
            return other
        if self.stamp != other.stamp:
            return self if self.stamp > other.stamp else other
        return self if _canonical(self.value) >= _canonical(other.value) else other

    def to_json(self) -> JSON:
        stamp = None if self.stamp is None else self.stamp.to_json()
        return {"crdt": self.kind, "value": self.value, "stamp": stamp}

    @classmethod
    def from_json(cls, data: JSON) -> LWWRegister:
        fields = expect(data, cls.kind, ("value", "stamp"))
        stamp = None if fields["stamp"] is None else Timestamp.from_json(fields["stamp"])
        return cls(fields["value"], stamp)
