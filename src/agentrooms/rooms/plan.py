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

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable

from agentrooms.commit import Change, CommitResult, View, recorded
from agentrooms.errors import (
    AgentroomsError,
    BadRequest,
    InvalidTransition,
    LeaseHeld,
    NotFound,
    StaleFence,
)
from agentrooms.rooms import keys
from agentrooms.rooms import task_transitions as t
from agentrooms.rooms.keeper import keep_lease
from agentrooms.rooms.scope import Scope, Try
from agentrooms.rooms.tasks import (
    CANCELLED,
    CLAIMED,
    DEFAULT_LEASE,
    DONE,
    FAILED,
    FIRST_PICK,
    LEASE_EXPIRED,
    LEASE_EXPIRED_LAST,
    LEASE_HELD,
    MAX_BATCH,
    PENDING,
    PICK,
    READY,
    TERMINAL,
    Lease,
    LeaseKeeper,
    Task,
    TaskList,
    TaskSpec,
    check_ttl,
    validate_specs,
)
from agentrooms.store.types import (
    JSON,
    Append,
    Put,
    Record,
)

__all__ = [
    "CANCELLED",
    "CLAIMED",
    "DEFAULT_LEASE",
    "DONE",
    "FAILED",
    "FIRST_PICK",
    "LEASE_EXPIRED",
    "LEASE_EXPIRED_LAST",
    "LEASE_HELD",
    "MAX_BATCH",
    "PENDING",
    "PICK",
    "READY",
    "TERMINAL",
    "Lease",
    "LeaseKeeper",
    "Plan",
    "Task",
    "TaskList",
    "TaskSpec",
    "check_ttl",
    "validate_specs",
]


