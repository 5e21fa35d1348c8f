"""The commit loop: read a snapshot, apply a pure transition, write conditionally.

::

    read snapshot ──> transition(view, event) ──> transact(compares on every version read)
         ^                                                  │
         │   VersionConflict: discard the candidate,        │
         └── back off (jittered), re-read, recompute  <─────┘

* Every key the transition read is compared in the write (``VersionIs`` or ``Absent``),
  including keys read only to decide, so a decision computed from a read that has since
  changed cannot commit (no stale reads).
* A candidate is never resent after a conflict: the public API takes a transition, not a
  candidate, and each attempt recomputes it from a fresh snapshot.
* With a ``command_id`` the command's outcome is written in the *same* transact as the
  change, with the versions and sequence numbers the store gave it (a ``PutOutcome``). A
  retry with the same id returns that recorded outcome, the first delivery's result,
  versions and seqs, whatever was written since, and applies nothing; the same id with
  another payload raises :class:`~agentrooms.errors.IdempotencyMismatch`.
  Only then is a transport failure (outcome unknown) retried: the retry re-reads and
  finds the outcome if the first attempt committed.
* ``InvalidTransition`` and ``StaleFence`` are raised at once, never retried.
* Hot keys take turns locally: once a key has conflicted (the store named it in a
  ``VersionConflict``), the commits of this process that read it queue for it in the
  process (first come, first served) for ``HOT_FOR`` seconds after its last conflict,
  holding their turn from the read to the end of their commit, backoff included. Writers
  in one process then stop colliding with each other, and each process meets the others
  in the store as one writer with a backoff policy. Keys that never conflict (read by
  many, written by few) never queue. Correctness never depends on it: every write is
  still conditional. A commit takes its turns at most once, all at once, in key order,
  so turns cannot deadlock. ``RetryPolicy(local_turns=False)`` turns it off.
* A caller that knows what it last wrote can pass it as ``guess``: the first attempt
  computes from that snapshot instead of reading one, so a commit costs one round trip
  instead of two while the guess holds. Nothing else changes: the write compares every
  version the transition read, so a wrong guess fails its compares like any stale read
  (a conflict: discarded, backed off, re-read, recomputed), and never commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from agentrooms.errors import (
    BadRequest,
    ContentionExhausted,
    IdempotencyMismatch,
    InvalidTransition,
    RateLimited,
    StaleFence,
    StoreUnavailable,
    VersionConflict,
)
from agentrooms.intent import Intent, Where, intent_payload, intent_transition
from agentrooms.metrics import Metrics, default_metrics, operator_metrics
from agentrooms.retry import RetryPolicy
from agentrooms.store.base import Store
from agentrooms.store.types import (
    JSON,
    OUTCOME_FIELD,
    Absent,
    Compare,
    PutOutcome,
    Record,
    Snapshot,
    VersionIs,
    Write,
)
from agentrooms.view import Change, Transition, Unread, View

__all__ = [
    "COMMAND_PREFIX",
    "Change",
    "CommitOptions",
    "CommitResult",
    "Intent",
    "Transition",
    "View",
    "Where",
    "apply_intent",
    "commit",
    "recorded",
]

E = TypeVar("E")

COMMAND_PREFIX = "_ar/cmd/"
"""Keys under this prefix hold recorded command outcomes (idempotency)."""

DEFAULT_RETENTION = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class CommitResult:
    result: JSON
    versions: dict[str, int]
    seqs: list[int]
    attempts: int  # conditional writes sent
    transitions: int  # times the transition ran
    elapsed: float
    replayed: bool = False  # the outcome was recorded by an earlier delivery of the command
    requeued: bool = False  # contention exhausted and the command was handed back


def command_key(command_id: str) -> str:
    if not isinstance(command_id, str) or not command_id or len(command_id) > 200:
        raise BadRequest("command_id must be a non-empty string of at most 200 characters")
    return COMMAND_PREFIX + command_id


def payload_digest(event: object) -> str:
    try:
        text = json.dumps(event, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"a command's event must be JSON-serialisable: {exc}") from exc
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Loop:
    """One commit's mutable bookkeeping (kept out of the function for readability)."""

    policy: RetryPolicy
    rng: random.Random
    clock: Callable[[], float]
    started: float
    attempts: int = 0
    transitions: int = 0
    delay: float = 0.0
    last_keys: list[str] = field(default_factory=list)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def next_delay(self, at_least: float = 0.0) -> float | None:
        """The wait before the next attempt, or None if the bounds are reached."""
        if self.attempts >= self.policy.max_attempts:
            return None
        self.delay = max(at_least, self.policy.backoff.delay(self.attempts, self.delay, self.rng))
        if self.elapsed() + self.delay > self.policy.budget:
            return None
        return self.delay


_RNG = random.Random()  # the jitter's default source, one per process (docs/why.md)


