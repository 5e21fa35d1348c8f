"""Projections: read models folded from the room's event log, kept in records.

A :class:`Projection` is a name, a version and a handler ``handle(rows, event)`` that
folds one domain event into the read model's rows (``rows.get`` / ``put`` /
``delete``). A :class:`Projector` runs one projection version in one room and
guarantees:

* **Every domain event is folded exactly once, in log order.** The projection's
  position (the last folded sequence number) lives in ``projpos/<name>/v<k>`` and is
  written in the same transact as the rows a batch changed; the transact compares the
  position's version and every row the handler read. Any number of projector processes
  may run ``catch_up`` at once: one batch commits, the others re-read and continue from
  the new position. Events that are not domain events (plan, lock, room events) are
  skipped, and the position moves past them.
* **Positions are sequence numbers, never timestamps**, and a position the log has
  trimmed raises ``CursorCompacted`` (from ``catch_up`` and from ``rebuild``, which
  checks before it changes anything), never a silent gap.
* ``rebuild()`` replays from the first event into an emptied read model; concurrent
  catch-ups pause while it runs, and of two concurrent rebuilds the later one wins.
* A retired version (see :mod:`agentrooms.sourcing.migration`) refuses to run.

Handlers must be deterministic and free of side effects: a batch can be recomputed on
conflict, and before the real run a *dry run* (rows read as absent, errors ignored)
learns which rows a batch reads so they are fetched in the same round trip.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrooms.commit import Change, CommitOptions, View, commit
from agentrooms.errors import BadRequest, InvalidTransition, VersionConflict
from agentrooms.metrics import Metrics
from agentrooms.retry import RetryPolicy
from agentrooms.sourcing import keys
from agentrooms.sourcing.events import (
    DomainEvent,
    EventType,
    Recorded,
    Upcasters,
    check_name,
    check_version,
)
from agentrooms.store.base import Store
from agentrooms.store.types import JSON, Delete, Event, Put, VersionIs, Write

__all__ = [
    "LIVE",
    "REBUILDING",
    "RETIRED",
    "Projection",
    "ProjectionStatus",
    "Projector",
    "ReadModel",
    "Rows",
    "domain_event",
]

LIVE, REBUILDING, RETIRED = "live", "rebuilding", "retired"
_STATUSES = (LIVE, REBUILDING, RETIRED)
_ABSENT = object()


def row_key(prefix: str, row: object) -> str:
    """The record key of ``row`` under a read model's ``prefix``."""
    if not isinstance(row, str) or not row:
        raise BadRequest(f"a row name is a non-empty string; got {row!r}")
    return prefix + row


class Rows:
    """The rows of one read model as a handler sees them during a batch: reads see the
    batch's own earlier writes; writes are collected and committed with the position."""

    def __init__(self, read: Callable[[str], JSON], prefix: str) -> None:
        self._read, self._prefix = read, prefix
        self._staged: dict[str, Any] = {}

    def _key(self, row: object) -> str:
        return row_key(self._prefix, row)

    def get(self, row: str, default: JSON = None) -> JSON:
        key = self._key(row)
        value = self._staged[key] if key in self._staged else self._read(key)
        return default if value is None or value is _ABSENT else value

    def put(self, row: str, value: JSON) -> None:
        if value is None:
            raise BadRequest("a row's value cannot be null; use delete")
        self._staged[self._key(row)] = value

    def delete(self, row: str) -> None:
        self._staged[self._key(row)] = _ABSENT

    def writes(self) -> list[Write]:
        return [
            Delete(key) if value is _ABSENT else Put(key, value)
            for key, value in self._staged.items()
        ]


Handler = Callable[[Rows, Recorded], None]


@dataclass(frozen=True)
class Projection:
    """A read model: ``handle(rows, event)`` folds each domain event (upcast through
    ``upcasters`` as far as their chains go) into rows. ``version`` names the layout of
    the rows: a new version is built alongside the old one (see migration)."""

    name: str
    handle: Handler
    version: int = 1
    upcasters: Upcasters = field(default_factory=Upcasters)
    batch: int = 100

    def __post_init__(self) -> None:
        check_name(self.name, "projection name")
        check_version(self.version, "projection version")
        if not callable(self.handle):
            raise BadRequest("a projection's handle must be callable")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int):
            raise BadRequest("batch must be an integer")
        if not 1 <= self.batch <= 1000:
            raise BadRequest("batch must be from 1 to 1000 events")


@dataclass(frozen=True, slots=True)
class ProjectionStatus:
    name: str
    version: int
    position: int
    status: str  # live, rebuilding or retired
    head: int  # the room log's newest sequence number when read

    @property
    def lag(self) -> int:
        return max(0, self.head - self.position)


