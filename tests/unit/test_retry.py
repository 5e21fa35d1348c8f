"""Backoff formulas, checked exactly with a seeded random source."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentrooms.errors import BadRequest
from agentrooms.retry import (
    DEFAULT_BASE,
    DEFAULT_CAP,
    Decorrelated,
    EqualJitter,
    Exponential,
    FullJitter,
    NoBackoff,
    RetryPolicy,
)


def test_exponential_doubles_up_to_the_cap() -> None:
    b = Exponential(base=0.01, cap=0.1)
    assert [b.delay(n, 0, random.Random()) for n in range(1, 7)] == [
        0.01,
        0.02,
        0.04,
        0.08,
        0.1,
        0.1,
    ]
    assert b.delay(10_000, 0, random.Random()) == 0.1  # no overflow


def test_full_jitter_is_uniform_below_the_exponential() -> None:
    rng = random.Random(1)
    b = FullJitter(base=0.01, cap=1.0)
    draws = [b.delay(4, 0, rng) for _ in range(2000)]
    assert all(0 <= d <= 0.08 for d in draws)
    assert 0.035 < sum(draws) / len(draws) < 0.045  # mean of U(0, 0.08)
    assert FullJitter(0.01, 1.0).delay(4, 0, random.Random(5)) == random.Random(5).uniform(0, 0.08)


def test_equal_jitter_keeps_half() -> None:
    rng = random.Random(2)
    draws = [EqualJitter(base=0.01, cap=1.0).delay(3, 0, rng) for _ in range(500)]
    assert all(0.02 <= d <= 0.04 for d in draws)


def test_decorrelated_grows_from_the_previous_delay_and_is_capped() -> None:
    rng = random.Random(3)
    b = Decorrelated(base=0.01, cap=0.5)
    previous = 0.0
    for n in range(1, 50):
        d = b.delay(n, previous, rng)
        assert 0.01 <= d <= min(0.5, max(0.01, previous) * 3)
        previous = d


def test_no_backoff() -> None:
    assert NoBackoff().delay(5, 1.0, random.Random()) == 0.0


@pytest.mark.parametrize("kind", [Exponential, FullJitter, EqualJitter, Decorrelated])
@pytest.mark.parametrize(
    ("base", "cap"),
    [(0.0, 1.0), (-0.01, 1.0), (0.1, 0.05), (float("nan"), 1.0), (0.01, float("nan"))],
)
def test_backoff_rejects_a_base_it_cannot_double(kind: type, base: float, cap: float) -> None:
    with pytest.raises(BadRequest, match="0 < base <= cap"):
        kind(base=base, cap=cap)


def test_default_backoff_is_full_jitter_from_the_documented_base() -> None:
    backoff = RetryPolicy().backoff
    assert backoff == FullJitter(DEFAULT_BASE, DEFAULT_CAP)
    assert (DEFAULT_BASE, DEFAULT_CAP) == (0.032, 0.5)  # BENCHMARKS.md section 2 measures these


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"budget": 0}, {"budget": -1}])
def test_policy_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(BadRequest):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


async def test_room_operations_keep_their_2ms_base_unless_the_room_has_a_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Room operations are settled by their re-read (rooms/scope.py), so they do not take
    the commit loop's herd-sized default; a policy given to the rooms wins."""
    from agentrooms.commit import commit as real
    from agentrooms.rooms import Rooms
    from agentrooms.rooms import scope as scope_module
    from agentrooms.store import open_store

    used: list[RetryPolicy] = []

    async def spy(*args: Any, **kwargs: Any) -> Any:
        used.append(kwargs["options"].policy)
        return await real(*args, **kwargs)

    monkeypatch.setattr(scope_module, "commit", spy)
    store = await open_store("memory://")
    try:
        room = await Rooms(store).create("r")
        used.clear()
        await room.locks.try_acquire("l", "a")
        mine = RetryPolicy(max_attempts=3)
        await Rooms(store, policy=mine).room("r").locks.try_acquire("m", "b")
    finally:
        await store.close()
    assert used == [scope_module.ROOM_POLICY, mine]
    assert scope_module.ROOM_POLICY.backoff == FullJitter(base=0.002)
