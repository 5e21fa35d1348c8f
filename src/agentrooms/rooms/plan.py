"""The plan: tasks with dependencies, claimed under leases with fencing tokens.

Each task is its own record, so agents working on different tasks never conflict. A
task whose dependencies are all done sits in the room's ``ready`` set; ``claim_next``
draws candidates with the store's fair ``set_pick`` (concurrent claimers are handed
different tasks, and the cost does not grow with the plan), then claims one with a
conditional write that compares the task's and its dependencies' versions.

A claim grants a lease (``expires_at`` by the store's clock) and a fencing token that
increases with every grant of the task and is never reused. The task records when its
lease was granted and last renewed (``lease_granted_at``, ``lease_renewed_at``: the
store time the claim or renewal decided on, from which ``lease_expires`` counts). A task
read through this module also says what its lease is as of the read's store time
(``lease_state``, ``lease_remaining``): a claimed task whose lease ran out is
``"expired, reclaimable"`` (``claim_next`` hands it out), not held. ``renew``, ``complete`` and
``fail`` take the lease; a holder whose token is no longer the task's current one gets
``StaleFence`` and its result is never recorded. Any other write can be fenced by the
task with ``FenceAtMost(task_key, lease.fence)`` (:meth:`Lease.guard`).

Status lifecycle::

    pending ──(last dependency done)──> ready ──claim──> claimed ──complete──> done
                                          ^                 │ fail (attempts left)
                                          └─────────────────┤ lease expired, reclaimed
                               fail or expiry with no attempts left ──> failed
    any non-terminal ──cancel──> cancelled
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from agentrooms.commit import Change, CommitResult, View, recorded
from agentrooms.errors import (
    BadRequest,
    InvalidTransition,
    LeaseHeld,
    NotFound,
    StaleFence,
    StoreUnavailable,
)
from agentrooms.rooms import keys
from agentrooms.rooms.scope import Scope
from agentrooms.store.types import (
    JSON,
    Append,
    FenceAtMost,
    Put,
    Record,
    SetAdd,
    SetRemove,
    Write,
)

PENDING, READY, CLAIMED, DONE, FAILED, CANCELLED = (
    "pending",
    "ready",
    "claimed",
    "done",
    "failed",
    "cancelled",
)
TERMINAL = frozenset({DONE, FAILED, CANCELLED})
DEFAULT_LEASE = 60.0
PICK = 8  # candidates drawn per set_pick once a drawn candidate was not claimable
FIRST_PICK = 1  # candidates drawn first: each drawn one costs the store a write (its pick
# mark), and the fair pick hands concurrent claimers different candidates, so the first
# is claimable unless the ready set is nearly empty or another claimer raced for it
MAX_BATCH = 1000  # tasks per add (each takes about four store operations)
LEASE_HELD = "held"
LEASE_EXPIRED = "expired, reclaimable"
LEASE_EXPIRED_LAST = "expired, last attempt"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task to add: its id, what it is, and the ids of the tasks it waits for."""

    id: str
    title: str = ""
    payload: JSON = None
    deps: Sequence[str] = ()
    max_attempts: int = 3


