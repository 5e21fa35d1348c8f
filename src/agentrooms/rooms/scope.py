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

import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

from agentrooms.commit import Change, CommitOptions, CommitResult, Transition, View, commit
from agentrooms.errors import BadRequest, InvalidTransition, NotFound, VersionConflict
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
T = TypeVar("T")

MAX_WAIT = 86_400.0  # the longest the library lets one call wait (a surface bounds it lower)
WAKE_SLACK = 0.05  # seconds past a predicted change (a lease's end) before looking again

# One try of a waiting call: its answer, whether that answer is final (``True``: return
# it at once), and in how many seconds something may change without an append (``None``:
# only an append changes it).
Try = tuple[T, bool, float | None]


def check_wait(wait: object) -> float:
    """``wait`` as seconds; ``BadRequest`` unless a number from 0 to :data:`MAX_WAIT`."""
    if (
        isinstance(wait, bool)
        or not isinstance(wait, int | float)
        or not math.isfinite(wait)
        or not 0 <= wait <= MAX_WAIT
    ):
        raise BadRequest(f"wait must be between 0 and {MAX_WAIT:g} seconds, got {wait!r}")
    return float(wait)


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

    async def until(self, wait: float, once: Callable[[], Awaitable[Try[T]]]) -> T:
        """Call ``once`` until its answer is final or ``wait`` seconds pass, then return
        that answer (the last, non-final one after ``wait``). In between it sleeps on the
        store's ``watch`` from the log's head read *before* each try, so no append made
        after a try goes unseen: woken by any append to the room's log (from any store
        handle), or when ``once`` said something changes without one. ``wait=0``: one
        try, no extra read. ``BadRequest`` for a bad ``wait``; ``once``'s errors pass
        through."""
        wait = check_wait(wait)
        if wait == 0:
            return (await once())[0]
        deadline = time.monotonic() + wait
        while True:
            head = await self.store.last_seq(self.room)
            got, final, changes_in = await once()
            left = deadline - time.monotonic()
            if final or left <= 0:
                return got
            if changes_in is not None:
                left = min(left, max(changes_in, 0.0) + WAKE_SLACK)
            await self.store.watch(self.room, head, left)

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
        guess: Snapshot | None = None,
    ) -> CommitResult:
        """:func:`agentrooms.commit.commit` in the room, guarded by its existence and
        archive state (``InvalidTransition`` / ``NotFound`` from ``check_live``).
        ``guess``: a snapshot of the room's meta and archive records and ``record_keys``
        believed current, for the first attempt instead of a read (see ``commit``)."""

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
            guess=guess,
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