@dataclass(frozen=True, slots=True)
class CommitOptions:
    """How a commit retries and reports, apart from what it commits.

    ``policy``: attempts, budget and backoff (``RetryPolicy()`` if ``None``);
    ``retention``: seconds a command's recorded outcome is kept; ``metrics``: where it is
    counted (the process default if ``None``); ``sleep``, ``clock`` and ``rng``: the
    backoff's wait, elapsed-time clock and jitter source, replaceable in tests.
    """

    policy: RetryPolicy | None = None
    retention: float = DEFAULT_RETENTION
    metrics: Metrics | None = None
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    clock: Callable[[], float] = time.monotonic
    rng: random.Random | None = None


DEFAULTS = CommitOptions()


async def commit(
    store: Store,
    /,
    room: str,
    transition: Transition[E],
    event: E,
    *,
    keys: Sequence[str] = (),
    command_id: str | None = None,
    requeue: Callable[[E], Awaitable[None]] | None = None,
    guess: Snapshot | None = None,
    options: CommitOptions = DEFAULTS,
) -> CommitResult:
    """Apply ``transition`` to a snapshot of ``keys`` and commit its change atomically.

    Returns a :class:`CommitResult`. Raises ``InvalidTransition`` (from the transition),
    ``StaleFence``, ``IdempotencyMismatch``, ``ContentionExhausted`` when the policy's
    attempts or budget run out (unless ``requeue`` is given: then the event is handed to
    it and the result says ``requeued``), and ``StoreUnavailable`` when the outcome is
    unknown and there is no ``command_id`` to retry safely.

    ``guess``: a snapshot of ``keys`` believed current (say, the records this process
    wrote last), for the first attempt instead of a read. A key it lacks counts as
    absent. Its ``now`` is whatever the guess says, so do not give one to a transition
    that decides on the store's clock. ``options``: see :class:`CommitOptions`.
    """
    m = options.metrics or default_metrics()
    clock, sleep = options.clock, options.sleep
    loop = _Loop(options.policy or RetryPolicy(), options.rng or _RNG, clock, clock())
    read_keys = list(dict.fromkeys(keys))
    cmd_key = None if command_id is None else command_key(command_id)
    digest = None if cmd_key is None else payload_digest(event)
    outcome: Literal["ok", "error"] = "error"
    ctx = _Attempt(loop, m, sleep, cmd_key, digest, options.retention)
    turns = store.session.turns() if loop.policy.local_turns else None
    held = turns is None  # turns are taken at most once per commit
    try:
        async with contextlib.AsyncExitStack() as stack:
            while True:
                if not held:
                    assert turns is not None
                    hot = turns.hot_keys(room, read_keys)
                    if hot:
                        await turns.take(stack, hot)
                        held = True
                        guess = None  # others of this process write these keys: unreliable
                result = await _attempt(store, room, transition, event, read_keys, ctx, guess)
                guess = None
                if result is not None:
                    outcome = "ok"
                    return result
                if turns is not None:
                    turns.mark(room, loop.last_keys)
                delay = loop.next_delay()
                if delay is None:
                    break
                await sleep(delay)
        # out of attempts or budget; the turns are given back before a requeue
        m.count("contention_exhausted")
        if requeue is not None:
            await requeue(event)
            outcome = "ok"
            return CommitResult(
                None, {}, [], loop.attempts, loop.transitions, loop.elapsed(), requeued=True
            )
        raise ContentionExhausted(loop.attempts, loop.elapsed(), loop.last_keys)
    finally:
        m.observe_commit(loop.attempts, loop.elapsed(), outcome)


@dataclass(frozen=True, slots=True)
class _Attempt:
    """What every attempt of one commit shares."""

    loop: _Loop
    m: Metrics
    sleep: Callable[[float], Awaitable[None]]
    cmd_key: str | None
    digest: str | None
    retention: float


async def _attempt(
    store: Store,
    room: str,
    transition: Transition[E],
    event: E,
    read_keys: list[str],
    ctx: _Attempt,
    guess: Snapshot | None = None,
) -> CommitResult | None:
    """Read (or take ``guess``), compute, write once; None if the candidate lost and must
    be discarded. A transition that reads a key it did not declare gets a snapshot with
    it."""
    loop, m = ctx.loop, ctx.m
    while True:
        if guess is not None:
            snap, guess = guess, None
        else:
            snap = await _read(store, room, read_keys, ctx.cmd_key, loop, m, ctx.sleep)
        if ctx.cmd_key is not None and (done := snap.get(ctx.cmd_key)) is not None:
            return _replay(done, ctx.digest, loop)
        view = View(snap, read_keys)
        loop.transitions += 1
        try:
            change = transition(view, event)
        except Unread as need:
            read_keys.extend(need.keys)
            continue
        except InvalidTransition:
            m.count("invalid_transition")
            raise
        if not isinstance(change, Change):
            raise TypeError(f"a transition must return a Change, not {type(change).__name__}")
        compares, writes = _conditions(
            view, read_keys, change, ctx.cmd_key, ctx.digest, ctx.retention
        )
        return await _write(store, room, compares, writes, change, loop, m, ctx.sleep, ctx.cmd_key)