@dataclass(frozen=True, slots=True)
class TaskList:
    """Tasks in id order; ``next_after`` is the ``after`` of the next page, ``None``
    when no task follows."""

    tasks: list[Task]
    next_after: str | None


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    title: str
    payload: JSON
    status: str
    deps: list[str]
    waiting_on: list[str]
    dependents: list[str]
    owner: str | None = None
    result: JSON = None
    error: JSON = None
    attempts: int = 0
    max_attempts: int = 3
    fence: int = 0
    lease_expires: float | None = None
    lease_granted_at: float | None = None  # store clock: the claim that granted the lease
    lease_renewed_at: float | None = None  # store clock: its last renewal (None: never)
    version: int = 0
    # As of the read's store time, not stored (and not compared): for a claimed task
    # LEASE_HELD, LEASE_EXPIRED (claim_next reclaims it) or LEASE_EXPIRED_LAST (its
    # attempts are used up: the next claim fails it); None for a task not claimed. And
    # the seconds left on the lease (0 once expired; None when not claimed).
    lease_state: str | None = field(default=None, compare=False)
    lease_remaining: float | None = field(default=None, compare=False)

    @classmethod
    def from_value(cls, value: dict[str, Any], version: int, now: float | None = None) -> Task:
        """The task a stored value holds; with ``now`` (the read's store time) its
        ``lease_state`` and ``lease_remaining`` as of then."""
        task = cls(**value, version=version)
        if now is None or task.status != CLAIMED:
            return task
        remaining = max(0.0, (task.lease_expires or 0.0) - now)
        if remaining > 0:
            state = LEASE_HELD
        else:
            state = LEASE_EXPIRED if task.attempts < task.max_attempts else LEASE_EXPIRED_LAST
        return dataclasses.replace(task, lease_state=state, lease_remaining=remaining)

    @property
    def state(self) -> str:
        """What to show: the status, except ``lease_state`` for a claimed task whose
        lease expired as of the read."""
        if self.lease_state in (LEASE_EXPIRED, LEASE_EXPIRED_LAST):
            return self.lease_state
        return self.status

    def to_value(self) -> dict[str, Any]:
        """The stored value: every field but ``version`` and the read-time ``lease_state``
        and ``lease_remaining``, copied one level deep (values are immutable here, and the
        store serializes what it is given)."""
        return {name: getattr(self, name) for name in _TASK_FIELDS}

    def replace(self, **changes: Any) -> Task:
        return Task.from_value({**self.to_value(), **changes}, self.version)


_TASK_FIELDS = tuple(
    f.name for f in fields(Task) if f.name not in ("version", "lease_state", "lease_remaining")
)


@dataclass(frozen=True, slots=True)
class Lease:
    """An agent's exclusive, expiring claim on one task, with its fencing token."""

    room: str
    task_id: str
    agent: str
    fence: int
    expires_at: float  # store clock
    ttl: float = DEFAULT_LEASE
    granted_at: float | None = None  # store clock: the claim that granted it

    def guard(self) -> FenceAtMost:
        """A compare that lets a write commit only while this lease's token is current."""
        return FenceAtMost(keys.task(self.task_id), self.fence)


@dataclass
class LeaseKeeper:
    """What :meth:`Plan.keep_alive` yields: the current lease, and whether it was lost."""

    lease: Lease
    lost: BaseException | None = None
    lost_event: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class _Command:
    """A command id and the payload it is checked against (for retried deliveries)."""

    id: str | None
    event: JSON


class _Skip(Exception):
    """The candidate is not claimable (any more): try the next one."""


def _check_ttl(ttl: object) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86_400:
        raise BadRequest(f"a lease ttl must be between 0 and 86400 seconds, got {ttl!r}")
    return float(ttl)


def _task(view: View, task_id: str) -> Task | None:
    record = view.record(keys.task(task_id))
    return None if record is None else Task.from_value(record.value, record.version, view.now)


