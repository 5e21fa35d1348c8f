"""The outbox's transitions are pure: checked on hand-built snapshots, no store."""

from __future__ import annotations

from typing import Any

import pytest

from agentrooms.commit import Change, View
from agentrooms.effects import (
    CLAIMED,
    DEAD_SET,
    FAILED,
    INFLIGHT_SET,
    PENDING,
    PENDING_SET,
    SUCCEEDED,
    UNKNOWN,
    Effect,
    EffectRequest,
    Outcome,
    compensation_id,
    effect_key,
    request_effects,
)
from agentrooms.effects import transitions as t
from agentrooms.errors import BadRequest, IdempotencyMismatch, StaleFence
from agentrooms.store.types import FenceAtMost, Put, Record, SetAdd, SetRemove, Snapshot

NOW = 1000.0


def view(*effects: Effect, now: float = NOW, extra: tuple[str, ...] = ()) -> View:
    records = {e.key: Record(e.key, e.to_value(), 7) for e in effects}
    return View(Snapshot(records, now), [*records, *extra])


def pending(**changes: Any) -> Effect:
    return (
        EffectRequest("op", "mail", {"to": "a"}, max_attempts=2).record(NOW - 5).replace(**changes)
    )


def put_value(change: Change) -> Effect:
    (put,) = [w for w in change.writes if isinstance(w, Put)]
    return Effect.from_value(put.value, 0)


def claimed(fence: int = 1, attempts: int = 1, lease: float = NOW + 30) -> Effect:
    return pending().replace(
        status=CLAIMED, fence=fence, attempts=attempts, holder="w", lease_expires=lease
    )


def test_claim_takes_a_due_pending_effect_with_a_new_fence() -> None:
    change = t.claim(view(pending(fence=3)), "op", "w", 10.0)
    after = put_value(change)
    assert (after.status, after.fence, after.attempts, after.holder) == (CLAIMED, 4, 1, "w")
    assert after.lease_expires == NOW + 10
    assert SetRemove(PENDING_SET, "op") in change.writes
    assert SetAdd(INFLIGHT_SET, "op") in change.writes
    assert [a.type for a in change.appends] == ["effect.claimed"]


def test_claim_skips_what_is_not_due_and_repairs_strays() -> None:
    with pytest.raises(t.Skip):
        t.claim(view(pending(not_before=NOW + 1)), "op", "w", 10.0)
    repair = t.claim(view(claimed()), "op", "w", 10.0)
    assert list(repair.writes) == [SetRemove(PENDING_SET, "op")] and repair.result is None
    missing = t.claim(view(extra=(effect_key("op"),)), "op", "w", 10.0)
    assert list(missing.writes) == [SetRemove(PENDING_SET, "op")]


def test_a_holder_records_under_its_fence_and_only_once() -> None:
    mine = claimed(fence=4)
    change = t.succeed(view(mine), mine, {"id": 1})
    done = put_value(change)
    assert (done.status, done.result, done.fence) == (SUCCEEDED, {"id": 1}, 4)
    assert FenceAtMost(mine.key, 4) in change.requires
    replay = t.succeed(view(done), mine, {"id": 1})  # a retry after a lost response
    assert not replay.writes and replay.result == done.to_value()


def test_a_taken_over_holder_gets_stale_fence() -> None:
    mine = claimed(fence=4)
    with pytest.raises(StaleFence) as caught:
        t.succeed(view(mine.replace(fence=5, status=UNKNOWN)), mine, None)
    assert (caught.value.fence, caught.value.current) == (4, 5)


def test_failures_retry_until_the_attempt_limit() -> None:
    first = claimed(attempts=1)
    again = t.fail(view(first), first, {"e": 1}, permanent=False, retry_in=2.0)
    assert put_value(again).status == PENDING and put_value(again).not_before == NOW + 2
    assert SetAdd(PENDING_SET, "op") in again.writes
    last = claimed(attempts=2)
    dead = t.fail(view(last), last, {"e": 2}, permanent=False, retry_in=2.0)
    assert put_value(dead).status == FAILED and SetAdd(DEAD_SET, "op") in dead.writes
    refused = t.fail(view(first), first, {"e": 3}, permanent=True, retry_in=None)
    assert put_value(refused).status == FAILED


def test_take_over_waits_for_the_lease_and_the_unknown_delay() -> None:
    with pytest.raises(t.Skip):
        t.take_over(view(claimed(lease=NOW + 1)), "op", "rec", 30.0, 0.0)
    lapsed = put_value(t.take_over(view(claimed(fence=2, lease=NOW)), "op", "rec", 30.0, 99.0))
    assert (lapsed.status, lapsed.fence, lapsed.holder, lapsed.since) == (UNKNOWN, 3, "rec", NOW)
    recent = claimed().replace(status=UNKNOWN, holder=None, lease_expires=None, since=NOW - 1)
    with pytest.raises(t.Skip):
        t.take_over(view(recent), "op", "rec", 30.0, 5.0)
    assert put_value(t.take_over(view(recent), "op", "rec", 30.0, 1.0)).since == NOW - 1


def test_resolve_compensates_in_the_same_write() -> None:
    taken = claimed(fence=3).replace(status=UNKNOWN, holder="rec")
    outcome = Outcome.compensate(taken, "refund", {"cents": 5})
    change = t.resolve(view(taken, extra=(effect_key("op.undo"),)), taken, outcome, None)
    puts = {w.key: w.value for w in change.writes if isinstance(w, Put)}
    assert puts[effect_key("op")]["status"] == "compensated"
    assert puts[effect_key("op")]["compensation"] == "op.undo"
    assert puts[effect_key("op.undo")]["compensates"] == "op"
    assert SetAdd(PENDING_SET, "op.undo") in change.writes
    assert SetRemove(INFLIGHT_SET, "op") in change.writes


def test_resolve_applied_records_the_found_result() -> None:
    taken = claimed(fence=3).replace(status=UNKNOWN, holder="rec")
    done = put_value(t.resolve(view(taken), taken, Outcome.applied({"n": 1}), None))
    assert (done.status, done.result, done.holder) == (SUCCEEDED, {"n": 1}, None)


def test_request_effects_is_idempotent_by_id() -> None:
    request = EffectRequest("op", "mail", {"to": "a"})
    fresh = request_effects(view(extra=(request.key,)), Change(result=1), request)
    assert fresh.result == 1 and SetAdd(PENDING_SET, "op") in fresh.writes
    same = request_effects(view(pending()), Change(), request)
    assert not same.writes
    with pytest.raises(IdempotencyMismatch):
        request_effects(view(pending()), Change(), EffectRequest("op", "mail", {"to": "b"}))


def test_requests_and_ids_are_checked() -> None:
    with pytest.raises(BadRequest):
        EffectRequest("bad id!", "mail")
    with pytest.raises(BadRequest):
        EffectRequest("op", "mail", max_attempts=0)
    assert compensation_id("a") == "a.undo"
    long = compensation_id("x" * 128)
    assert long.startswith("undo-") and len(long) <= 128
