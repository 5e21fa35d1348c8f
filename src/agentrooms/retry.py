"""Backoff between attempts of the commit loop, and the bounds that end it.

The backoffs are the ones compared in the AWS Architecture Blog's "Exponential Backoff
and Jitter": with ``exp = min(cap, base * 2**attempt)``

* ``Exponential``:  sleep ``exp`` (no jitter; contenders stay in lock-step)
* ``FullJitter``:   sleep ``uniform(0, exp)``                  (the default)
* ``EqualJitter``:  sleep ``exp/2 + uniform(0, exp/2)``
* ``Decorrelated``: sleep ``min(cap, uniform(base, previous * 3))``
* ``NoBackoff``:    retry at once (a baseline for benchmarks, not for production)

Each is a pure function of the attempt number, the previous delay and a random source,
so tests pass a seeded ``random.Random`` and check the exact delays.

Choosing ``base`` (default ``DEFAULT_BASE`` = 32 ms, cap 500 ms): the default is wide
enough for a herd of writers on one record to spread, at the cost of a longer tail for
contended commits. Where conflicts are rare and a millisecond matters, pass a smaller
base (``FullJitter(base=0.002)``), as room operations do (``rooms.scope.ROOM_POLICY``).
Writers of one process need neither: the commit loop's local turns queue them. Why:
docs/why.md ("Backoff bases").
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

from agentrooms.errors import BadRequest

__all__ = [
    "DEFAULT_BASE",
    "DEFAULT_CAP",
    "Backoff",
    "Decorrelated",
    "EqualJitter",
    "Exponential",
    "FullJitter",
    "NoBackoff",
    "RetryPolicy",
]


class Backoff(Protocol):
    def delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (``attempt`` counts from 1)."""
        ...


DEFAULT_BASE = 0.032  # seconds: the first retry's window
DEFAULT_CAP = 0.5  # seconds: no single delay is longer


def _exp(base: float, cap: float, attempt: int) -> float:
    return min(cap, base * 2.0 ** min(attempt - 1, 60))


@dataclass(frozen=True, slots=True)
class NoBackoff:
    def delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        return 0.0


@dataclass(frozen=True, slots=True)
class _Windowed:
    """A backoff whose window starts at ``base`` seconds and never exceeds ``cap``."""

    base: float = DEFAULT_BASE
    cap: float = DEFAULT_CAP

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.cap >= self.base):  # also rejects NaN
            raise BadRequest(
                f"a backoff needs 0 < base <= cap, not base={self.base!r}, cap={self.cap!r}"
            )


@dataclass(frozen=True, slots=True)
class Exponential(_Windowed):
    def delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        return _exp(self.base, self.cap, attempt)


@dataclass(frozen=True, slots=True)
class FullJitter(_Windowed):
    def delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        return rng.uniform(0, _exp(self.base, self.cap, attempt))


@dataclass(frozen=True, slots=True)
class EqualJitter(_Windowed):
    def delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        half = _exp(self.base, self.cap, attempt) / 2
        return half + rng.uniform(0, half)


@dataclass(frozen=True, slots=True)
class Decorrelated(_Windowed):
    def delay(self, attempt: int, previous: float, rng: random.Random) -> float:
        return min(self.cap, rng.uniform(self.base, max(self.base, previous) * 3))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When the commit loop gives up: after ``max_attempts`` write attempts or once
    ``budget`` seconds have passed (a delay that would overrun the budget is not taken).

    ``local_turns``: commits of one process (one store handle) on a key that conflicted
    within the last ``HOT_FOR`` seconds take turns on it locally, so they contend with
    other processes' writers, not with each other (see :mod:`agentrooms.commit`).
    """

    max_attempts: int = 12
    budget: float = 10.0
    backoff: Backoff = field(default_factory=FullJitter)
    local_turns: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise BadRequest("max_attempts must be at least 1")
        if not self.budget > 0:
            raise BadRequest("budget must be a positive number of seconds")
