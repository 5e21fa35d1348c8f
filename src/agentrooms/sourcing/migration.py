"""Expand / migrate / contract: change a projection's layout without stopping readers.

The discipline for schema changes, as a state machine recorded in
``projmig/<name>`` and moved only by conditional writes::

    (none) ──expand──> expanding ──migrate──> migrated ──contract──> contracting ──> contracted
                           │                      │
                           └──────rollback────────┴──> rolled_back

* **expand**: version *new* is built alongside *old* (from the first event; readers
  still use *old*, which keeps running).
* **migrate**: once *new* has folded at least as far as *old*, the active pointer
  ``projactive/<name>`` switches to *new* in one transact that compares both positions,
  so every reader moves at once and never sees a read model behind the one it left.
* **contract**: *old* is retired (its position becomes a tombstone, so a process still
  running the old code stops with ``InvalidTransition``) and its rows are deleted.
* **rollback** (from expanding or migrated): the pointer goes back to *old* and *new*
  is retired.

Every step is idempotent and resumable: re-running it after a crash finishes it, and
running a step the state does not allow raises ``InvalidTransition`` naming the phase.
``migrate_projection`` is the single entry point for the CLI.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, TypeAlias

from agentrooms.commit import Change, CommitOptions, View, commit
from agentrooms.errors import BadRequest, ContentionExhausted, InvalidTransition
from agentrooms.metrics import Metrics
from agentrooms.retry import RetryPolicy
from agentrooms.sourcing import keys
from agentrooms.sourcing.projections import LIVE, RETIRED, Projection, Projector, parse_position
from agentrooms.store.base import Store
from agentrooms.store.types import JSON, Put

__all__ = [
    "MigrationStatus",
    "Phase",
    "ProjectionMigration",
    "Step",
    "migrate_projection",
    "resolve_projection",
]


class Phase(StrEnum):
    EXPANDING = "expanding"
    MIGRATED = "migrated"
    CONTRACTING = "contracting"
    CONTRACTED = "contracted"
    ROLLED_BACK = "rolled_back"


_ORDER = [Phase.EXPANDING, Phase.MIGRATED, Phase.CONTRACTING, Phase.CONTRACTED]

_Transition: TypeAlias = Callable[[View], Change]

Step = Literal["status", "expand", "migrate", "contract", "all", "rollback"]


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    name: str
    old: int
    new: int
    phase: Phase | None  # None: this migration was never started
    active: int | None  # the version readers use
    old_position: int
    new_position: int
    head: int  # the room log's newest sequence number

    @property
    def caught_up(self) -> bool:
        return self.new_position >= self.old_position


def _record(value: JSON) -> tuple[int, int, Phase] | None:
    if value is None:
        return None
    try:
        return int(value["from"]), int(value["to"]), Phase(value["phase"])
    except (TypeError, KeyError, ValueError) as exc:
        raise InvalidTransition(f"not a migration record: {value!r}") from exc


class ProjectionMigration:
    """The migration of projection ``old.name`` from ``old.version`` to ``new.version``."""

    def __init__(
        self,
        store: Store,
        room: str,
        old: Projection,
        new: Projection,
        *,
        policy: RetryPolicy | None = None,
        metrics: Metrics | None = None,
        max_rounds: int = 50,
    ) -> None:
        if not isinstance(old, Projection) or not isinstance(new, Projection):
            raise BadRequest("a migration goes from one Projection to another")
        if old.name != new.name:
            raise BadRequest(f"cannot migrate projection {old.name} to {new.name}: names differ")
        if old.version == new.version:
            raise BadRequest(f"{old.name}: old and new are both version {old.version}")
        self.store, self.room, self.name = store, room, old.name
        self.old, self.new = old.version, new.version
        self.old_runner = Projector(store, room, old, policy=policy, metrics=metrics)
        self.new_runner = Projector(store, room, new, policy=policy, metrics=metrics)
        self.policy, self.metrics, self.max_rounds = policy, metrics, max_rounds
        self.mig_key, self.active_key = keys.migration(self.name), keys.active(self.name)

    async def status(self) -> MigrationStatus:
        snap = await self.store.read(self.room, [self.mig_key, self.active_key])
        record = _record(snap.value(self.mig_key))
        phase = record[2] if record is not None and record[:2] == (self.old, self.new) else None
        active = snap.value(self.active_key)
        old, new = await self.old_runner.status(), await self.new_runner.status()
        return MigrationStatus(
            self.name,
            self.old,
            self.new,
            phase,
            None if active is None else int(active["version"]),
            old.position,
            new.position,
            max(old.head, new.head),
        )

    # -- steps ---------------------------------------------------------------------

    async def expand(self) -> MigrationStatus:
        """Start building the new version alongside the old one, and catch both up."""
        phase = await self._step(self._expand, [self.new_runner.pos_key])
        if phase == Phase.EXPANDING:
            await self.old_runner.catch_up()
            await self.new_runner.catch_up()
        return await self.status()

    async def migrate(self) -> MigrationStatus:
        """Switch readers to the new version as soon as it has caught up with the old."""
        started = time.monotonic()
        for _ in range(self.max_rounds):
            current = await self.status()
            if current.phase is not None and current.phase != Phase.EXPANDING:
                self._require(current.phase, Phase.MIGRATED, "migrate")
                return current
            if current.phase is None:
                raise InvalidTransition(f"{self._label()} has not been expanded")
            await self.old_runner.catch_up()
            await self.new_runner.catch_up()
            done = await self._step(
                self._switch, [self.old_runner.pos_key, self.new_runner.pos_key]
            )
            if done != Phase.EXPANDING:
                return await self.status()
        raise ContentionExhausted(
            self.max_rounds, time.monotonic() - started, [self.new_runner.pos_key]
        )

    async def contract(self) -> MigrationStatus:
        """Retire the old version and delete its rows (after ``migrate``)."""
        phase = await self._step(self._begin_contract, [])
        if phase == Phase.CONTRACTING:
            await self.old_runner.retire()
            await self._step(self._finish_contract, [])
        return await self.status()

    async def rollback(self) -> MigrationStatus:
        """Point readers back at the old version and retire the new one."""
        await self._step(self._rollback, [self.old_runner.pos_key])
        await self.new_runner.retire()
        await self.old_runner.catch_up()
        return await self.status()

    # -- transitions (pure: each decides from the records it read) -----------------

    async def _step(self, transition: _Transition, extra: list[str]) -> Phase:
        done = await commit(
            self.store,
            self.room,
            lambda view, _: transition(view),
            None,
            keys=[self.mig_key, self.active_key, *extra],
            options=CommitOptions(policy=self.policy, metrics=self.metrics),
        )
        return Phase(done.result)

    def _label(self) -> str:
        return f"migration of {self.name} v{self.old} -> v{self.new}"

    def _mine(self, view: View) -> Phase | None:
        """This migration's phase; ``InvalidTransition`` if another one is recorded and
        still open."""
        record = _record(view.get(self.mig_key))
        if record is None:
            return None
        if record[:2] == (self.old, self.new):
            return record[2]
        if record[2] in (Phase.CONTRACTED, Phase.ROLLED_BACK):
            return None
        raise InvalidTransition(
            f"the migration of {self.name} v{record[0]} -> v{record[1]} is {record[2]}"
        )

    def _require(self, phase: Phase | None, at_least: Phase, step: str) -> None:
        if phase == Phase.ROLLED_BACK:
            raise InvalidTransition(f"{self._label()} was rolled back; {step} needs a new version")
        if phase is None or _ORDER.index(phase) < _ORDER.index(at_least):
            raise InvalidTransition(f"cannot {step}: {self._label()} is {phase or 'not started'}")

    def _put(self, phase: Phase) -> Put:
        return Put(self.mig_key, {"from": self.old, "to": self.new, "phase": str(phase)})

    def _expand(self, view: View) -> Change:
        phase = self._mine(view)
        if phase is not None:
            self._require(phase, Phase.EXPANDING, "expand")
            return Change(result=str(phase))
        active = view.get(self.active_key)
        version = None if active is None else int(active["version"])
        if version is not None and version != self.old:
            raise InvalidTransition(
                f"readers use {self.name} v{version}; a migration must start from it, "
                f"not from v{self.old}"
            )
        if parse_position(view.get(self.new_runner.pos_key))[1] == RETIRED:
            raise InvalidTransition(f"{self.name} v{self.new} was retired; use a new version")
        writes = [self._put(Phase.EXPANDING)]
        if version is None:
            writes.append(Put(self.active_key, {"version": self.old}))
        return Change(writes=writes, result=str(Phase.EXPANDING))

    def _switch(self, view: View) -> Change:
        phase = self._mine(view)
        if phase != Phase.EXPANDING:
            self._require(phase, Phase.MIGRATED, "migrate")
            return Change(result=str(phase))
        old = parse_position(view.get(self.old_runner.pos_key))
        new = parse_position(view.get(self.new_runner.pos_key))
        if new[1] != LIVE or new[0] < old[0]:
            return Change(result=str(Phase.EXPANDING))  # not caught up yet: another round
        writes = [Put(self.active_key, {"version": self.new}), self._put(Phase.MIGRATED)]
        return Change(writes=writes, result=str(Phase.MIGRATED))

    def _begin_contract(self, view: View) -> Change:
        phase = self._mine(view)
        self._require(phase, Phase.MIGRATED, "contract")
        if phase == Phase.MIGRATED:
            return Change(writes=[self._put(Phase.CONTRACTING)], result=str(Phase.CONTRACTING))
        return Change(result=str(phase))

    def _finish_contract(self, view: View) -> Change:
        phase = self._mine(view)
        if phase == Phase.CONTRACTING:
            return Change(writes=[self._put(Phase.CONTRACTED)], result=str(Phase.CONTRACTED))
        self._require(phase, Phase.CONTRACTED, "contract")
        return Change(result=str(phase))

    def _rollback(self, view: View) -> Change:
        phase = self._mine(view)
        if phase == Phase.ROLLED_BACK:
            return Change(result=str(phase))
        if phase not in (Phase.EXPANDING, Phase.MIGRATED):
            raise InvalidTransition(
                f"cannot roll back: {self._label()} is {phase or 'not started'}"
            )
        writes = [Put(self.active_key, {"version": self.old}), self._put(Phase.ROLLED_BACK)]
        return Change(writes=writes, result=str(Phase.ROLLED_BACK))


def resolve_projection(ref: Projection | str) -> Projection:
    """A projection, or a ``"package.module:attribute"`` reference to one (for the CLI)."""
    if isinstance(ref, Projection):
        return ref
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise BadRequest(f"a projection reference is 'package.module:attribute'; got {ref!r}")
    module_name, attribute = ref.split(":")
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise BadRequest(f"cannot load projection {ref!r}: {exc}") from exc
    if not isinstance(value, Projection):
        raise BadRequest(f"{ref!r} is a {type(value).__name__}, not a Projection")
    return value


async def migrate_projection(
    store: Store,
    room: str,
    old: Projection | str,
    new: Projection | str,
    *,
    step: Step = "all",
    policy: RetryPolicy | None = None,
    metrics: Metrics | None = None,
) -> MigrationStatus:
    """Run one step of the migration from ``old`` to ``new`` (``"all"``: expand, migrate
    and contract in turn) and return its status. Projections may be given as
    ``"module:attribute"`` references. Safe to re-run: finished steps are skipped."""
    migration = ProjectionMigration(
        store,
        room,
        resolve_projection(old),
        resolve_projection(new),
        policy=policy,
        metrics=metrics,
    )
    if step == "status":
        return await migration.status()
    if step == "rollback":
        return await migration.rollback()
    if step not in ("expand", "migrate", "contract", "all"):
        raise BadRequest(f"unknown migration step {step!r}")
    status = await migration.status()
    if step in ("expand", "all") and status.phase in (None, Phase.EXPANDING):
        status = await migration.expand()
    if step in ("migrate", "all") and status.phase in (None, Phase.EXPANDING):
        status = await migration.migrate()
    if step in ("contract", "all"):
        status = await migration.contract()
    return status
