"""Event-sourced aggregates: state is the fold of the aggregate's own event stream.

An :class:`Aggregate` is a definition (its event types, a pure fold ``(state, event) ->
state``, its upcasters and snapshot policy). :class:`Aggregates` stores instances of
one aggregate in a room and guarantees:

* **Appends are conditional on the stream's position.** An append of k events to a
  stream at version n compares the head record ``agg/<type>/<id>`` with ``VersionIs``
  and, in the same transact, writes events n+1..n+k (each also checked ``Absent``),
  moves the head to n+k, and appends the events to the room log. Two concurrent appends
  cannot both commit at n: one gets ``VersionConflict`` (``append(expected_version=)``)
  or is recomputed by the commit loop (``execute``). A batch is never interleaved with
  another and an acknowledged append is never lost.
* **Reads do not scan the room log.** Each event is kept in its own record
  ``aggev/<type>/<id>/<n:012d>`` (zero-padded so key order is stream order), so loading
  one aggregate reads its head and snapshot in one snapshot read and then scans only
  its own events after the snapshot. Room log retention (``trim_log``) never loses an
  aggregate's history.
* **Snapshots** are written in the same transact as the append that crosses a multiple
  of ``snapshot_every``; they carry the fold's ``schema`` and are ignored (full replay)
  when it changed. Snapshot + tail folds to exactly the state of a full replay.
* **Old events stay readable**: every stored event is upcast to the version the fold
  knows before the fold sees it; an event the definition cannot read raises
  ``InvalidTransition`` rather than being folded wrongly or skipped.
* Events the fold rejects (by raising ``InvalidTransition``) are never stored: an
  append folds its new events before it writes them.
* **An append does not replay the stream, nor read it when nobody else wrote.** An
  :class:`Aggregates` remembers, for the streams it appended to last (up to ``KNOWN``
  per definition, in the store handle's session, shared by the Aggregates of it),
  the state after its own append and the store versions of the head record and of that
  last event's record. The next append computes from that, without reading (the commit
  loop's ``guess``): its write compares the head and that record at those versions, so
  it commits only if nobody appended since and the history is the same one (versions
  are never reused). If someone did, the compare fails and the append reads the head
  and that record: events others appended since are folded from the same view (their
  versions compared too). Anything else (the record gone or rewritten: the room was
  deleted) drops what it remembered and loads the stream as a first append does. A fold
  must be pure (it already must: a retried append folds again), and the state is
  remembered as a deep copy, so a caller changing the ``state`` it was handed changes
  nothing here.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from agentrooms.commit import Change, CommitOptions, CommitResult, View, commit
from agentrooms.errors import BadRequest, InvalidTransition, PayloadTooLarge, VersionConflict
from agentrooms.metrics import Metrics
from agentrooms.retry import RetryPolicy
from agentrooms.rooms.keys import check_name as check_id
from agentrooms.sourcing import keys
from agentrooms.sourcing.events import DomainEvent, Recorded
from agentrooms.sourcing.fold import Aggregate
from agentrooms.store.base import Store
from agentrooms.store.types import JSON, Absent, Append, Put, Record, Snapshot, Write
from agentrooms.store.validation import encode_json

__all__ = ["MAX_APPEND", "Aggregates", "Appended", "Loaded"]

S = TypeVar("S")
C = TypeVar("C")

MAX_APPEND = 1000
"""Events in one append (each is a record and a log entry in one transact)."""

KNOWN = 1000
"""Streams whose state after the last append an :class:`Aggregates` remembers."""


@dataclass(frozen=True)
class Loaded(Generic[S]):
    """An aggregate's state at stream ``version``; ``snapshot`` is the position of the
    snapshot the fold started from (0: replayed from the first event)."""

    id: str
    state: S
    version: int
    snapshot: int = 0


@dataclass(frozen=True)
class Appended(Generic[S]):
    """What an append did: events ``first``..``version`` were added (``count`` of them)
    with room log sequence numbers ``seqs``. ``state`` is the state after them (None
    when ``replayed``: the command had already been applied by an earlier delivery)."""

    id: str
    version: int
    first: int
    count: int
    seqs: list[int]
    state: S | None
    snapshot: bool = False
    replayed: bool = False


class _Folded(Generic[S]):
    """The fold of one stream up to ``version``, advanced as events are seen."""

    def __init__(self, aggregate: Aggregate[S], state: S, version: int) -> None:
        self.aggregate, self.state, self.version = aggregate, state, version

    def advance(self, n: int, stored: JSON) -> None:
        if n != self.version + 1:
            raise InvalidTransition(
                f"stream of {self.aggregate.name} has a gap: event {self.version + 1} is missing"
            )
        self.state = self.aggregate.fold(self.state, self.aggregate.read(stored))
        self.version = n

    def reset(self) -> None:
        self.state, self.version = self.aggregate.initial(), 0


@dataclass(frozen=True)
class _Known(Generic[S]):
    """A stream as this process's last append left it: ``state`` at ``version``, whose
    event record had store version ``anchor``, and the head record store version
    ``head``."""

    state: S
    version: int
    anchor: int
    head: int


class _Forgotten(Exception):
    """The remembered history is not the stream's any more (the room was deleted)."""


