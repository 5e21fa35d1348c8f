"""The operator read model: what a room holds and what in it is stuck, read-only.

:class:`Ops` reads a room's parts with one scan per key prefix (tasks, locks, lock
lines, cursors, presence, documents, effects, writer queues, contention tables), all
sent at once, plus the log's head and newest events. Each part is its own snapshot;
``now`` is the store clock of the room's own read, and every duration (lease remaining,
waited, age, lag) is judged against it, never against this process's clock. Nothing
here writes. A room that does not exist raises ``NotFound``. The rooms overview
(:meth:`Ops.rooms`) reads a page of rooms with one glance and one
:meth:`~agentrooms.store.base.Store.scan_rooms` per key prefix for the whole page.

A claimed task whose lease ran out shows as ``"expired, reclaimable"``, computed here
from ``now`` and the task's ``lease_expires``. Fields that newer writers record (a lease's
``lease_granted_at``/``lease_renewed_at``, a lock holder's ``granted_at``, a waiter's
``joined_at``, an event's ``author``) are read when present and ``None`` otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agentrooms.errors import CursorCompacted, NotFound
from agentrooms.ops import rows
from agentrooms.ops.model import (
    Conflicts,
    EventPage,
    EventRow,
    PlanPage,
    RoomPage,
    RoomsPage,
    RoomSummary,
    TaskPage,
    TaskRow,
    Thresholds,
    Writer,
    WriterQueue,
)
from agentrooms.ops.rows import MAX_EFFECTS
from agentrooms.rooms import keys, registry
from agentrooms.store import contention
from agentrooms.store.base import Store
from agentrooms.store.types import Record
from agentrooms.writer.model import QueueKeys

PLAN_PAGE = 100  # tasks on the first screen
EVENTS = 50  # newest events on the first screen
MAX_ROWS = 200  # locks, presence, cursors, documents listed at most (the rest counted)
MAX_STUCK = 100  # stuck items listed at most (``stuck_total`` counts them all)
MAX_QUEUES = 16  # writer queues looked at
EVENT_CHUNK = 500  # events read per round trip when filtering
EVENT_SCAN = 5000  # events looked at, at most, by one filtered events call
SCAN_PAGE = 1000  # records per scan page: the plan read's own page, so a task scan costs the same

PREFIXES = ("task/", "lock/", "lockq/", "cursor/", "presence/", "effect/")  # a room's parts

Allowed = Callable[[str], bool]


def _summarise(room: str, parts: rows.Parts, thresholds: Thresholds) -> RoomSummary:
    tasks, locks, _, _, stuck = rows.judge(parts, thresholds)
    return RoomSummary(
        room=room,
        tasks=rows.count(r.status for r in tasks),
        stuck=len(stuck),
        locks_held=sum(1 for lock in locks if lock.holder is not None),
        online=len(parts.presence),
        last_seq=parts.last_seq,
        archived=parts.archived,
    )


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

    async def _parts(self, room: str) -> rows.Parts:
        keys.check_name(room, "room name")
        snap, last_seq, scans = await asyncio.gather(
            self.store.read(room, [keys.META, keys.ARCHIVED]),
            self.store.last_seq(room),
            asyncio.gather(*(self._all(room, prefix) for prefix in PREFIXES)),
        )
        if not snap.exists(keys.META):
            raise NotFound(f"room {room!r} does not exist")
        return rows.Parts(snap.now, snap.exists(keys.ARCHIVED), last_seq, *scans)

    async def room(self, room: str, thresholds: Thresholds | None = None) -> RoomPage:
        """The room's first screen: stuck list (most urgent first), plan summary and its
        first page, locks with their lines, presence, cursors, documents, effects, the
        designated writer's queues, contention and the newest events."""
        limits = thresholds or self.thresholds
        parts, docs, doc_writers, writer, conflicts, latest = await asyncio.gather(
            self._parts(room),
            self._all(room, "doc/"),
            self._all(room, "docby/"),
            self._writer(room),
            self.contention(room),
            self.events(room, limit=EVENTS),
        )
        now = parts.now
        tasks, locks, cursors, effects, stuck = rows.judge(parts, limits)
        return RoomPage(
            room=room,
            now=now,
            last_seq=parts.last_seq,
            archived=parts.archived,
            stuck=stuck[:MAX_STUCK],
            stuck_total=len(stuck),
            plan=PlanPage(
                counts=rows.count(r.status for r in tasks),
                states=rows.count(r.state for r in tasks),
                total=len(tasks),
                tasks=tasks[:PLAN_PAGE],
                next_after=tasks[PLAN_PAGE - 1].id if len(tasks) > PLAN_PAGE else None,
            ),
            locks=locks[:MAX_ROWS],
            presence=rows.presence_rows(parts.presence, now)[:MAX_ROWS],
            cursors=cursors[:MAX_ROWS],
            documents=rows.doc_rows(docs, doc_writers)[:MAX_ROWS],
            effects=rows.effects_view(effects),
            writer=writer,
            contention=conflicts,
            events=latest.events,
        )

    async def summary(self, room: str, thresholds: Thresholds | None = None) -> RoomSummary:
        """One line of the rooms overview: task counts, stuck count, locks held, agents
        online and the log's head."""
        return _summarise(room, await self._parts(room), thresholds or self.thresholds)

    async def _all_of(self, rooms: list[str], prefix: str) -> list[list[Record]]:
        """Every record under ``prefix`` of each of ``rooms``: one
        :meth:`~agentrooms.store.base.Store.scan_rooms` for their first pages, then a
        scan per further page of a room holding more than a page of them."""
        limit = min(SCAN_PAGE, self.store.limits.max_page)
        pages = await self.store.scan_rooms(rooms, prefix, limit)
        out = [page.records for page in pages]
        for i, page in enumerate(pages):
            after = page.next_after
            while after is not None:
                more = await self.store.scan(rooms[i], prefix, after, limit)
                out[i] = out[i] + more.records
                after = more.next_after
        return out

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
        registered = registry.Names(self.store, after, registry.batch_for(limit))
        while len(names) <= limit and (got := await registered.take(limit + 1 - len(names))):
            names += got if allowed is None else [n for n in got if allowed(n)]
        more = len(names) > limit
        del names[limit:]
        now = (await self.store.read(keys.REGISTRY, [])).now
        return RoomsPage(
            now=now,
            rooms=await self._summaries(names, thresholds or self.thresholds),
            next_after=names[-1] if more and names else None,
        )

    async def _summaries(self, names: list[str], thresholds: Thresholds) -> list[RoomSummary]:
        """The rooms among ``names`` that exist, summarised: one glance and one
        :meth:`_all_of` per kind of record for all of them (a registered room being
        created or deleted is left out)."""
        if not names:
            return []
        glances, kinds = await asyncio.gather(
            self.store.glance(names, [keys.META, keys.ARCHIVED]),
            asyncio.gather(*(self._all_of(names, prefix) for prefix in PREFIXES)),
        )
        out = []
        for i, glance in enumerate(glances):
            snap = glance.snapshot
            if snap.exists(keys.META):
                scans = [kind[i] for kind in kinds]  # in the order of PREFIXES, as Parts
                parts = rows.Parts(snap.now, snap.exists(keys.ARCHIVED), glance.last_seq, *scans)
                out.append(_summarise(names[i], parts, thresholds))
        return out

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
                    out.append(rows.task_row(record.value, page.now))
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
                if rows.matches(event, type, author):
                    out.append(rows.event_row(event))
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
