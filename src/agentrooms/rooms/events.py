"""The room's event log, read by each agent exactly once through its own cursor.

A cursor is a sequence number (never a timestamp, never "the last N"), kept in the
record ``cursor/<agent>`` and advanced by compare-and-set, so two readers sharing an
agent name cannot both take the same events.

* ``read_new(agent)`` pages through everything after the cursor, in order. With
  ``ack="auto"`` the cursor advances in the same call (at-most-once for a reader that
  crashes before processing); with ``ack="explicit"`` it advances only on ``ack(seq)``
  (at-least-once: a crash between read and processing loses nothing).
* ``subscribe(agent)`` yields events as they arrive, woken by the store's ``watch``.
* A cursor behind the log's trimmed start raises ``CursorCompacted``; the agent reads
  the current state, calls ``resync`` and continues from the head.
* An event may be addressed (``post(..., to=agents, to_roles=roles)``). The **inbox**
  (``read_new(agent, inbox=True, roles=...)``) is what is addressed to ``agent`` or one
  of ``roles``, read exactly once through the agent's second cursor, ``cursor/<agent>#inbox``
  ('#' is never in a name, so it is no other agent's): the full read and the inbox read
  never move each other's cursor, and the inbox cursor passes over events not for it
  (see docs/why-messages.md). Addressing is not access control: every reader of the
  room can read every event with ``read``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal

from agentrooms.commit import Change, View
from agentrooms.errors import BadRequest, VersionConflict
from agentrooms.metrics import operator_metrics
from agentrooms.rooms import keys
from agentrooms.rooms.scope import Scope, Try
from agentrooms.store.types import JSON, Absent, Append, Event, Put, VersionIs

Ack = Literal["auto", "explicit"]

INBOX_PAGE = 1000  # events read from the store at a time by an inbox read
INBOX_SCAN = 10_000  # events an inbox read looks at, at most, by default


@dataclass(frozen=True, slots=True)
class InboxPage:
    """One inbox read: ``events`` (addressed to the reader, in order), ``scanned`` (the
    log was looked at up to this sequence number) and ``more`` (it stopped before the
    log's head, at ``limit`` events or at its scan budget: read again at once)."""

    events: list[Event]
    scanned: int
    more: bool


def _inbox_key(agent: str) -> str:
    return keys.cursor(keys.check_name(agent, "agent")) + "#inbox"


def _cursor_key(agent: str, inbox: bool) -> str:
    return _inbox_key(agent) if inbox else keys.cursor(keys.check_name(agent, "agent"))


def _names(given: Sequence[str], what: str) -> tuple[str, ...]:
    if isinstance(given, str):
        raise BadRequest(f"{what} must be a list of names, not a string")
    return tuple(keys.check_name(name, what) for name in given)


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise BadRequest("limit must be an integer from 1 to 10000")
    return limit


class Events:
    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    async def post(
        self,
        type: str,
        data: JSON = None,
        *,
        command_id: str | None = None,
        author: str | None = None,
        to: Sequence[str] = (),
        to_roles: Sequence[str] = (),
    ) -> int:
        """Append an event; returns its sequence number. ``author``: the agent posting
        it, stored with the event (:attr:`Event.author`). ``to`` (agent names) and
        ``to_roles`` (role names) address it: it is in the inbox of each of those agents
        and of every agent reading with one of those roles (it stays in the log for every
        reader too). With ``command_id`` a retried post appends nothing and returns the
        sequence number the first one got."""
        keys.check_name(type, "event type")
        if author is not None:
            keys.check_name(author, "author")
        event = Append(type, data, author, _names(to, "addressee"), _names(to_roles, "role"))
        if command_id is None:
            return (await self._scope.transact(appends=[event])).seqs[0]

        def append(view: View, _: JSON) -> Change:
            return Change(appends=[event])

        addressed = [event.to, event.to_roles] if event.to or event.to_roles else []
        payload: JSON = [type, data, *addressed]
        result = await self._scope.commit(append, payload, command_id=command_id)
        return result.seqs[0]

    async def read(self, after: int = 0, limit: int = 100) -> list[Event]:
        """Events after ``after`` without any cursor (for resync and tools)."""
        await self._scope.read([])
        return await self._scope.store.read_log(self._scope.room, after, _check_limit(limit))

    async def cursor(self, agent: str, *, inbox: bool = False) -> int:
        """``agent``'s cursor (``inbox``: its inbox cursor): the last sequence number
        passed."""
        key = _cursor_key(agent, inbox)
        return int((await self._scope.read([key])).value(key, {"seq": 0})["seq"])

    async def read_new(
        self,
        agent: str,
        limit: int = 100,
        *,
        ack: Ack = "auto",
        inbox: bool = False,
        roles: Sequence[str] = (),
        wait: float = 0.0,
    ) -> list[Event]:
        """Up to ``limit`` events after ``agent``'s cursor, in order. ``inbox``: only
        those addressed to ``agent`` or one of ``roles``, through its inbox cursor (see
        :meth:`read_inbox`, which also says how far the log was looked at). ``wait``
        (seconds): when there is none, return as soon as one is appended (woken by the
        store, from any handle), or ``[]`` after ``wait``."""
        if inbox:
            return (await self.read_inbox(agent, roles, limit, ack=ack, wait=wait)).events
        key = keys.cursor(keys.check_name(agent, "agent"))
        limit = _check_limit(limit)
        if ack not in ("auto", "explicit"):
            raise BadRequest("ack must be 'auto' or 'explicit'")

        async def once() -> Try[list[Event]]:
            events = await self._read_new_once(key, limit, ack)
            return events, bool(events), None

        return await self._scope.until(wait, once)

    async def _read_new_once(self, key: str, limit: int, ack: Ack) -> list[Event]:
        while True:
            snap = await self._scope.read([key])
            record = snap.get(key)
            position = 0 if record is None else int(record.value["seq"])
            events = await self._scope.store.read_log(self._scope.room, position, limit)
            if not events or ack == "explicit":
                await self._observe_lag(position, len(events), limit, moved=False)
                return events
            guard = Absent(key) if record is None else VersionIs(key, record.version)
            try:
                await self._scope.transact([guard], [Put(key, {"seq": events[-1].seq})])
            except VersionConflict:
                continue  # another reader with this name moved the cursor: discard, re-read
            await self._observe_lag(events[-1].seq, len(events), limit, moved=True)
            return events

    async def read_inbox(
        self,
        agent: str,
        roles: Sequence[str] = (),
        limit: int = 100,
        *,
        ack: Ack = "auto",
        scan: int = INBOX_SCAN,
        wait: float = 0.0,
    ) -> InboxPage:
        """Up to ``limit`` events after ``agent``'s inbox cursor addressed to ``agent`` or
        to one of ``roles``, in order, looking at no more than ``scan`` events of the log
        (so a page is bounded however few are addressed to the agent; ``more`` says to
        read again).

        ``ack="auto"``: the inbox cursor moves to ``scanned`` in the same call, past the
        events returned and those not addressed to the agent (exactly once, at-most-once
        for a reader that crashes before processing). ``ack="explicit"``: it moves only
        past the events before the first one returned (none is for the agent), and past
        the rest on ``ack(agent, seq, inbox=True)``: at-least-once. Two readers sharing
        the agent name never both take an event (the cursor moves by compare-and-set).

        ``wait`` (seconds): while no event is for the agent, read on as the log grows
        (woken by the store) and return the first page that has one, or the last, empty
        page after ``wait``."""
        key = _inbox_key(agent)
        limit = _check_limit(limit)
        wanted = _names(roles, "role")
        if isinstance(scan, bool) or not isinstance(scan, int) or scan < 1:
            raise BadRequest("scan must be a positive integer")
        if ack not in ("auto", "explicit"):
            raise BadRequest("ack must be 'auto' or 'explicit'")

        async def once() -> Try[InboxPage]:
            page = await self._read_inbox_once(key, agent, wanted, limit, ack, scan)
            return page, bool(page.events), 0.0 if page.more else None

        return await self._scope.until(wait, once)

    async def _read_inbox_once(
        self, key: str, agent: str, wanted: tuple[str, ...], limit: int, ack: Ack, scan: int
    ) -> InboxPage:
        while True:
            snap = await self._scope.read([key])
            record = snap.get(key)
            position = 0 if record is None else int(record.value["seq"])
            found, scanned, more = await self._scan_inbox(agent, wanted, position, limit, scan)
            target = found[0].seq - 1 if ack == "explicit" and found else scanned
            if target <= position:
                return InboxPage(found, scanned, more)
            guard = Absent(key) if record is None else VersionIs(key, record.version)
            try:
                await self._scope.transact([guard], [Put(key, {"seq": target})])
            except VersionConflict:
                continue  # another reader with this name moved the cursor: discard, re-read
            return InboxPage(found, scanned, more)

    async def _scan_inbox(
        self, agent: str, roles: tuple[str, ...], position: int, limit: int, scan: int
    ) -> tuple[list[Event], int, bool]:
        """The events after ``position`` addressed to ``agent``/``roles`` (up to
        ``limit``), the last sequence number looked at, and whether the log goes on."""
        found: list[Event] = []
        scanned, looked = position, 0
        while looked < scan:
            want = min(INBOX_PAGE, scan - looked)
            page = await self._scope.store.read_log(self._scope.room, scanned, want)
            for event in page:
                looked, scanned = looked + 1, event.seq
                if event.addressed_to(agent, roles):
                    found.append(event)
                    if len(found) == limit:
                        return found, scanned, True
            if len(page) < want:
                return found, scanned, False
        return found, scanned, True

    async def _observe_lag(self, cursor: int, page: int, limit: int, *, moved: bool) -> None:
        """Observe how many events follow the cursor (at ``cursor`` now) after a read of
        ``page`` events (``moved``: the cursor passed them). A page shorter than ``limit``
        reached the head, so no read is needed; a full one reads the head's number."""
        if page < limit:
            lag = 0 if moved else page
        else:
            lag = await self._scope.store.last_seq(self._scope.room) - cursor
        operator_metrics().cursor_lag(lag)

    async def ack(self, agent: str, seq: int, *, inbox: bool = False) -> int:
        """Advance ``agent``'s cursor (``inbox``: its inbox cursor) to ``seq`` (never
        backwards, never past the head)."""
        key = _cursor_key(agent, inbox)
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise BadRequest("seq must be a non-negative integer")
        head = await self._scope.store.last_seq(self._scope.room)
        if seq > head:
            raise BadRequest(f"cannot ack {seq}: the newest event is {head}")

        def advance(view: View, _: int) -> Change:
            current = int(view.get(key, {"seq": 0})["seq"])
            if seq <= current:
                return Change(result=current)
            return Change(writes=[Put(key, {"seq": seq})], result=seq)

        position: int = (await self._scope.commit(advance, seq, [key])).result
        operator_metrics().cursor_lag(head - position)
        return position

    async def resync(self, agent: str, *, inbox: bool = False) -> int:
        """Move ``agent``'s cursor (``inbox``: its inbox cursor) to the newest event
        (after reading current state)."""
        key = _cursor_key(agent, inbox)
        head = await self._scope.store.last_seq(self._scope.room)

        def jump(view: View, _: int) -> Change:
            return Change(writes=[Put(key, {"seq": head})], result=head)

        position: int = (await self._scope.commit(jump, head, [key])).result
        return position

    async def subscribe(
        self,
        agent: str,
        *,
        ack: Ack = "auto",
        batch: int = 100,
        wait: float = 30.0,
        inbox: bool = False,
        roles: Sequence[str] = (),
    ) -> AsyncIterator[Event]:
        """Yield every new event for ``agent`` (``inbox``: every one addressed to it or
        one of ``roles``), waiting on the store between batches.

        With ``ack="explicit"`` the iterator keeps its own position and the caller
        acknowledges with :meth:`ack` (``inbox=True`` for the inbox) after processing
        each event.
        """
        wanted = _names(roles, "role")
        local = await self.cursor(agent, inbox=inbox)
        while True:
            if ack == "auto" and inbox:
                page = await self.read_inbox(agent, wanted, batch)
                events, local = page.events, page.scanned
            elif ack == "auto":
                events = await self.read_new(agent, batch)
            else:
                events = await self.read(local, batch)
            for event in events:
                local = max(local, event.seq)
                if inbox and ack == "explicit" and not event.addressed_to(agent, wanted):
                    continue
                yield event
            if not events:
                await self._scope.store.watch(self._scope.room, local, wait)