def domain_event(event: Event) -> Recorded | None:
    """The domain event an entry of the room log carries, or None for other events."""
    try:
        kind = EventType.parse(event.type)
    except BadRequest:
        return None
    data = event.data
    if not isinstance(data, dict) or set(data) != {"aggregate", "id", "n", "data"}:
        return None
    n = data["n"]
    if not (isinstance(data["aggregate"], str) and isinstance(data["id"], str)):
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return None
    domain = DomainEvent(kind.name, kind.version, data["data"])
    return Recorded(data["aggregate"], data["id"], n, domain, event.seq, event.time)


def parse_position(value: JSON) -> tuple[int, str, str | None]:
    """(position, status, rebuild token) of a position record (absent: 0, live)."""
    if value is None:
        return 0, LIVE, None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("position"), int)
        or value.get("status") not in _STATUSES
    ):
        raise InvalidTransition(f"not a projection position: {value!r}")
    return value["position"], value["status"], value.get("token")


class Projector:
    """Runs version ``projection.version`` of a projection in ``room``."""

    def __init__(
        self,
        store: Store,
        room: str,
        projection: Projection,
        *,
        policy: RetryPolicy | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store, self.room, self.projection = store, room, projection
        self.policy, self.metrics = policy, metrics
        self.pos_key = keys.position(projection.name, projection.version)
        self.prefix = keys.rows_prefix(projection.name, projection.version)
        self.active_key = keys.active(projection.name)

    # -- reading ---------------------------------------------------------------------

    async def status(self) -> ProjectionStatus:
        snap = await self.store.read(self.room, [self.pos_key])
        position, status, _ = parse_position(snap.value(self.pos_key))
        head = await self.store.last_seq(self.room)
        return ProjectionStatus(
            self.projection.name, self.projection.version, position, status, head
        )

    async def get(self, row: str, default: JSON = None) -> JSON:
        """One row of this version's read model (``default`` if absent)."""
        key = row_key(self.prefix, row)
        return (await self.store.read(self.room, [key])).value(key, default)

    async def rows(
        self, prefix: str = "", after: str | None = None, limit: int = 100
    ) -> tuple[dict[str, JSON], str | None]:
        """Rows whose name starts with ``prefix``, in order, after row ``after``; and
        the row name to pass as ``after`` for the next page (None: complete)."""
        return await _page(self.store, self.room, self.prefix, prefix, after, limit)

    # -- running ---------------------------------------------------------------------

    async def catch_up(self, *, max_batches: int | None = None) -> int:
        """Fold every event after the position (all of them, or ``max_batches``
        batches); returns the new position. Returns early while a rebuild runs;
        ``InvalidTransition`` if this version is retired; ``CursorCompacted`` if the log
        was trimmed past the position."""
        batches = 0
        while max_batches is None or batches < max_batches:
            snap = await self.store.read(self.room, [self.pos_key])
            position, status, _ = parse_position(snap.value(self.pos_key))
            if status == RETIRED:
                raise self._retired()
            if status == REBUILDING:
                return position
            events = await self.store.read_log(self.room, position, self.projection.batch)
            if not events:
                return position
            await self._fold(position, events)
            batches += 1
        return (await self.status()).position

    async def _fold(self, position: int, events: list[Event]) -> None:
        recorded = [r for r in map(domain_event, events) if r is not None]
        upcasters = self.projection.upcasters
        recorded = [
            Recorded(r.aggregate, r.id, r.n, upcasters.upcast(r.event), r.seq, r.time)
            for r in recorded
        ]
        last = events[-1].seq

        def fold(view: View, _: None) -> Change:
            if parse_position(view.get(self.pos_key)) != (position, LIVE, None):
                return Change()  # moved on, retired or rebuilding: the caller re-reads
            rows = Rows(view.get, self.prefix)
            for event in recorded:
                self.projection.handle(rows, event)
            writes = [*rows.writes(), Put(self.pos_key, {"position": last, "status": LIVE})]
            if not view.exists(self.active_key):
                writes.append(Put(self.active_key, {"version": self.projection.version}))
            return Change(writes=writes)

        hint = self._dry_run(recorded)
        await commit(
            self.store,
            self.room,
            fold,
            None,
            keys=[self.pos_key, self.active_key, *hint],
            options=CommitOptions(policy=self.policy, metrics=self.metrics),
        )

    def _dry_run(self, recorded: list[Recorded]) -> list[str]:
        """The row keys the handler reads for this batch, learned by running it with
        every row absent (so they are read and compared in the first round trip)."""
        seen: dict[str, None] = {}

        def read(key: str) -> JSON:
            seen[key] = None
            return None

        rows = Rows(read, self.prefix)
        with contextlib.suppress(Exception):
            for event in recorded:
                self.projection.handle(rows, event)
        return list(seen)

    def _retired(self) -> InvalidTransition:
        p = self.projection
        return InvalidTransition(f"projection {p.name} v{p.version} is retired")

    async def rebuild(self) -> int:
        """Empty the read model and fold the whole log again; returns the position.

        Raises ``CursorCompacted`` (changing nothing) if the log no longer starts at its
        first event. Catch-ups pause while it runs; a concurrent later rebuild takes
        over (this one then returns without finishing).
        """
        await self.store.read_log(self.room, 0, 1)  # CursorCompacted if the start is gone
        token = uuid.uuid4().hex
        version = await self._mark({"position": 0, "status": REBUILDING, "token": token})
        try:
            await self._drop_rows(version)
            await self.store.transact(
                self.room,
                [VersionIs(self.pos_key, version)],
                [Put(self.pos_key, {"position": 0, "status": LIVE})],
            )
        except VersionConflict:
            return (await self.status()).position  # another rebuild took over
        return await self.catch_up()

    async def retire(self) -> None:
        """Stop this version for good and delete its rows (used by contract and
        rollback). Its position record stays as a tombstone, so an old process still
        running it gets ``InvalidTransition`` instead of rebuilding it from scratch."""
        record = (await self.store.read(self.room, [self.pos_key])).get(self.pos_key)
        position, status, _ = parse_position(None if record is None else record.value)
        if record is None or status != RETIRED:
            version = await self._mark({"position": position, "status": RETIRED})
        else:
            version = record.version
        await self._drop_rows(version)  # nothing changes a retired position: no conflict

    async def _mark(self, value: JSON) -> int:
        """Write the position record (unless retired); returns its new version."""

        def mark(view: View, _: None) -> Change:
            if parse_position(view.get(self.pos_key))[1] == RETIRED:
                if value["status"] == RETIRED:
                    return Change(result=view.version(self.pos_key))  # a concurrent retire
                raise self._retired()
            return Change(writes=[Put(self.pos_key, value)])

        done = await commit(
            self.store,
            self.room,
            mark,
            None,
            keys=[self.pos_key],
            options=CommitOptions(policy=self.policy, metrics=self.metrics),
        )
        version = done.versions.get(self.pos_key)
        return int(done.result) if version is None else version

    async def _drop_rows(self, pos_version: int) -> None:
        """Delete every row, a page per transact, each guarded by the position record
        still being at ``pos_version`` (``VersionConflict`` when something took over)."""
        page_size = min(500, self.store.limits.max_ops - 1)
        while True:
            page = await self.store.scan(self.room, self.prefix, None, page_size)
            if not page.records:
                return
            await self.store.transact(
                self.room,
                [VersionIs(self.pos_key, pos_version)],
                [Delete(r.key) for r in page.records],
            )


class ReadModel:
    """What readers use: the rows of the projection version that is *active* (the one
    ``projactive/<name>`` names), so a migration switches every reader at once."""

    def __init__(self, store: Store, room: str, name: str) -> None:
        self.store, self.room = store, room
        self.name = check_name(name, "projection name")
        self.active_key = keys.active(self.name)

    async def version(self) -> int | None:
        """The active version (None before any projection of this name ran)."""
        value = (await self.store.read(self.room, [self.active_key])).value(self.active_key)
        return None if value is None else int(value["version"])

    async def get(self, row: str, default: JSON = None) -> JSON:
        """A row of the active version, read in one snapshot with the pointer."""
        version = await self.version()
        while version is not None:
            key = row_key(keys.rows_prefix(self.name, version), row)
            snap = await self.store.read(self.room, [self.active_key, key])
            pointer = snap.value(self.active_key)
            if pointer is not None and pointer["version"] == version:
                return snap.value(key, default)
            version = None if pointer is None else int(pointer["version"])
        return default

    async def rows(
        self, prefix: str = "", after: str | None = None, limit: int = 100
    ) -> tuple[dict[str, JSON], str | None]:
        version = await self.version()
        if version is None:
            return {}, None
        base = keys.rows_prefix(self.name, version)
        return await _page(self.store, self.room, base, prefix, after, limit)


async def _page(
    store: Store, room: str, base: str, prefix: str, after: str | None, limit: int
) -> tuple[dict[str, JSON], str | None]:
    if not isinstance(prefix, str) or (after is not None and not isinstance(after, str)):
        raise BadRequest("prefix and after are strings")
    page = await store.scan(room, base + prefix, None if after is None else base + after, limit)
    rows = {r.key[len(base) :]: r.value for r in page.records}
    return rows, None if page.next_after is None else page.next_after[len(base) :]
