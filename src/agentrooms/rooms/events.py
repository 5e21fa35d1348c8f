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
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

from agentrooms.commit import Change, View
from agentrooms.errors import BadRequest, VersionConflict
from agentrooms.metrics import operator_metrics
from agentrooms.rooms import keys
from agentrooms.rooms.scope import Scope
from agentrooms.store.types import JSON, Absent, Append, Event, Put, VersionIs

Ack = Literal["auto", "explicit"]


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
    ) -> int:
        """Append an event; returns its sequence number. ``author``: the agent posting
        it, stored with the event (:attr:`Event.author`). With ``command_id`` a retried
        post appends nothing and returns the sequence number the first one got."""
        keys.check_name(type, "event type")
        if author is not None:
            keys.check_name(author, "author")
        event = Append(type, data, author)
        if command_id is None:
            return (await self._scope.transact(appends=[event])).seqs[0]

        def append(view: View, _: JSON) -> Change:
            return Change(appends=[event])

        result = await self._scope.commit(append, [type, data], command_id=command_id)
        return result.seqs[0]

    async def read(self, after: int = 0, limit: int = 100) -> list[Event]:
        """Events after ``after`` without any cursor (for resync and tools)."""
        await self._scope.read([])
        return await self._scope.store.read_log(self._scope.room, after, _check_limit(limit))

    async def cursor(self, agent: str) -> int:
        key = keys.cursor(keys.check_name(agent, "agent"))
        return int((await self._scope.read([key])).value(key, {"seq": 0})["seq"])

    async def read_new(self, agent: str, limit: int = 100, *, ack: Ack = "auto") -> list[Event]:
        """Up to ``limit`` events after ``agent``'s cursor, in order."""
        key = keys.cursor(keys.check_name(agent, "agent"))
        limit = _check_limit(limit)
        if ack not in ("auto", "explicit"):
            raise BadRequest("ack must be 'auto' or 'explicit'")
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

    async def _observe_lag(self, cursor: int, page: int, limit: int, *, moved: bool) -> None:
        """Observe how many events follow the cursor (at ``cursor`` now) after a read of
        ``page`` events (``moved``: the cursor passed them). A page shorter than ``limit``
        reached the head, so no read is needed; a full one reads the head's number."""
        if page < limit:
            lag = 0 if moved else page
        else:
            lag = await self._scope.store.last_seq(self._scope.room) - cursor
        operator_metrics().cursor_lag(lag)

    async def ack(self, agent: str, seq: int) -> int:
        """Advance ``agent``'s cursor to ``seq`` (never backwards, never past the head)."""
        key = keys.cursor(keys.check_name(agent, "agent"))
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

    async def resync(self, agent: str) -> int:
        """Move ``agent``'s cursor to the newest event (after reading current state)."""
        key = keys.cursor(keys.check_name(agent, "agent"))
        head = await self._scope.store.last_seq(self._scope.room)

        def jump(view: View, _: int) -> Change:
            return Change(writes=[Put(key, {"seq": head})], result=head)

        position: int = (await self._scope.commit(jump, head, [key])).result
        return position

    async def subscribe(
        self, agent: str, *, ack: Ack = "auto", batch: int = 100, wait: float = 30.0
    ) -> AsyncIterator[Event]:
        """Yield every new event for ``agent``, waiting on the store between batches.

        With ``ack="explicit"`` the iterator keeps its own position and the caller
        acknowledges with :meth:`ack` after processing each event.
        """
        local = await self.cursor(agent)
        while True:
            if ack == "auto":
                events = await self.read_new(agent, batch)
            else:
                events = await self.read(local, batch)
            for event in events:
                local = event.seq
                yield event
            if not events:
                await self._scope.store.watch(self._scope.room, local, wait)
