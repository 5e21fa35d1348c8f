"""What every part of a room shares: the store, the room's name, and the guard that
turns writes into a missing or archived room into ``NotFound`` / ``InvalidTransition``.

Every write of a room part either runs through :meth:`Scope.commit` (which reads the
room's ``_meta`` and ``_archived`` records with its snapshot, so their versions are
compared like any other) or through :meth:`Scope.transact` (which compares
``Present(_meta)`` and ``Absent(_archived)``). Neither record changes in normal work, so
the guard costs no conflicts, only two keys in the same round trip.

Without a policy of the room's own, room operations retry with :data:`ROOM_POLICY`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from agentrooms.commit import Change, CommitOptions, CommitResult, Transition, View, commit
from agentrooms.errors import InvalidTransition, NotFound, VersionConflict
from agentrooms.metrics import Metrics, operator_metrics
from agentrooms.retry import FullJitter, RetryPolicy
from agentrooms.rooms import keys
from agentrooms.store.base import Store
from agentrooms.store.types import (
    Absent,
    Append,
    Compare,
    Present,
    Record,
    Snapshot,
    TransactResult,
    Write,
)
from agentrooms.store.validation import check_limit

E = TypeVar("E")

# Room operations retry with a 2 ms backoff base, not the commit loop's default: their
# re-read mostly settles a conflict (docs/why.md, "Backoff bases").
ROOM_POLICY = RetryPolicy(backoff=FullJitter(base=0.002))


class Scope:
    def __init__(
        self,
        store: Store,
        room: str,
        *,
        policy: RetryPolicy | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.room = keys.check_name(room, "room name")
        self.policy = policy
        self.metrics = metrics

    def missing(self) -> NotFound:
        return NotFound(f"room {self.room!r} does not exist")

    def archived(self) -> InvalidTransition:
        return InvalidTransition(f"room {self.room!r} is archived (read-only)")

    def check_live(self, snapshot: Snapshot | View) -> None:
        if not snapshot.exists(keys.META):
            raise self.missing()
        if snapshot.exists(keys.ARCHIVED):
            raise self.archived()

    async def read(self, record_keys: Sequence[str]) -> Snapshot:
        """A snapshot of ``record_keys``; ``NotFound`` if the room does not exist."""
        snap = await self.store.read(self.room, [keys.META, *record_keys])
        if snap.get(keys.META) is None:
            raise self.missing()
        return snap

    async def page(
        self,
        prefix: str,
        limit: int,
        after: str | None,
        keep: Callable[[Record, float], bool] | None = None,
    ) -> tuple[list[Record], float, str | None]:
        """Up to ``limit`` records under ``prefix`` whose name (the key less ``prefix``)
        sorts after ``after`` and that ``keep`` accepts (given the record and the scan's
        store clock), in key order; the store clock of
        the last scan; and the name to pass as ``after`` next (``None``: none follows).
        One scan of ``limit`` records unless ``keep`` refuses some; ``NotFound`` if the
        room does not exist; ``BadRequest`` for a ``limit`` outside 1 ..
        ``limits.max_page``."""
        limit = check_limit(limit, self.store.limits)
        await self.read([])
        cursor = None if after is None else prefix + after
        out: list[Record] = []
        while True:
            scan = await self.store.scan(self.room, prefix, cursor, limit)
            for i, record in enumerate(scan.records):
                if keep is None or keep(record, scan.now):
                    out.append(record)
                if len(out) == limit:
                    more = i + 1 < len(scan.records) or scan.next_after is not None
                    return out, scan.now, record.key[len(prefix) :] if more else None
            if scan.next_after is None:
                return out, scan.now, None
            cursor = scan.next_after

    async def commit(
        self,
        transition: Transition[E],
        event: E,
        record_keys: Iterable[str] = (),
        *,
        command_id: str | None = None,
        policy: RetryPolicy | None = None,
    ) -> CommitResult:
        def guarded(view: View, ev: E) -> Change:
            self.check_live(view)
            return transition(view, ev)

        return await commit(
            self.store,
            self.room,
            guarded,
            event,
            keys=[keys.META, keys.ARCHIVED, *record_keys],
            command_id=command_id,
            options=CommitOptions(
                policy=policy or self.policy or ROOM_POLICY, metrics=self.metrics
            ),
        )

    async def transact(
        self,
        compares: Iterable[Compare] = (),
        writes: Iterable[Write] = (),
        appends: Iterable[Append] = (),
    ) -> TransactResult:
        """A transact guarded by the room's existence and archive state (its lease and
        effect events counted in :class:`~agentrooms.metrics.OperatorMetrics`)."""
        appending = list(appends)
        try:
            done = await self.store.transact(
                self.room,
                [Present(keys.META), Absent(keys.ARCHIVED), *compares],
                writes,
                appending,
            )
        except VersionConflict as exc:
            if keys.META in exc.conflicts:
                raise self.missing() from exc
            if keys.ARCHIVED in exc.conflicts:
                raise self.archived() from exc
            raise
        operator_metrics().appended(append.type for append in appending)
        return done
