"""The operator read model: what a room holds and what in it is stuck, read-only.

:class:`Ops` reads a room's parts with one scan per key prefix (tasks, locks, lock
lines, cursors, presence, documents, effects, writer queues, contention tables), all
sent at once, plus the log's head and newest events. Each part is its own snapshot;
``now`` is the store clock of the room's own read, and every duration (lease remaining,
waited, age, lag) is judged against it, never against this process's clock. Nothing
here writes. A room that does not exist raises ``NotFound``.

A claimed task whose lease ran out shows as ``"expired, reclaimable"``, computed here
from ``now`` and the task's ``lease_expires``. Fields that newer writers record (a lease's
``lease_granted_at``/``lease_renewed_at``, a lock holder's ``granted_at``, a waiter's
``joined_at``, an event's ``author``) are read when present and ``None`` otherwise.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrooms.effects.model import FAILED as EFFECT_FAILED
from agentrooms.effects.model import PENDING as EFFECT_PENDING
from agentrooms.effects.model import UNKNOWN as EFFECT_UNKNOWN_STATE
from agentrooms.errors import CursorCompacted, NotFound
from agentrooms.ops.model import (
    CURSOR_LAGGING,
    EFFECT_UNKNOWN,
    EXPIRED,
    EXPIRED_LAST,
    EXPIRED_LEASE,
    FAILED_AT_LIMIT,
    URGENCY,
    WAITER_WAITING,
    Conflicts,
    CursorRow,
    DocRow,
    EffectRow,
    Effects,
    EventPage,
    EventRow,
    LockRow,
    PlanPage,
    PresenceRow,
    RoomPage,
    RoomsPage,
    RoomSummary,
    Stuck,
    TaskPage,
    TaskRow,
    Thresholds,
    Waiter,
    Writer,
    WriterQueue,
)
from agentrooms.rooms import keys
from agentrooms.rooms.plan import CLAIMED, FAILED
from agentrooms.store import contention
from agentrooms.store.base import Store
from agentrooms.store.types import Event, Record
from agentrooms.writer.model import QueueKeys

PLAN_PAGE = 100  # tasks on the first screen
EVENTS = 50  # newest events on the first screen
MAX_ROWS = 200  # locks, presence, cursors, documents listed at most (the rest counted)
MAX_WAITERS = 50  # waiters listed per lock
MAX_STUCK = 100  # stuck items listed at most (``stuck_total`` counts them all)
MAX_EFFECTS = 50  # effects listed per state
MAX_QUEUES = 16  # writer queues looked at
EVENT_CHUNK = 500  # events read per round trip when filtering
EVENT_SCAN = 5000  # events looked at, at most, by one filtered events call
SCAN_PAGE = 1000  # records per scan page: the plan read's own page, so a task scan costs the same

Allowed = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class _Parts:
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


class Ops:
    """Read-only views of a store's rooms for operators (``Ops(store)``)."""

    def __init__(self, store: Store, thresholds: Thresholds | None = None) -> None:
        self.store = store
        self.thresholds = thresholds or Thresholds()

    # ------------------------------------------------------------------ reading

    async def _all(self, room: str, prefix: str) -> list[Record]:
        out: list[Record] = []
        after: str | None = None
        while True:
            limit = min(SCAN_PAGE, self.store.limits.max_page)
            page = await self.store.scan(room, prefix, after, limit)
            out += page.records
            if page.next_after is None:
                return out
            after = page.next_after

    async def _parts(self, room: str) -> _Parts:
        keys.check_name(room, "room name")
        prefixes = ("task/", "lock/", "lockq/", "cursor/", "presence/", "effect/")
        snap, last_seq, scans = await asyncio.gather(
            self.store.read(room, [keys.META, keys.ARCHIVED]),
            self.store.last_seq(room),
            asyncio.gather(*(self._all(room, prefix) for prefix in prefixes)),
        )
        if not snap.exists(keys.META):
            raise NotFound(f"room {room!r} does not exist")
        tasks, locks, waiters, cursors, presence, effects = scans
        return _Parts(
            snap.now,
            snap.exists(keys.ARCHIVED),
            last_seq,
            tasks,
            locks,
            waiters,
            cursors,
            presence,
            effects,
        )

    async def room(self, room: str, thresholds: Thresholds | None = None) -> RoomPage:
        """The room's first screen: stuck list (most urgent first), plan summary and its
        first page, locks with their lines, presence, cursors, documents, effects, the
        designated writer's queues, contention and the newest events."""
        limits = thresholds or self.thresholds
        parts, docs, writer, conflicts, latest = await asyncio.gather(
            self._parts(room),
            self._all(room, "doc/"),
            self._writer(room),
            self.contention(room),
            self.events(room, limit=EVENTS),
        )
        now = parts.now
        rows, locks, cursors, effects, stuck = _judge(parts, limits)
        return RoomPage(
            room=room,
            now=now,
            last_seq=parts.last_seq,
            archived=parts.archived,
            stuck=stuck[:MAX_STUCK],
            stuck_total=len(stuck),
            plan=PlanPage(
                counts=_count(r.status for r in rows),
                states=_count(r.state for r in rows),
                total=len(rows),
                tasks=rows[:PLAN_PAGE],
                next_after=rows[PLAN_PAGE - 1].id if len(rows) > PLAN_PAGE else None,
            ),
            locks=locks[:MAX_ROWS],
            presence=presence_rows(parts.presence, now)[:MAX_ROWS],
            cursors=cursors[:MAX_ROWS],
            documents=doc_rows(docs, latest.events)[:MAX_ROWS],
            effects=effects_view(effects),
            writer=writer,
            contention=conflicts,
            events=latest.events,
        )

    async def summary(self, room: str, thresholds: Thresholds | None = None) -> RoomSummary:
        """One line of the rooms overview: task counts, stuck count, locks held, agents
        online and the log's head."""
        parts = await self._parts(room)
        rows, locks, _, _, stuck = _judge(parts, thresholds or self.thresholds)
        return RoomSummary(
            room=room,
            tasks=_count(r.status for r in rows),
            stuck=len(stuck),
            locks_held=sum(1 for lock in locks if lock.holder is not None),
            online=len(parts.presence),
            last_seq=parts.last_seq,
            archived=parts.archived,
        )

    async def rooms(
        self,
        limit: int = 50,
        after: str | None = None,
        *,
        allowed: Allowed | None = None,
        thresholds: Thresholds | None = None,
    ) -> RoomsPage:
        """Rooms by name after ``after``, at most ``limit``, each summarised; ``allowed``
        leaves out the rooms it refuses (as if absent). ``next_after`` is the name to
        pass as ``after`` for the next page, ``None`` at the end."""
        names: list[str] = []
        cursor = None if after is None else keys.registry_entry(after)
        more = False
        while not more:
            page = await self.store.scan(keys.REGISTRY, "room/", cursor, 100)
            for record in page.records:
                name = record.key[len("room/") :]
                if allowed is None or allowed(name):
                    if len(names) == limit:
                        more = True
                        break
                    names.append(name)
            if page.next_after is None:
                break
            cursor = page.next_after
        summaries = await asyncio.gather(
            *(self._summary_or_none(name, thresholds) for name in names)
        )
        now = (await self.store.read(keys.REGISTRY, [])).now
        return RoomsPage(
            now=now,
            rooms=[s for s in summaries if s is not None],
            next_after=names[-1] if more and names else None,
        )

    async def _summary_or_none(
        self, room: str, thresholds: Thresholds | None
    ) -> RoomSummary | None:
        try:
            return await self.summary(room, thresholds)
        except NotFound:  # registered, and being created or deleted
            return None

    async def tasks(
        self, room: str, limit: int = PLAN_PAGE, after: str | None = None, status: str | None = None
    ) -> TaskPage:
        """Tasks in id order after task id ``after`` (optionally only ``status``), at most
        ``limit``; ``next_after`` is the id to continue after, ``None`` at the end."""
        snap = await self.store.read(room, [keys.META])
        if not snap.exists(keys.META):
            raise NotFound(f"room {room!r} does not exist")
        out: list[TaskRow] = []
        cursor = None if after is None else keys.task(after)
        while True:
            page = await self.store.scan(room, "task/", cursor, limit if status is None else 1000)
            for record in page.records:
                if status is None or record.value.get("status") == status:
                    out.append(task_row(record.value, page.now))
                    if len(out) == limit:
                        more = record is not page.records[-1] or page.next_after is not None
                        return TaskPage(out, record.value["id"] if more else None)
            if page.next_after is None:
                return TaskPage(out, None)
            cursor = page.next_after

    async def events(
        self,
        room: str,
        limit: int = EVENTS,
        before: int | None = None,
        type: str | None = None,
        author: str | None = None,
    ) -> EventPage:
        """Events newest first with ``seq < before`` (default: from the head), at most
        ``limit``, optionally only of ``type`` and/or ``author``. A filtered call looks
        at :data:`EVENT_SCAN` events at most; ``next_before`` is where to continue
        (``None``: the log's start, or its trimmed start, was reached; a page that ends
        exactly on the trimmed start may not know it, and the next one is empty)."""
        snap, head = await asyncio.gather(
            self.store.read(room, [keys.META]), self.store.last_seq(room)
        )
        if not snap.exists(keys.META):
            raise NotFound(f"room {room!r} does not exist")
        top = head if before is None else min(head, before - 1)
        filtered = type is not None or author is not None
        chunk = EVENT_CHUNK if filtered else limit
        out: list[EventRow] = []
        looked = 0
        while top >= 1 and looked < EVENT_SCAN:
            start = max(0, top - chunk)
            floor = False
            try:
                batch = await self.store.read_log(room, start, top - start)
            except CursorCompacted as exc:
                if exc.first_available > top:
                    return EventPage(out, None)
                start, floor = exc.first_available - 1, True
                batch = await self.store.read_log(room, start, top - start)
            for event in reversed([e for e in batch if e.seq <= top]):
                if _matches(event, type, author):
                    out.append(event_row(event))
                    if len(out) == limit:
                        older = event.seq > start + 1 or (start > 0 and not floor)
                        return EventPage(out, event.seq if older else None)
            looked += top - start
            top = 0 if floor else start
        return EventPage(out, top + 1 if top >= 1 else None)

    async def contention(self, room: str) -> list[Conflicts]:
        """Conflicts per key prefix in ``room``, summed over every handle's flushed table
        (and this handle's own, flushed or not), hottest first."""
        tables = await self._all(contention.ROOM, f"{room}/")
        totals: dict[str, int] = {}
        mine = self.store.contention
        for record in tables:
            if record.value.get("handle") == mine.handle:
                continue
            for prefix, n in (record.value.get("conflicts") or {}).items():
                totals[prefix] = totals.get(prefix, 0) + int(n)
        for prefix, n in mine.local(room).items():
            totals[prefix] = totals.get(prefix, 0) + n
        ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
        return [Conflicts(prefix, n) for prefix, n in ranked[:MAX_ROWS]]

    async def _writer(self, room: str) -> Writer:
        names: list[str] = []
        after: str | None = None
        while len(names) < MAX_QUEUES:
            page = await self.store.scan(room, "wq/", after, 1)
            if not page.records:
                break
            name = page.records[0].key.split("/")[1]
            names.append(name)
            after = f"wq/{name}0"  # '0' sorts just after '/': skip the rest of this queue
        queues = await asyncio.gather(*(self._queue(room, QueueKeys(name)) for name in names))
        dead = [letter for queue in queues for letter in queue[1]][:MAX_EFFECTS]
        return Writer(
            queued=sum(q.queued for q, _ in queues),
            dead_letters=sum(q.dead_letters for q, _ in queues),
            queues=[q for q, _ in queues],
            dead=dead,
        )

    async def _queue(self, room: str, queue: QueueKeys) -> tuple[WriterQueue, list[dict[str, Any]]]:
        depth, dead, snap = await asyncio.gather(
            self.store.set_size(room, queue.queued),
            self._all(room, queue.dead()),
            self.store.read(room, [queue.cursor]),
        )
        cursor = snap.value(queue.cursor) or {}
        letters = [
            {
                "queue": queue.name,
                "id": r.value.get("id"),
                "seq": r.value.get("seq"),
                "reason": r.value.get("reason"),
                "failures": r.value.get("failures"),
            }
            for r in dead
        ]
        row = WriterQueue(queue.name, depth, len(dead), int(cursor.get("seq", 0)))
        return row, letters


# ------------------------------------------------------------------ rows (pure)


def _judge(
    parts: _Parts, limits: Thresholds
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


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[value] = out.get(value, 0) + 1
    return out


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _matches(event: Event, type: str | None, author: str | None) -> bool:
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


def doc_rows(records: list[Record], events: list[EventRow]) -> list[DocRow]:
    """Documents by name; ``last_writer`` is the author of the newest ``doc.written``
    event among ``events`` that names the document (``None`` if none does)."""
    writers: dict[str, str | None] = {}
    for event in events:  # newest first
        data = event.data
        if event.type == "doc.written" and isinstance(data, dict):
            writers.setdefault(str(data.get("doc")), event.author)
    return [
        DocRow(r.key[len("doc/") :], r.version, writers.get(r.key[len("doc/") :])) for r in records
    ]


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
        counts=_count(e.state for e in effects),
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