def _finished(tasks: list[Task]) -> bool:
    return bool(tasks) and all(task.status in TERMINAL for task in tasks)


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
            lambda view, _: t.add(view, batch, external, author),
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
        wait: float = 0.0,
    ) -> Lease | None:
        """Claim a ready task (or one whose lease expired) for ``agent``; ``None`` if
        there is none. ``accept`` filters the candidates (e.g. by payload). With
        ``command_id`` a retried call returns the lease the first one got.

        ``wait`` (seconds): while none is ready, wait for one, woken by the store when a
        task is added or finished or a held lease runs out (not by polling); ``None``
        after ``wait``, or at once when the plan is finished (:meth:`finished` tells
        the two apart). ``BadRequest`` for a bad ``wait`` or ``ttl``."""
        keys.check_name(agent, "agent")
        ttl = check_ttl(ttl)
        cmd = t.Command(command_id, {"op": "claim_next", "agent": agent, "ttl": ttl})

        async def once() -> Try[Lease | None]:
            lease = await self._claim_next_once(agent, ttl, accept, max_candidates, cmd)
            if lease is not None or wait == 0:
                return lease, True, None
            tasks = await self.tasks()
            if _finished(tasks):
                return None, True, None
            ends = [t.lease_remaining for t in tasks if t.lease_remaining is not None]
            return None, False, min(ends, default=None)

        return await self._scope.until(wait, once)

    async def finished(self) -> bool:
        """Whether the plan is finished: it has tasks and every one is done, failed or
        cancelled, so no claim will succeed again (an empty plan is not finished: work
        may be added). ``NotFound`` if the room does not exist."""
        if await self.ready_count():
            await self._scope.read([])
            return False
        return _finished(await self.tasks())

    async def _claim_next_once(
        self,
        agent: str,
        ttl: float,
        accept: Callable[[Task], bool] | None,
        max_candidates: int,
        cmd: t.Command,
    ) -> Lease | None:
        if cmd.id is not None:
            done = await recorded(self._scope.store, self.room, cmd.id, cmd.event)
            if done is not None:  # an earlier delivery claimed (or found nothing)
                return None if done.result is None else t.lease_from(self.room, done.result)
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
        self, agent: str, ttl: float, accept: Callable[[Task], bool] | None, cmd: t.Command
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
        wait: float = 0.0,
    ) -> Lease:
        """Claim one named task; ``LeaseHeld`` if another agent holds an unexpired lease,
        ``NotFound`` if there is no such task, ``InvalidTransition`` if it is not ready.

        A task whose lease ran out on its last attempt is failed by this call (the same
        write ``claim_next`` makes on finding it), which then raises ``InvalidTransition``;
        a retry with the same ``command_id`` raises it again and writes nothing.

        ``wait`` (seconds): while the task is not added yet, waits for its dependencies
        or is leased to another agent, wait for it, woken by the store; after ``wait``
        the last refusal is raised. A finished task, or one ``agent`` holds already, is
        refused at once."""
        keys.check_name(task_id, "task id")
        keys.check_name(agent, "agent")
        length = check_ttl(ttl)

        async def once() -> Try[Lease | AgentroomsError]:
            try:
                return await self._claim(task_id, agent, length, command_id), True, None
            except (NotFound, LeaseHeld, InvalidTransition) as exc:
                if wait == 0:
                    raise
                try:
                    task = await self.get(task_id)
                except NotFound:
                    await self._scope.read([])  # the room itself is missing: say so
                    return exc, False, None
                if task.status not in (PENDING, CLAIMED) or task.owner == agent:
                    raise
                return exc, False, task.lease_remaining

        got = await self._scope.until(wait, once)
        if isinstance(got, AgentroomsError):
            raise got
        return got

    async def _claim(
        self, task_id: str, agent: str, length: float, command_id: str | None
    ) -> Lease:
        event = {"op": "claim", "task": task_id, "agent": agent, "ttl": length}
        result = await self._scope.commit(
            lambda view, _: t.claim(view, task_id, agent, length, named=True),
            event,
            [keys.task(task_id)],
            command_id=command_id,
        )
        if result.result is None:  # t.claim failed the task instead of granting a lease
            raise InvalidTransition(
                f"task {task_id!r} is failed: its lease expired on the last attempt"
            )
        lease: Lease = t.lease_from(self.room, result.result)
        return lease

    async def _try_claim(
        self,
        task_id: str,
        agent: str,
        ttl: float,
        accept: Callable[[Task], bool] | None,
        cmd: t.Command,
    ) -> Lease | None:
        repair = cmd.id is None  # a repair must not use up the command id
        try:
            result = await self._scope.commit(
                lambda view, _: t.claim(view, task_id, agent, ttl, accept=accept, repair=repair),
                cmd.event,
                [keys.task(task_id)],
                command_id=cmd.id,
            )
        except (t.Skip, LeaseHeld):
            return None
        return None if result.result is None else t.lease_from(self.room, result.result)

    # ------------------------------------------------------------- the holder

    async def renew(
        self, lease: Lease, ttl: float = DEFAULT_LEASE, *, command_id: str | None = None
    ) -> Lease:
        """Extend the lease by ``ttl`` from now (store clock). ``StaleFence`` if it was
        lost to another agent."""
        ttl = check_ttl(ttl)

        def renew(view: View, _: None) -> Change:
            task = t.held(view, lease)
            expires = view.now + ttl
            renewed = task.replace(lease_expires=expires, lease_renewed_at=view.now)
            return Change(
                writes=[Put(keys.task(task.id), renewed.to_value())],
                appends=[Append("lease.renewed", t.lease_data(lease, expires), lease.agent)],
                result={"expires_at": expires, "granted_at": task.lease_granted_at},
            )

        event = {"op": "renew", **t.lease_data(lease), "ttl": ttl}
        done = (await self._holder_commit(renew, lease, event, command_id)).result
        expires, granted = done["expires_at"], done["granted_at"]
        return Lease(lease.room, lease.task_id, lease.agent, lease.fence, expires, ttl, granted)

    async def complete(
        self, lease: Lease, result: JSON = None, *, command_id: str | None = None
    ) -> Task:
        """Record the task's result and make waiting dependents ready. ``StaleFence``
        if the lease is no longer current: a late holder's result is never recorded."""
        event = {"op": "complete", **t.lease_data(lease), "result": result}
        done = await self._holder_commit(
            lambda view, _: t.complete(view, lease, result), lease, event, command_id
        )
        return t.task_after(done, lease.task_id)

    async def fail(
        self, lease: Lease, error: JSON = None, *, command_id: str | None = None
    ) -> Task:
        """Give the task back: ready again while attempts remain, else ``failed``."""
        event = {"op": "fail", **t.lease_data(lease), "error": error}
        failed = await self._holder_commit(
            lambda view, _: t.fail(view, lease, error), lease, event, command_id
        )
        return t.task_after(failed, lease.task_id)

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
            lambda view, _: t.cancel(view, task_id, reason, author),
            {"op": "cancel", "task": task_id, "reason": reason},
            [keys.task(task_id)],
            command_id=command_id,
        )
        return t.task_after(result, task_id)

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
                lost = Append("lease.lost", t.lease_data(lease), lease.agent)
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
        length = check_ttl(ttl if ttl is not None else lease.ttl)
        interval = every if every is not None else length / 3
        async with keep_lease(lease, self.renew, length=length, interval=interval) as keeper:
            yield keeper
