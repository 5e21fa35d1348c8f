"""The outbox's state machine as pure transitions over a :class:`~agentrooms.commit.View`.

Every transition that acts for a holder (a worker's claim, a reconciler's take-over)
first checks that the record still carries the holder's fence, and its change
``requires`` ``FenceAtMost(effect/<id>, fence)`` so the store enforces the same rule
atomically: a holder whose lease was taken over gets ``StaleFence`` and records nothing.
The result of each change is the effect's new value (``None`` when nothing was taken).
"""

from __future__ import annotations

import dataclasses

from agentrooms.commit import Change, View
from agentrooms.effects.model import (
    CLAIMED,
    COMPENSATED,
    DEAD_SET,
    FAILED,
    INFLIGHT_SET,
    PENDING,
    PENDING_SET,
    SUCCEEDED,
    UNKNOWN,
    Effect,
    Outcome,
    read_effect,
)
from agentrooms.errors import InvalidTransition, NotFound, StaleFence
from agentrooms.store.types import JSON, Append, FenceAtMost, Put, SetAdd, SetRemove, Write


class Skip(Exception):
    """The candidate cannot be taken now (not due, not eligible): try another one."""


def _event(kind: str, effect: Effect, by: str | None, **extra: JSON) -> Append:
    data = {"effect": effect.id, "kind": effect.kind, "fence": effect.fence, "by": by, **extra}
    return Append(f"effect.{kind}", data, by)


def _put(effect: Effect) -> Put:
    return Put(effect.key, effect.to_value())


def _held(view: View, mine: Effect, status: str) -> Effect | None:
    """The current record if ``mine`` (a claim or take-over) still holds it; ``None`` if
    this holder already recorded its outcome (a retry after a lost response);
    ``StaleFence`` if someone took it over since."""
    current = read_effect(view, mine.id)
    if current is None:
        raise NotFound(f"no effect {mine.id!r}")
    if current.fence != mine.fence:
        raise StaleFence(current.key, mine.fence, current.fence)
    if current.status != status or current.holder != mine.holder:
        return None
    return current


def _unchanged(view: View, mine: Effect) -> Change:
    current = read_effect(view, mine.id)
    assert current is not None
    return Change(result=current.to_value())


def _guarded(
    effect: Effect, fence: int, writes: list[Write], appends: list[Append], result: Effect
) -> Change:
    return Change(
        writes=[_put(result), *writes],
        appends=appends,
        requires=[FenceAtMost(effect.key, fence)],
        result=result.to_value(),
    )


# ------------------------------------------------------------------------- workers


def claim(view: View, op_id: str, worker: str, ttl: float) -> Change:
    """Take a pending, due effect for ``worker``: a new fence, one more attempt, a lease."""
    effect = read_effect(view, op_id)
    if effect is None or effect.status != PENDING:
        return Change(writes=[SetRemove(PENDING_SET, op_id)])  # a stray member: repair
    if effect.not_before is not None and effect.not_before > view.now:
        raise Skip
    claimed = effect.replace(
        status=CLAIMED,
        fence=effect.fence + 1,
        holder=worker,
        lease_expires=view.now + ttl,
        attempts=effect.attempts + 1,
        not_before=None,
        since=view.now,
    )
    return Change(
        writes=[_put(claimed), SetRemove(PENDING_SET, op_id), SetAdd(INFLIGHT_SET, op_id)],
        appends=[_event("claimed", claimed, worker, attempt=claimed.attempts)],
        result=claimed.to_value(),
    )


def renew(view: View, mine: Effect, ttl: float) -> Change:
    current = _held(view, mine, CLAIMED)
    if current is None:
        raise InvalidTransition(f"effect {mine.id!r} is no longer claimed by {mine.holder!r}")
    renewed = current.replace(lease_expires=view.now + ttl)
    return _guarded(current, mine.fence, [], [], renewed)


def succeed(view: View, mine: Effect, result: JSON) -> Change:
    """The handler returned: record ``succeeded`` with its result."""
    current = _held(view, mine, CLAIMED)
    if current is None:
        return _unchanged(view, mine)
    done = current.replace(
        status=SUCCEEDED, result=result, error=None, lease_expires=None, since=view.now
    )
    appends = [_event("succeeded", done, mine.holder, attempt=done.attempts)]
    return _guarded(current, mine.fence, [SetRemove(INFLIGHT_SET, mine.id)], appends, done)


def fail(
    view: View, mine: Effect, error: JSON, *, permanent: bool, retry_in: float | None
) -> Change:
    """The handler raised: back to ``pending`` (due in ``retry_in`` s) while attempts are
    left and the failure is not permanent, else ``failed`` for good (dead)."""
    current = _held(view, mine, CLAIMED)
    if current is None:
        return _unchanged(view, mine)
    return _fail_or_retry(view, current, error, permanent, retry_in, mine.holder)