def validate_specs(specs: Sequence[TaskSpec]) -> None:
    """Ids well-formed and unique, attempt limits sane, no cycle within the batch
    (existing tasks cannot depend on new ones, so every cycle lies inside it)."""
    ids: dict[str, TaskSpec] = {}
    for spec in specs:
        if not isinstance(spec, TaskSpec):
            raise BadRequest(f"not a TaskSpec: {spec!r}")
        keys.check_name(spec.id, "task id")
        if spec.id in ids:
            raise BadRequest(f"task {spec.id!r} appears twice")
        for dep in spec.deps:
            keys.check_name(dep, "dependency id")
        if not isinstance(spec.title, str) or len(spec.title) > 1000:
            raise BadRequest("a task title is a string of at most 1000 characters")
        if (
            isinstance(spec.max_attempts, bool)
            or not isinstance(spec.max_attempts, int)
            or not (1 <= spec.max_attempts <= 1000)
        ):
            raise BadRequest("max_attempts must be an integer from 1 to 1000")
        ids[spec.id] = spec
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in ids[node].deps:
            if dep not in ids:
                continue
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep] if dep in path else [node, dep]
                raise BadRequest(f"dependency cycle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for spec_id in ids:
        if spec_id not in state:
            visit(spec_id, [spec_id])


class Plan:
    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    @property
    def room(self) -> str:
        return self._scope.room

    # ------------------------------------------------------------------ reading

    async def get(self, task_id: str) -> Task:
        key = keys.task(keys.check_name(task_id, "task id"))
        snap = await self._scope.read([key])
        record = snap.get(key)
        if record is None:
            raise NotFound(f"no task {task_id!r} in room {self.room!r}")
        return Task.from_value(record.value, record.version, snap.now)

    async def tasks(self, status: str | None = None) -> list[Task]:
        """Every task in id order (optionally only those with ``status``)."""
        await self._scope.read([])
        out: list[Task] = []
        after: str | None = None
        while True:
            page = await self._scope.store.scan(self.room, "task/", after, 1000)
            out += [Task.from_value(r.value, r.version, page.now) for r in page.records]
            if page.next_after is None:
                break
            after = page.next_after
        return [t for t in out if status is None or t.status == status]

    async def page(
        self, limit: int = 100, after: str | None = None, status: str | None = None
    ) -> TaskList:
        """Up to ``limit`` tasks in id order after id ``after`` (only those with
        ``status``, if given: then the scan reads on past the others). ``next_after`` is
        the ``after`` of the next page, ``None`` when no task follows. ``NotFound`` if
        the room does not exist, ``BadRequest`` for a bad ``limit``."""

        def keep(record: Record, now: float) -> bool:
            return (
                status is None
                or Task.from_value(record.value, record.version, now).status == status
            )

        records, now, next_after = await self._scope.page("task/", limit, after, keep)
        return TaskList([Task.from_value(r.value, r.version, now) for r in records], next_after)

    async def ready_count(self) -> int:
        return await self._scope.store.set_size(self.room, keys.READY)

    # ------------------------------------------------------------------- adding

    async def add(
        self,
        specs: Iterable[TaskSpec],
        *,
        command_id: str | None = None,
        author: str | None = None,
    ) -> list[str]:
        """Add tasks atomically. A cycle, a missing dependency or an existing id raises
        (``BadRequest`` / ``InvalidTransition``, naming the path) and adds nothing.
        Returns the ids that are ready at once. ``author``: the agent adding them, the
        author of the ``task.added`` events."""
        batch = list(specs)
        if not batch:
            return []
        if len(batch) > MAX_BATCH:
            raise BadRequest(f"add at most {MAX_BATCH} tasks at once")
        validate_specs(batch)
        new_ids = {s.id for s in batch}
        external = sorted({d for s in batch for d in s.deps if d not in new_ids})
        read = [keys.task(s.id) for s in batch] + [keys.task(d) for d in external]
        event = [[s.id, s.title, s.payload, list(s.deps), s.max_attempts] for s in batch]
        result = await self._scope.commit(
            lambda view, _: _add(view, batch, external, author),
            event,
            read,
            command_id=command_id,
        )
        ready: list[str] = result.result
        return ready

    # ---------------------------------------------------------------- claiming

    async def claim_next(
        self,
        agent: str,
        *,
        ttl: float = DEFAULT_LEASE,
        accept: Callable[[Task], bool] | None = None,
        max_candidates: int = 64,
        command_id: str | None = None,
    ) -> Lease | None:
        """Claim a ready task (or one whose lease expired) for ``agent``; ``None`` if
        there is none. ``accept`` filters the candidates (e.g. by payload). With
        ``command_id`` a retried call returns the lease the first one got."""
        keys.check_name(agent, "agent")
        ttl = _check_ttl(ttl)
        cmd = _Command(command_id, {"op": "claim_next", "agent": agent, "ttl": ttl})
        if command_id is not None:
            done = await recorded(self._scope.store, self.room, command_id, cmd.event)
            if done is not None:  # an earlier delivery claimed (or found nothing)
                return None if done.result is None else _lease_from(self.room, done.result)
        tried: set[str] = set()
        count = FIRST_PICK
        while len(tried) < max_candidates:
            fresh = [
                c
                for c in await self._scope.store.set_pick(self.room, keys.READY, count)
                if c not in tried
            ]
            count = PICK
            if not fresh:
                break
            for candidate in fresh:
                tried.add(candidate)
                lease = await self._try_claim(candidate, agent, ttl, accept, cmd)
                if lease is not None:
                    return lease
        return await self._reclaim_expired(agent, ttl, accept, cmd)

    async def _reclaim_expired(
        self, agent: str, ttl: float, accept: Callable[[Task], bool] | None, cmd: _Command
    ) -> Lease | None:
        picked = await self._scope.store.set_pick(self.room, keys.LEASED, PICK)
        if not picked:
            await self._scope.read([])  # no work, or no room: say which
            return None
        snap = await self._scope.read([keys.task(t) for t in picked])
        for task_id in picked:
            record = snap.get(keys.task(task_id))
            expires = None if record is None else record.value.get("lease_expires")
            if (
                record is None
                or record.value["status"] != CLAIMED
                or (expires is not None and expires > snap.now)
            ):
                continue
            lease = await self._try_claim(task_id, agent, ttl, accept, cmd)
            if lease is not None:
                return lease
        return None

    async def claim(
        self,
        task_id: str,
        agent: str,
        *,
        ttl: float = DEFAULT_LEASE,
        command_id: str | None = None,
    ) -> Lease:
        """Claim one named task; ``LeaseHeld`` if another agent holds an unexpired lease,
        ``NotFound`` if there is no such task, ``InvalidTransition`` if it is not ready.

        A task whose lease ran out on its last attempt is failed by this call (the same
        write ``claim_next`` makes on finding it), which then raises ``InvalidTransition``;
        a retry with the same ``command_id`` raises it again and writes nothing."""
        keys.check_name(task_id, "task id")
        keys.check_name(agent, "agent")
        length = _check_ttl(ttl)
        event = {"op": "claim", "task": task_id, "agent": agent, "ttl": length}
        result = await self._scope.commit(
            lambda view, _: _claim(view, task_id, agent, length, named=True),
            event,
            [keys.task(task_id)],
            command_id=command_id,
        )
        if result.result is None:  # _claim failed the task instead of granting a lease
            raise InvalidTransition(
                f"task {task_id!r} is failed: its lease expired on the last attempt"
            )
        lease: Lease = _lease_from(self.room, result.result)
        return lease

    async def _try_claim(
        self,
        task_id: str,
        agent: str,
        ttl: float,
        accept: Callable[[Task], bool] | None,
        cmd: _Command,
    ) -> Lease | None:
        repair = cmd.id is None  # a repair must not use up the command id
        try:
            result = await self._scope.commit(
                lambda view, _: _claim(view, task_id, agent, ttl, accept=accept, repair=repair),
                cmd.event,
                [keys.task(task_id)],
                command_id=cmd.id,
            )
        except (_Skip, LeaseHeld):
            return None
        return None if result.result is None else _lease_from(self.room, result.result)

    # ------------------------------------------------------------- the holder

    async def renew(
        self, lease: Lease, ttl: float = DEFAULT_LEASE, *, command_id: str | None = None
    ) -> Lease:
        """Extend the lease by ``ttl`` from now (store clock). ``StaleFence`` if it was
        lost to another agent."""
        ttl = _check_ttl(ttl)

        def renew(view: View, _: None) -> Change:
            task = _held(view, lease)
            expires = view.now + ttl
            renewed = task.replace(lease_expires=expires, lease_renewed_at=view.now)
            return Change(
                writes=[Put(keys.task(task.id), renewed.to_value())],
                appends=[Append("lease.renewed", _lease_data(lease, expires), lease.agent)],
                result={"expires_at": expires, "granted_at": task.lease_granted_at},
            )

        event = {"op": "renew", **_lease_data(lease), "ttl": ttl}
        done = (await self._holder_commit(renew, lease, event, command_id)).result
        expires, granted = done["expires_at"], done["granted_at"]
        return Lease(lease.room, lease.task_id, lease.agent, lease.fence, expires, ttl, granted)

    async def complete(
        self, lease: Lease, result: JSON = None, *, command_id: str | None = None
    ) -> Task:
        """Record the task's result and make waiting dependents ready. ``StaleFence``
        if the lease is no longer current: a late holder's result is never recorded."""
        event = {"op": "complete", **_lease_data(lease), "result": result}
        done = await self._holder_commit(
            lambda view, _: _complete(view, lease, result), lease, event, command_id
        )
        return _task_after(done, lease.task_id)

    async def fail(
        self, lease: Lease, error: JSON = None, *, command_id: str | None = None
    ) -> Task:
        """Give the task back: ready again while attempts remain, else ``failed``."""
        event = {"op": "fail", **_lease_data(lease), "error": error}
        failed = await self._holder_commit(
            lambda view, _: _fail(view, lease, error), lease, event, command_id
        )
        return _task_after(failed, lease.task_id)

    async def cancel(
        self,
        task_id: str,
        reason: JSON = None,
        *,
        command_id: str | None = None,
        author: str | None = None,
    ) -> Task:
        """Cancel a task that is not finished; its holder's token becomes stale.
        ``author``: the agent cancelling it, the author of the ``task.cancelled`` event."""
        keys.check_name(task_id, "task id")
        result = await self._scope.commit(
            lambda view, _: _cancel(view, task_id, reason, author),
            {"op": "cancel", "task": task_id, "reason": reason},
            [keys.task(task_id)],
            command_id=command_id,
        )
        return _task_after(result, task_id)

    async def _holder_commit(
        self,
        transition: Callable[[View, JSON], Change],
        lease: Lease,
        event: JSON,
        command_id: str | None,
    ) -> CommitResult:
        if lease.room != self.room:
            raise BadRequest(f"lease is for room {lease.room!r}, not {self.room!r}")
        try:
            return await self._scope.commit(
                transition, event, [keys.task(lease.task_id)], command_id=command_id
            )
        except StaleFence:
            with contextlib.suppress(Exception):
                lost = Append("lease.lost", _lease_data(lease), lease.agent)
                await self._scope.transact(appends=[lost])
            raise

    @contextlib.asynccontextmanager
    async def keep_alive(
        self, lease: Lease, *, ttl: float | None = None, every: float | None = None
    ) -> AsyncIterator[LeaseKeeper]:
        """Renew ``lease`` in the background while the body runs.

        If a renewal is refused (the lease was taken over, the task cancelled) the body
        is cancelled at once and ``StaleFence`` is raised from this block: the work
        must be discarded. Transport failures are retried until the lease would lapse.
        """
        length = _check_ttl(ttl if ttl is not None else lease.ttl)
        interval = every if every is not None else length / 3
        keeper = LeaseKeeper(lease)
        body = asyncio.current_task()
        assert body is not None

        async def renew_forever() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    keeper.lease = await self.renew(keeper.lease, length)
                except StoreUnavailable:
                    continue
                except (StaleFence, InvalidTransition, NotFound) as exc:
                    keeper.lost = exc
                    keeper.lost_event.set()
                    body.cancel()
                    return

        renewer = asyncio.create_task(renew_forever())
        try:
            yield keeper
        except asyncio.CancelledError:
            if keeper.lost is not None and body.uncancel() == 0:
                raise StaleFence(keys.task(lease.task_id), lease.fence, None) from keeper.lost
            raise
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer


# ------------------------------------------------------------------ transitions (pure)


def _add(view: View, batch: list[TaskSpec], external: list[str], author: str | None) -> Change:
    for spec in batch:
        if view.exists(keys.task(spec.id)):
            raise InvalidTransition(f"task {spec.id!r} already exists")
    existing: dict[str, Task] = {}
    for dep in external:
        task = _task(view, dep)
        if task is None:
            needing = next(s.id for s in batch if dep in s.deps)
            raise BadRequest(
                f"task {needing!r} depends on missing task {dep!r}: {needing} -> {dep}"
            )
        existing[dep] = task
    writes: list[Write] = []
    appends: list[Append] = []
    ready: list[str] = []
    dependents: dict[str, list[str]] = {s.id: [] for s in batch}
    for spec in batch:
        for dep in spec.deps:
            if dep in dependents:
                dependents[dep].append(spec.id)
    for dep, task in existing.items():
        added = [s.id for s in batch if dep in s.deps]
        writes.append(
            Put(keys.task(dep), task.replace(dependents=[*task.dependents, *added]).to_value())
        )
    for spec in batch:
        waiting = [
            d for d in dict.fromkeys(spec.deps) if d not in existing or existing[d].status != DONE
        ]
        status = PENDING if waiting else READY
        task = Task(
            id=spec.id,
            title=spec.title,
            payload=spec.payload,
            status=status,
            deps=list(dict.fromkeys(spec.deps)),
            waiting_on=waiting,
            dependents=dependents[spec.id],
            max_attempts=spec.max_attempts,
        )
        writes.append(Put(keys.task(spec.id), task.to_value()))
        if status == READY:
            writes.append(SetAdd(keys.READY, spec.id))
            ready.append(spec.id)
        appends.append(Append("task.added", {"task": spec.id, "status": status}, author))
    return Change(writes=writes, appends=appends, result=ready)


def _claim(
    view: View,
    task_id: str,
    agent: str,
    ttl: float,
    *,
    accept: Callable[[Task], bool] | None = None,
    named: bool = False,
    repair: bool = True,
) -> Change:
    task = _task(view, task_id)
    if task is None:
        if named:
            raise NotFound(f"no task {task_id!r}")
        if not repair:
            raise _Skip
        return Change(writes=[SetRemove(keys.READY, task_id)])  # repair a stray member
    expired = task.status == CLAIMED and (task.lease_expires or 0) <= view.now
    if task.status == CLAIMED and not expired:
        if named:
            raise LeaseHeld(task_id, task.owner)
        raise _Skip
    if task.status != READY and not expired:
        if named:
            raise InvalidTransition(f"task {task_id!r} is {task.status}, not ready")
        if not repair:
            raise _Skip
        return Change(writes=[SetRemove(keys.READY, task_id)])  # repair a stray member
    if accept is not None and not accept(task):
        raise _Skip
    for dep in task.deps:
        dep_task = _task(view, dep)  # compared in the write: still done when we claim
        if dep_task is None or dep_task.status != DONE:
            raise InvalidTransition(f"task {task_id!r} waits for {dep!r}")
    appends: list[Append] = []
    writes: list[Write] = []
    if expired:
        lapsed = {"task": task_id, "agent": task.owner, "fence": task.fence}
        appends.append(Append("lease.expired", lapsed, agent))
        if task.attempts >= task.max_attempts:
            if not repair:  # a state change of its own: leave it to a claim without a command id
                raise _Skip
            failed = task.replace(
                status=FAILED,
                owner=None,
                lease_expires=None,
                lease_granted_at=None,
                lease_renewed_at=None,
                error="lease expired on the last attempt",
            )
            return Change(
                writes=[
                    Put(keys.task(task_id), failed.to_value()),
                    SetRemove(keys.LEASED, task_id),
                ],
                appends=[
                    *appends,
                    Append("task.failed", {"task": task_id, "terminal": True}, agent),
                ],
            )
    fence = task.fence + 1
    expires = view.now + ttl
    claimed = task.replace(
        status=CLAIMED,
        owner=agent,
        fence=fence,
        attempts=task.attempts + 1,
        lease_expires=expires,
        lease_granted_at=view.now,
        lease_renewed_at=None,
    )
    writes += [
        Put(keys.task(task_id), claimed.to_value()),
        SetRemove(keys.READY, task_id),
        SetAdd(keys.LEASED, task_id),
    ]
    lease = {
        "task_id": task_id,
        "agent": agent,
        "fence": fence,
        "expires_at": expires,
        "ttl": ttl,
        "granted_at": view.now,
    }
    kind = "lease.reclaimed" if expired else "lease.granted"
    data = {"task": task_id, "agent": agent, "fence": fence, "expires_at": expires}
    appends.append(Append(kind, data, agent))
    return Change(writes=writes, appends=appends, result=lease)


def _lease_from(room: str, data: dict[str, Any]) -> Lease:
    return Lease(
        room,
        data["task_id"],
        data["agent"],
        data["fence"],
        data["expires_at"],
        data["ttl"],
        data.get("granted_at"),  # absent from a lease recorded before it was kept
    )


def _task_after(result: CommitResult, task_id: str) -> Task:
    """The task as a commit left it (its value is the commit's result)."""
    return Task.from_value(result.result, result.versions.get(keys.task(task_id), 0))


def _lease_data(lease: Lease, expires: float | None = None) -> dict[str, Any]:
    return {
        "task": lease.task_id,
        "agent": lease.agent,
        "fence": lease.fence,
        "expires_at": lease.expires_at if expires is None else expires,
    }


def _held(view: View, lease: Lease) -> Task:
    """The task, if ``lease`` is still its current claim; else StaleFence."""
    task = _task(view, lease.task_id)
    if task is None:
        raise NotFound(f"no task {lease.task_id!r}")
    if task.fence != lease.fence:
        raise StaleFence(keys.task(task.id), lease.fence, task.fence)
    if task.status != CLAIMED or task.owner != lease.agent:
        raise InvalidTransition(f"task {task.id!r} is {task.status}, not held by {lease.agent!r}")
    return task


def _complete(view: View, lease: Lease, result: JSON) -> Change:
    task = _held(view, lease)
    done = task.replace(
        status=DONE, result=result, lease_expires=None, lease_granted_at=None, lease_renewed_at=None
    )
    writes: list[Write] = [
        Put(keys.task(task.id), done.to_value()),
        SetRemove(keys.LEASED, task.id),
    ]
    appends = [
        Append(
            "task.completed",
            {"task": task.id, "agent": lease.agent, "fence": lease.fence},
            lease.agent,
        )
    ]
    for dependent_id in task.dependents:
        dependent = _task(view, dependent_id)
        if dependent is None:
            continue
        waiting = [d for d in dependent.waiting_on if d != task.id]
        becomes_ready = not waiting and dependent.status == PENDING
        changed = dependent.replace(
            waiting_on=waiting, status=READY if becomes_ready else dependent.status
        )
        writes.append(Put(keys.task(dependent_id), changed.to_value()))
        if becomes_ready:
            writes.append(SetAdd(keys.READY, dependent_id))
            appends.append(Append("task.ready", {"task": dependent_id}, lease.agent))
    return Change(writes=writes, appends=appends, result=done.to_value())


def _fail(view: View, lease: Lease, error: JSON) -> Change:
    task = _held(view, lease)
    terminal = task.attempts >= task.max_attempts
    after = task.replace(
        status=FAILED if terminal else READY,
        owner=None,
        lease_expires=None,
        lease_granted_at=None,
        lease_renewed_at=None,
        error=error,
    )
    writes: list[Write] = [
        Put(keys.task(task.id), after.to_value()),
        SetRemove(keys.LEASED, task.id),
    ]
    if not terminal:
        writes.append(SetAdd(keys.READY, task.id))
    data = {
        "task": task.id,
        "agent": lease.agent,
        "error": error,
        "terminal": terminal,
        "attempts": task.attempts,
    }
    failed = Append("task.failed", data, lease.agent)
    return Change(writes=writes, appends=[failed], result=after.to_value())


def _cancel(view: View, task_id: str, reason: JSON, author: str | None) -> Change:
    task = _task(view, task_id)
    if task is None:
        raise NotFound(f"no task {task_id!r}")
    if task.status in TERMINAL:
        raise InvalidTransition(f"task {task_id!r} is already {task.status}")
    cancelled = task.replace(
        status=CANCELLED,
        fence=task.fence + 1,
        lease_expires=None,
        lease_granted_at=None,
        lease_renewed_at=None,
        error=reason,
    )
    return Change(
        writes=[
            Put(keys.task(task_id), cancelled.to_value()),
            SetRemove(keys.READY, task_id),
            SetRemove(keys.LEASED, task_id),
        ],
        appends=[Append("task.cancelled", {"task": task_id, "reason": reason}, author)],
        result=cancelled.to_value(),
    )