async def _read(
    store: Store,
    room: str,
    read_keys: list[str],
    cmd_key: str | None,
    loop: _Loop,
    m: Metrics,
    sleep: Callable[[float], Awaitable[None]],
) -> Snapshot:
    """Read the snapshot; a failed read changed nothing, so it is always safe to retry."""
    while True:
        try:
            return await store.read(room, read_keys if cmd_key is None else [*read_keys, cmd_key])
        except StoreUnavailable:
            m.count("transport_failure")
            delay = loop.policy.backoff.delay(loop.attempts + 1, loop.delay, loop.rng)
            if loop.elapsed() + delay > loop.policy.budget:
                raise
            await sleep(delay)


def _conditions(
    view: View,
    read_keys: list[str],
    change: Change,
    cmd_key: str | None,
    digest: str | None,
    retention: float,
) -> tuple[list[Compare], list[Write]]:
    compares: list[Compare] = []
    for key in read_keys:
        version = view.version(key)
        compares.append(Absent(key) if version is None else VersionIs(key, version))
    compares.extend(change.requires)
    writes = list(change.writes)
    if cmd_key is not None:
        compares.append(Absent(cmd_key))
        writes.append(
            PutOutcome(cmd_key, {"digest": digest, "result": change.result}, ttl=retention)
        )
    return compares, writes


async def _write(
    store: Store,
    room: str,
    compares: list[Compare],
    writes: list[Write],
    change: Change,
    loop: _Loop,
    m: Metrics,
    sleep: Callable[[float], Awaitable[None]],
    cmd_key: str | None,
) -> CommitResult | None:
    """Send the candidate once (again only after RateLimited, which means it was not
    applied). Returns None when the candidate must be discarded and recomputed."""
    while True:
        loop.attempts += 1
        try:
            done = await store.transact(room, compares, writes, change.appends)
        except VersionConflict as exc:
            m.conflict(exc.conflicts)
            loop.last_keys = sorted(exc.conflicts)
            return None
        except StaleFence:
            m.count("stale_fence")
            raise
        except RateLimited as exc:
            m.count("rate_limited")
            delay = loop.next_delay(at_least=exc.retry_after)
            if delay is None:
                raise
            await sleep(delay)
            continue
        except StoreUnavailable:
            m.count("transport_failure")
            if cmd_key is None:
                raise  # the outcome is unknown and nothing can tell us: the caller decides
            return None  # re-read: the recorded outcome tells whether it committed
        operator_metrics().appended(append.type for append in change.appends)
        return CommitResult(
            change.result,
            done.versions,
            done.seqs,
            loop.attempts,
            loop.transitions,
            loop.elapsed(),
        )


async def recorded(
    store: Store, /, room: str, command_id: str, event: object
) -> CommitResult | None:
    """The recorded outcome of ``command_id`` if a delivery of it already committed
    (``replayed=True``), else ``None``. ``IdempotencyMismatch`` if it was recorded with
    another payload. For operations that look for their recorded outcome before they
    know which records a retry would read (e.g. claiming the next task)."""
    key = command_key(command_id)
    record = (await store.read(room, [key])).get(key)
    if record is None:
        return None
    return _replay(
        record,
        payload_digest(event),
        _Loop(RetryPolicy(), _RNG, time.monotonic, time.monotonic()),
    )


def _replay(record: Record, digest: str | None, loop: _Loop) -> CommitResult:
    stored = record.value if isinstance(record.value, dict) else {}
    if stored.get("digest") != digest:
        raise IdempotencyMismatch(
            f"command {record.key[len(COMMAND_PREFIX) :]!r} was already applied "
            "with a different payload"
        )
    done = stored.get(OUTCOME_FIELD) or {}
    return CommitResult(
        stored.get("result"),
        dict(done.get("versions") or {}),
        list(done.get("seqs") or []),
        loop.attempts,
        loop.transitions,
        loop.elapsed(),
        replayed=True,
    )


async def apply_intent(
    store: Store,
    /,
    room: str,
    intent: Intent,
    *,
    command_id: str | None = None,
    options: CommitOptions = DEFAULTS,
) -> CommitResult:
    """Commit ``intent`` if its predicates hold at the moment of the write.

    Raises ``InvalidTransition`` naming the predicates that do not hold.
    """
    keys = list(dict.fromkeys(p.key for p in intent.when))
    event = None if command_id is None else intent_payload(intent)
    return await commit(
        store,
        room,
        lambda view, _: intent_transition(view, intent),
        event,
        keys=keys,
        command_id=command_id,
        options=options,
    )