def unknown(view: View, mine: Effect, error: JSON) -> Change:
    """The handler could not tell whether the call was applied: ``unknown``, left to the
    reconciler (kept in the in-flight set, no lease)."""
    current = _held(view, mine, CLAIMED)
    if current is None:
        return _unchanged(view, mine)
    after = current.replace(
        status=UNKNOWN, holder=None, lease_expires=None, error=error, since=view.now
    )
    appends = [_event("unknown", after, mine.holder, error=error)]
    return _guarded(current, mine.fence, [], appends, after)


def _fail_or_retry(
    view: View,
    current: Effect,
    error: JSON,
    permanent: bool,
    retry_in: float | None,
    by: str | None,
) -> Change:
    fence = current.fence
    if permanent or current.attempts >= current.max_attempts:
        if error is None:
            error = {"type": "AttemptsExhausted", "message": f"{current.attempts} attempts"}
        dead = current.replace(
            status=FAILED, holder=None, lease_expires=None, error=error, since=view.now
        )
        writes: list[Write] = [SetRemove(INFLIGHT_SET, current.id), SetAdd(DEAD_SET, current.id)]
        appends = [_event("failed", dead, by, error=error, attempts=dead.attempts)]
        return _guarded(current, fence, writes, appends, dead)
    again = current.replace(
        status=PENDING,
        holder=None,
        lease_expires=None,
        error=error,
        not_before=None if retry_in is None else view.now + retry_in,
        since=view.now,
    )
    writes = [SetRemove(INFLIGHT_SET, current.id), SetAdd(PENDING_SET, current.id)]
    appends = [_event("retry", again, by, error=error, attempts=again.attempts)]
    return _guarded(current, fence, writes, appends, again)


# ---------------------------------------------------------------------- reconciler


def take_over(view: View, op_id: str, owner: str, ttl: float, unknown_after: float) -> Change:
    """Take an effect whose worker's lease expired (it died, or is paused, somewhere
    between its claim and its record) or that has been ``unknown`` for ``unknown_after``
    seconds: status ``unknown``, a new fence (the old holder is fenced out), a lease for
    the reconciler."""
    effect = read_effect(view, op_id)
    if effect is None or effect.status not in (CLAIMED, UNKNOWN):
        return Change(writes=[SetRemove(INFLIGHT_SET, op_id)])  # a stray member: repair
    lapsed = effect.lease_expires is None or effect.lease_expires <= view.now
    if not lapsed:
        raise Skip
    if effect.status == UNKNOWN and (effect.since or 0.0) + unknown_after > view.now:
        raise Skip
    taken = effect.replace(
        status=UNKNOWN,
        fence=effect.fence + 1,
        holder=owner,
        lease_expires=view.now + ttl,
        since=effect.since if effect.status == UNKNOWN else view.now,
    )
    data: dict[str, JSON] = {"previous": effect.status, "previous_holder": effect.holder}
    appends = [_event("reconciling", taken, owner, **data)]
    return Change(writes=[_put(taken)], appends=appends, result=taken.to_value())


def resolve(view: View, mine: Effect, outcome: Outcome, retry_in: float | None) -> Change:
    """Record what the reconciler's check found, guarded by the take-over's fence."""
    current = _held(view, mine, UNKNOWN)
    if current is None:
        return _unchanged(view, mine)
    fence, by = mine.fence, mine.holder
    leave: list[Write] = [SetRemove(INFLIGHT_SET, current.id)]
    if outcome.action == "complete":
        done = current.replace(
            status=SUCCEEDED, holder=None, lease_expires=None, result=outcome.result, since=view.now
        )
        appends = [_event("succeeded", done, by, reconciled=True)]
        return _guarded(current, fence, leave, appends, done)
    if outcome.action in ("retry", "fail"):
        error = outcome.error if outcome.action == "fail" else current.error
        return _fail_or_retry(view, current, error, outcome.action == "fail", retry_in, by)
    if outcome.action == "compensate":
        return _compensate(view, current, outcome, by)
    error = current.error if outcome.error is None else outcome.error  # "wait": ask later
    waiting = current.replace(holder=None, lease_expires=None, error=error, since=view.now)
    return _guarded(current, fence, [], [], waiting)


def _compensate(view: View, current: Effect, outcome: Outcome, by: str | None) -> Change:
    request = outcome.compensation
    assert request is not None
    if request.author is None and by is not None:  # requested by the worker compensating
        request = dataclasses.replace(request, author=by)
    if read_effect(view, request.id) is not None:
        raise InvalidTransition(f"compensation id {request.id!r} is already taken")
    undone = current.replace(
        status=COMPENSATED,
        holder=None,
        lease_expires=None,
        compensation=request.id,
        since=view.now,
    )
    writes = [SetRemove(INFLIGHT_SET, current.id), *request.writes(view.now)]
    appends = [
        _event("compensated", undone, by, compensation=request.id),
        *request.appends(),
    ]
    return _guarded(current, current.fence, writes, appends, undone)
