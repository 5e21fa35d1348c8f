"""A hybrid logical clock (Kulkarni et al., 2014): timestamps that order events causally
and stay close to physical time, for the LWW-Register.

A :class:`Timestamp` is ``(ms, counter, node)``, compared in that order:

* ``ms`` follows the physical clock (milliseconds since the epoch) but never goes back;
* ``counter`` orders events within one ``ms`` (and while the physical clock lags behind a
  time already seen from another node);
* ``node`` breaks the remaining ties, so two distinct nodes never produce equal stamps.

Guarantees of :class:`HybridClock`: each ``now()`` is strictly greater than every stamp
the clock returned or ``observe``-d before. So a write made after seeing another write
always orders after it, even when this node's wall clock is behind the other's (the
wall clock alone cannot promise that). The physical clock is injected so tests control
it; the pure functions ``tick`` and ``observe`` hold the whole rule.

A stamp from a node whose clock runs far ahead is observed like any other (a sync must
never be rejected); later local stamps then count on from it, so LWW order stays
causal, at the price of stamps that run ahead of this node's wall clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agentrooms.crdt.codec import check_count, check_node
from agentrooms.errors import BadRequest
from agentrooms.store.types import JSON

__all__ = ["HybridClock", "Timestamp", "observe", "tick", "wall_ms"]


@dataclass(frozen=True, slots=True, order=True)
class Timestamp:
    ms: int
    counter: int
    node: str

    def __post_init__(self) -> None:
        check_count(self.ms, "timestamp ms")
        check_count(self.counter, "timestamp counter")
        check_node(self.node)

    def to_json(self) -> JSON:
        return [self.ms, self.counter, self.node]

    @classmethod
    def from_json(cls, data: JSON) -> Timestamp:
        if not isinstance(data, list) or len(data) != 3:
            raise BadRequest("a timestamp is [ms, counter, node]")
        return cls(data[0], data[1], data[2])


def wall_ms() -> int:
    """The physical clock: milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def tick(last: tuple[int, int], physical_ms: int) -> tuple[int, int]:
    """The ``(ms, counter)`` of a new local event after ``last``: strictly greater."""
    ms, counter = last
    if physical_ms > ms:
        return physical_ms, 0
    return ms, counter + 1


def observe(last: tuple[int, int], remote: Timestamp | None) -> tuple[int, int]:
    """``last`` moved up to ``remote`` (never down), so the next ``tick`` is after it."""
    if remote is None:
        return last
    return max(last, (remote.ms, remote.counter))


class HybridClock:
    """One node's hybrid logical clock. Not shared between nodes: each replica has its
    own, named by the node id it stamps."""

    def __init__(self, node: str, physical: Callable[[], int] = wall_ms) -> None:
        self.node = check_node(node)
        self._physical = physical
        self._last = (0, 0)

    def now(self) -> Timestamp:
        """A stamp for a new event: after everything returned or observed so far."""
        self._last = tick(self._last, self._physical())
        return Timestamp(self._last[0], self._last[1], self.node)

    def observe(self, remote: Timestamp | None) -> None:
        """Take a stamp seen from another node into account (receive event)."""
        self._last = observe(self._last, remote)

    @property
    def last(self) -> tuple[int, int]:
        return self._last