def _head_version(value: JSON) -> int:
    if value is None:
        return 0
    version = value.get("version") if isinstance(value, dict) else None
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidTransition(f"not an aggregate head: {value!r}")
    return version


def _guess(head_key: str, known: _Known[Any], anchor: tuple[str, int]) -> Snapshot:
    """The head and last event records as our last append left them. Nobody else
    appended since, most likely: the append computes from them without reading (its
    write compares them). Only for a caller that expects no other version than the one
    remembered: only a read can tell whether the stream has moved to another."""
    records = {
        head_key: Record(head_key, {"version": known.version}, known.head),
        anchor[0]: Record(anchor[0], None, anchor[1]),  # its value is not read
    }
    return Snapshot(records, time.time())


class Aggregates(Generic[S]):
    """The instances of ``aggregate`` in ``room`` of ``store``."""

    def __init__(
        self,
        store: Store,
        room: str,
        aggregate: Aggregate[S],
        *,
        policy: RetryPolicy | None = None,
        metrics: Metrics | None = None,
        page: int = 500,
    ) -> None:
        self.store, self.room, self.aggregate = store, room, aggregate
        self.policy, self.metrics = policy, metrics
        self.page = min(page, store.limits.max_page)
        # by (room, id), shared with the other Aggregates of this definition on this handle
        self._known: OrderedDict[tuple[str, str], _Known[S]] = store.session.heads(aggregate)

    # -- reading -------------------------------------------------------------------

    async def load(self, id: str, *, snapshots: bool = True) -> Loaded[S]:
        """The aggregate's current state (version 0 and ``initial()`` if it has no
        events). With ``snapshots=False`` it replays the whole stream."""
        folded, start = await self._load(check_id(id, "aggregate id"), snapshots)
        return Loaded(id, folded.state, folded.version, start)

    async def stream(self, id: str, after: int = 0) -> AsyncIterator[Recorded]:
        """The stream's events after position ``after``, upcast, in order."""
        check_id(id, "aggregate id")
        async for n, stored in self._scan(id, after):
            yield Recorded(self.aggregate.name, id, n, self.aggregate.read(stored))

    async def history(self, id: str, after: int = 0) -> list[Recorded]:
        return [r async for r in self.stream(id, after)]

    async def _scan(self, id: str, after: int) -> AsyncIterator[tuple[int, JSON]]:
        prefix = keys.events_prefix(self.aggregate.name, id)
        cursor = keys.event(self.aggregate.name, id, after) if after > 0 else None
        while True:
            page = await self.store.scan(self.room, prefix, cursor, self.page)
            for record in page.records:
                yield int(record.key[len(prefix) :]), record.value
            if page.next_after is None:
                return
            cursor = page.next_after

    async def _load(self, id: str, snapshots: bool) -> tuple[_Folded[S], int]:
        agg = self.aggregate
        head_key, snap_key = keys.head(agg.name, id), keys.snapshot(agg.name, id)
        snap = await self.store.read(self.room, [head_key, snap_key])
        head = _head_version(snap.value(head_key))
        folded = _Folded(agg, agg.initial(), 0)
        stored: JSON = snap.value(snap_key) if snapshots else None
        if _usable_snapshot(stored, agg.schema, head):
            folded.state, folded.version = agg.decode(stored["state"]), stored["n"]
        start = folded.version
        async for n, event in self._scan(id, start):
            folded.advance(n, event)
        if folded.version < head:
            raise InvalidTransition(f"stream {agg.name}/{id} lost events after {folded.version}")
        return folded, start

    # -- writing -------------------------------------------------------------------

    async def append(
        self,
        id: str,
        events: Sequence[DomainEvent],
        *,
        expected_version: int | None = None,
        command_id: str | None = None,
        author: str | None = None,
    ) -> Appended[S]:
        """Append ``events`` as one block. With ``expected_version`` the append commits
        only if the stream is still at that version, else raises ``VersionConflict``;
        without, it goes at the end whatever the version (retried on conflict).
        ``author``: the agent appending, the author of each event in the room's log."""
        batch = [self.aggregate.check_new(e) for e in events]
        if expected_version is not None:
            expected_version = _check_position(expected_version, "expected_version")
        payload = {"events": [[str(e.type), e.data] for e in batch], "expected": expected_version}
        return await self._commit(
            id, lambda state, _: batch, payload, expected_version, command_id, author
        )

    async def execute(
        self,
        id: str,
        decide: Callable[[S, C], Sequence[DomainEvent]],
        command: C,
        *,
        command_id: str | None = None,
        author: str | None = None,
    ) -> Appended[S]:
        """Run ``decide(state, command) -> events`` on the current state and append
        what it returns, recomputing from the new state on conflict. ``decide`` must be
        pure; it raises ``InvalidTransition`` to refuse the command. With
        ``command_id`` (and a JSON ``command``) a redelivered command appends nothing.
        ``author``: the agent commanding, the author of each event in the room's log."""
        return await self._commit(id, decide, command, None, command_id, author)

    async def snapshot(self, id: str) -> int:
        """Write a snapshot at the stream's current version now; returns that version."""
        agg = self.aggregate
        folded, _ = await self._load(check_id(id, "aggregate id"), True)
        head_key = keys.head(agg.name, id)

        def write(view: View, _: None) -> Change:
            m = self._catch_up(view, id, folded)
            if m == 0:
                return Change(result=0)
            value = {"n": m, "schema": agg.schema, "state": agg.encode(folded.state)}
            return Change(writes=[Put(keys.snapshot(agg.name, id), value)], result=m)

        done = await commit(
            self.store, self.room, write, None, keys=[head_key], options=self._options()
        )
        version: int = done.result
        return version

    def _options(self) -> CommitOptions:
        return CommitOptions(policy=self.policy, metrics=self.metrics)

    def _catch_up(self, view: View, id: str, folded: _Folded[S]) -> int:
        """Bring ``folded`` to the head in ``view``, reading missed events through the
        view (so their versions are compared too); returns the head version."""
        agg = self.aggregate
        m = _head_version(view.get(keys.head(agg.name, id)))
        if m < folded.version:
            folded.reset()  # the room was deleted since the load
        # the events we missed, read in one re-read (at most a page of them: a longer
        # gap costs one re-read per page)
        end = min(m, folded.version + self.page)
        view.need(keys.event(agg.name, id, n) for n in range(folded.version + 1, end + 1))
        while folded.version < m:
            stored = view.get(keys.event(agg.name, id, folded.version + 1))
            if stored is None:
                raise InvalidTransition(f"stream {agg.name}/{id} lost event {folded.version + 1}")
            folded.advance(folded.version + 1, stored)
        return m

    async def _commit(
        self,
        id: str,
        decide: Callable[[S, C], Sequence[DomainEvent]],
        command: C,
        expected: int | None,
        command_id: str | None,
        author: str | None = None,
    ) -> Appended[S]:
        agg = self.aggregate
        check_id(id, "aggregate id")
        if author is not None:
            check_id(author, "author")
        known = self._known.pop((self.room, id), None)
        # (the key of the last event we folded, the store version it must still have)
        anchor: tuple[str, int] | None = None
        if known is None:
            folded, _ = await self._load(id, True)
        else:
            folded = _Folded(agg, known.state, known.version)
            anchor = (keys.event(agg.name, id, known.version), known.anchor)
        head_key = keys.head(agg.name, id)
        after: list[Any] = []
        guess = None
        if known is not None and anchor is not None and expected in (None, known.version):
            guess = _guess(head_key, known, anchor)

        def transition(view: View, cmd: C) -> Change:
            if anchor is not None and view.version(anchor[0]) != anchor[1]:
                raise _Forgotten
            m = self._catch_up(view, id, folded)
            if expected is not None and expected != m:
                raise VersionConflict(
                    {head_key: view.version(head_key)},
                    f"{agg.name}/{id} is at version {m}, not the expected {expected}",
                )
            new = [agg.check_new(e) for e in decide(folded.state, cmd)]
            if len(new) > MAX_APPEND:
                raise BadRequest(f"append at most {MAX_APPEND} events at once")
            state = agg.replay(new, folded.state)
            change = self._change(id, m, new, state, author)
            after[:] = [state]
            return change

        try:
            done = await commit(
                self.store,
                self.room,
                transition,
                command,
                keys=[head_key, *([anchor[0]] if anchor else [])],
                command_id=command_id,
                guess=guess,
                options=self._options(),
            )
        except _Forgotten:
            return await self._commit(id, decide, command, expected, command_id, author)
        outcome = done.result
        if not done.replayed and outcome["count"]:
            self._remember(id, done, after[0])
        return Appended(
            id,
            outcome["version"],
            outcome["first"],
            outcome["count"],
            list(done.seqs),
            None if done.replayed else after[0],
            outcome["snapshot"],
            done.replayed,
        )

    def _remember(self, id: str, done: CommitResult, state: S) -> None:
        """What our append left: ``state`` (a copy) at the stream's new version, and the
        store versions of its head and last event records."""
        version = done.result["version"]
        last, head = (
            keys.event(self.aggregate.name, id, version),
            keys.head(self.aggregate.name, id),
        )
        known = _Known(copy.deepcopy(state), version, done.versions[last], done.versions[head])
        self._known[(self.room, id)] = known
        while len(self._known) > KNOWN:
            self._known.popitem(last=False)

    def _change(
        self, id: str, m: int, new: list[DomainEvent], state: S, author: str | None = None
    ) -> Change:
        agg = self.aggregate
        end = m + len(new)
        if end > keys.MAX_STREAM:
            raise BadRequest(f"stream {agg.name}/{id} is full")
        writes: list[Write] = []
        appends: list[Append] = []
        for n, event in enumerate(new, m + 1):
            writes.append(
                Put(keys.event(agg.name, id, n), {"type": str(event.type), "data": event.data})
            )
            data = {"aggregate": agg.name, "id": id, "n": n, "data": event.data}
            appends.append(Append(str(event.type), data, author))
        snapshot = self._snapshot_write(id, m, end, state) if new else None
        if snapshot is not None:
            writes.append(snapshot)
        if new:
            writes.append(Put(keys.head(agg.name, id), {"version": end}))
        result = {"version": end, "first": m + 1, "count": len(new), "snapshot": bool(snapshot)}
        requires = [Absent(keys.event(agg.name, id, n)) for n in range(m + 1, end + 1)]
        return Change(writes=writes, appends=appends, requires=requires, result=result)

    def _snapshot_write(self, id: str, m: int, end: int, state: S) -> Put | None:
        every = self.aggregate.snapshot_every
        if not every or end // every == m // every:
            return None
        value = {"n": end, "schema": self.aggregate.schema, "state": self.aggregate.encode(state)}
        try:
            encode_json(
                value, f"snapshot of {self.aggregate.name}/{id}", self.store.limits.max_value_bytes
            )
        except PayloadTooLarge:
            return None  # too large to snapshot: loads replay from the previous one
        except BadRequest as exc:
            raise BadRequest(
                f"the state of {self.aggregate.name} is not JSON; give the aggregate an "
                f"encode/decode pair ({exc})"
            ) from exc
        return Put(keys.snapshot(self.aggregate.name, id), value)


def _usable_snapshot(stored: JSON, schema: int, head: int) -> bool:
    return (
        isinstance(stored, dict)
        and stored.get("schema") == schema
        and isinstance(stored.get("n"), int)
        and 0 < stored["n"] <= head
        and "state" in stored
    )


def _check_position(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{what} must be a non-negative integer; got {value!r}")
    return value
