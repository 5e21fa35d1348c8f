"""The operator read model's rows: pure functions from a room's records, read at store
time ``now``, to the rows and stuck items :class:`~agentrooms.ops.read.Ops` returns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrooms.effects.model import FAILED as EFFECT_FAILED
from agentrooms.effects.model import PENDING as EFFECT_PENDING
from agentrooms.effects.model import UNKNOWN as EFFECT_UNKNOWN_STATE
from agentrooms.ops.model import (
    CURSOR_LAGGING,
    EFFECT_UNKNOWN,
    EXPIRED,
    EXPIRED_LAST,
    EXPIRED_LEASE,
    FAILED_AT_LIMIT,
    URGENCY,
    WAITER_WAITING,
    CursorRow,
    DocRow,
    EffectRow,
    Effects,
    EventRow,
    LockRow,
    PresenceRow,
    Stuck,
    TaskRow,
    Thresholds,
    Waiter,
)
from agentrooms.rooms.documents import writer_of
from agentrooms.rooms.plan import CLAIMED, FAILED
from agentrooms.store.types import Event, Record

MAX_WAITERS = 50  # waiters listed per lock
MAX_EFFECTS = 50  # effects listed per state


@dataclass(frozen=True, slots=True)
class Parts:
    """One room's records by prefix, and the clock of its read."""

    now: float
    archived: bool
    last_seq: int
    tasks: list[Record]
    locks: list[Record]
    waiters: list[Record]
    cursors: list[Record]
    presence: list[Record]
    effects: list[Record]


def judge(
    parts: Parts, limits: Thresholds
) -> tuple[list[TaskRow], list[LockRow], list[CursorRow], list[EffectRow], list[Stuck]]:
    """The rows of a room's parts, and what among them is stuck."""
    rows = [task_row(r.value, parts.now) for r in parts.tasks]
    locks = lock_rows(parts.locks, parts.waiters, parts.now)
    cursors = cursor_rows(parts.cursors, parts.last_seq)
    effects = [effect_row(r.value) for r in parts.effects]
    return (
        rows,
        locks,
        cursors,
        effects,
        stuck_list(rows, locks, cursors, effects, parts.now, limits),
    )


def count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[value] = out.get(value, 0) + 1
    return out


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def matches(event: Event, type: str | None, author: str | None) -> bool:
    return (type is None or event.type == type) and (
        author is None or getattr(event, "author", None) == author
    )


def event_row(event: Event) -> EventRow:
    return EventRow(event.seq, event.type, getattr(event, "author", None), event.time, event.data)


def task_row(value: Mapping[str, Any], now: float) -> TaskRow:
    """One task as shown: its state ``"expired, reclaimable"`` when it is claimed and its
    lease ran out by ``now`` (the store clock of the read), ``"expired, last attempt"``
    when that was its last attempt (the next claim fails it)."""
    status = str(value.get("status"))
    expires = _float(value.get("lease_expires"))
    claimed = status == CLAIMED
    expired = claimed and (expires or 0.0) <= now
    fence = value.get("fence") or None
    attempts, limit = int(value.get("attempts") or 0), int(value.get("max_attempts") or 0)
    state = (EXPIRED if attempts < limit else EXPIRED_LAST) if expired else status
    return TaskRow(
        id=str(value.get("id")),
        status=status,
        state=state,
        owner=value.get("owner"),
        lease_remaining=max(0.0, expires - now) if claimed and expires is not None else None,
        fence=fence,
        attempts=attempts,
        deps=list(value.get("deps") or []),
        title=str(value.get("title") or ""),
        max_attempts=limit,
        lease_expires=expires if claimed else None,
        lease_granted_at=_float(value.get("lease_granted_at")),
        lease_renewed_at=_float(value.get("lease_renewed_at")),
        waiting_on=list(value.get("waiting_on") or []),
        error=value.get("error"),
    )


def lock_rows(holders: list[Record], entries: list[Record], now: float) -> list[LockRow]:
    """Held locks and locks with a line, by name; each line in ticket order (FIFO)."""
    lines: dict[str, list[Record]] = {}
    for record in entries:
        _, name, _ = record.key.split("/", 2)
        lines.setdefault(name, []).append(record)
    held = {r.key[len("lock/") :]: r for r in holders}
    rows: list[LockRow] = []
    for name in sorted(set(held) | set(lines)):
        holder = held.get(name)
        line = sorted(lines.get(name, []), key=lambda r: (r.value.get("ticket", r.version), r.key))
        waiters = []
        for entry in line[:MAX_WAITERS]:
            joined = _float(entry.value.get("joined_at"))
            waiters.append(
                Waiter(
                    owner=str(entry.value.get("owner")),
                    waited=None if joined is None else max(0.0, now - joined),
                    joined_at=joined,
                    waiter=str(entry.value.get("waiter") or entry.key.rsplit("/", 1)[-1]),
                )
            )
        if holder is None:
            rows.append(LockRow(name, None, None, None, None, 0, waiters, len(line)))
            continue
        value = holder.value
        expires = holder.expires_at
        ttl = _float(value.get("ttl"))
        since = _float(value.get("granted_at"))
        if since is None and expires is not None and ttl is not None:
            since = expires - ttl  # the last grant or extension
        rows.append(
            LockRow(
                name=name,
                holder=value.get("owner"),
                since=since,
                expires_at=expires,
                remaining=None if expires is None else max(0.0, expires - now),
                fence=int(value.get("fence") or 0),
                waiters=waiters,
                queued=len(line),
                renewed_at=_float(value.get("renewed_at")),
            )
        )
    return rows


def cursor_rows(records: list[Record], last_seq: int) -> list[CursorRow]:
    """Cursors, furthest behind first."""
    rows = [CursorRow(r.key[len("cursor/") :], int(r.value.get("seq", 0)), 0) for r in records]
    rows = [CursorRow(c.agent, c.position, max(0, last_seq - c.position)) for c in rows]
    return sorted(rows, key=lambda c: (-c.lag, c.agent))


def presence_rows(records: list[Record], now: float) -> list[PresenceRow]:
    rows = []
    for record in records:
        value = record.value
        ttl = _float(value.get("ttl")) or 0.0
        expires = record.expires_at if record.expires_at is not None else now
        last_seen = expires - ttl
        rows.append(
            PresenceRow(
                agent=str(value.get("agent")),
                last_seen=last_seen,
                age=max(0.0, now - last_seen),
                online=expires > now,
                status=str(value.get("status") or ""),
            )
        )
    return rows


def doc_rows(records: list[Record], writers: list[Record]) -> list[DocRow]:
    """Documents by name; ``last_writer`` is the writer each document's ``docby/`` record
    names (written with its current version; ``None`` if none is recorded)."""
    by = {r.key[len("docby/") :]: writer_of(r) for r in writers}
    return [DocRow(r.key[len("doc/") :], r.version, by.get(r.key[len("doc/") :])) for r in records]


def effect_row(value: Mapping[str, Any]) -> EffectRow:
    return EffectRow(
        id=str(value.get("id")),
        state=str(value.get("status")),
        since=_float(value.get("since")),
        attempts=int(value.get("attempts") or 0),
        error=value.get("error"),
        kind=str(value.get("kind") or ""),
        holder=value.get("holder"),
    )


def effects_view(effects: list[EffectRow]) -> Effects:
    """Counts by state; ``unknown`` effects; ``failed``: pending again after a failed
    attempt (a retry is due); ``dead_letters``: failed for good."""
    return Effects(
        counts=count(e.state for e in effects),
        unknown=[e for e in effects if e.state == EFFECT_UNKNOWN_STATE][:MAX_EFFECTS],
        failed=[e for e in effects if e.state == EFFECT_PENDING and e.error is not None][
            :MAX_EFFECTS
        ],
        dead_letters=[e for e in effects if e.state == EFFECT_FAILED][:MAX_EFFECTS],
    )


def _ago(since: float | None, now: float) -> str:
    return "at an unknown time" if since is None else f"{max(0.0, now - since):.0f}s ago"


def stuck_list(
    tasks: list[TaskRow],
    locks: list[LockRow],
    cursors: list[CursorRow],
    effects: list[EffectRow],
    now: float,
    limits: Thresholds,
) -> list[Stuck]:
    """What is stuck, most urgent first: by kind (:data:`URGENCY`), then oldest first."""
    out: list[Stuck] = []
    for t in tasks:
        if t.state in (EXPIRED, EXPIRED_LAST):
            then = "the next claim fails it" if t.state == EXPIRED_LAST else "nobody reclaimed it"
            detail = (
                f"held by {t.owner}, lease expired {_ago(t.lease_expires, now)} "
                f"(attempt {t.attempts} of {t.max_attempts}, fence {t.fence}); {then}"
            )
            out.append(Stuck(EXPIRED_LEASE, t.id, detail, t.lease_expires))
        elif t.status == FAILED and t.attempts >= t.max_attempts:
            error = "" if t.error is None else f": {_said(t.error)[:200]}"
            detail = f"failed at its attempt limit ({t.attempts} of {t.max_attempts}){error}"
            out.append(Stuck(FAILED_AT_LIMIT, t.id, detail, None))
    for lock in locks:
        over = limits.waiter_waiting
        late = [w for w in lock.waiters if w.waited is not None and w.waited > over]
        if late:
            first = max(late, key=lambda w: w.waited or 0.0)
            holder = "free" if lock.holder is None else f"held by {lock.holder}"
            detail = (
                f"{len(late)} of {lock.queued} waiters in line over {limits.waiter_waiting:.0f}s, "
                f"longest {first.owner} for {first.waited or 0.0:.0f}s; {holder}"
            )
            out.append(Stuck(WAITER_WAITING, lock.name, detail, first.joined_at))
    for e in effects:
        if e.state == EFFECT_UNKNOWN_STATE and (
            e.since is None or now - e.since > limits.effect_unknown
        ):
            detail = f"{e.kind} unknown since {_ago(e.since, now)} after {e.attempts} attempts"
            out.append(Stuck(EFFECT_UNKNOWN, e.id, detail, e.since))
    for c in cursors:
        if c.lag > limits.cursor_lag:
            detail = f"{c.lag} events behind (at {c.position})"
            out.append(Stuck(CURSOR_LAGGING, c.agent, detail, None))
    rank = {kind: i for i, kind in enumerate(URGENCY)}
    return sorted(
        out,
        key=lambda s: (rank[s.kind], s.since is None, s.since or 0.0, s.subject),
    )


def _said(error: object) -> str:
    """A task's recorded error as a line of text: its ``message`` if it has one (what
    ``fail`` records), else its JSON."""
    if isinstance(error, dict) and isinstance(message := error.get("message"), str):
        return message
    return error if isinstance(error, str) else json.dumps(error, ensure_ascii=False)
