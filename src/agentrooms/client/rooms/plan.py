"""A remote room's plan: tasks claimed under fenced leases."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from agentrooms.client.rooms.base import Part, parse, seg
from agentrooms.rooms.keeper import keep_lease
from agentrooms.rooms.plan import DEFAULT_LEASE, Lease, LeaseKeeper, Task, TaskList, TaskSpec
from agentrooms.rooms.tasks import TERMINAL
from agentrooms.store.types import JSON


def _lease_body(lease: Lease, **more: Any) -> dict[str, Any]:
    """The lease as the holder sends it back (an empty ``agent``: the token's)."""
    return {
        "room": lease.room,
        "task_id": lease.task_id,
        "agent": lease.agent or None,
        "fence": lease.fence,
        "expires_at": lease.expires_at,
        "granted_at": lease.granted_at,
        **more,
    }


class Plan(Part):
    """The room's tasks, claimed under fenced leases (:class:`agentrooms.rooms.Plan`)."""

    def _task(self, task_id: str) -> str:
        return f"{self._room.path}/tasks/{seg(task_id)}"

    async def _lease_command(
        self, lease: Lease, verb: str, command_id: str | None, **more: Any
    ) -> Any:
        """POST the holder's ``lease`` (and ``more``) to the task's ``verb``, keyed."""
        return await self._http.json(
            "POST",
            f"{self._task(lease.task_id)}/{verb}",
            safety="keyed",
            body=_lease_body(lease, **more),
            headers=self._key(command_id),
        )

    async def get(self, task_id: str) -> Task:
        return parse(Task, await self._http.json("GET", self._task(task_id), safety="idempotent"))

    async def tasks(self, status: str | None = None) -> list[Task]:
        """Every task in id order (optionally only those with ``status``)."""
        params = {"status": status}
        path = f"{self._room.path}/tasks"
        body = await self._http.json("GET", path, safety="idempotent", params=params)
        return [parse(Task, t) for t in body["tasks"]]

    async def page(
        self, limit: int = 100, after: str | None = None, status: str | None = None
    ) -> TaskList:
        params = {"limit": limit, "after": after, "status": status}
        path = f"{self._room.path}/tasks"
        body = await self._http.json("GET", path, safety="idempotent", params=params)
        return TaskList([parse(Task, t) for t in body["tasks"]], body.get("next_after"))

    async def add(self, specs: Iterable[TaskSpec], *, command_id: str | None = None) -> list[str]:
        """Add tasks atomically; the ids ready at once (``BadRequest`` /
        ``InvalidTransition`` for a cycle, a missing dependency or an existing id)."""
        tasks = [
            {
                "id": s.id,
                "title": s.title,
                "payload": s.payload,
                "deps": list(s.deps),
                "max_attempts": s.max_attempts,
            }
            for s in specs
        ]
        if not tasks:
            return []
        body = await self._keyed(f"{self._room.path}/tasks", {"tasks": tasks}, command_id)
        ready: list[str] = body["ready"]
        return ready

    async def claim_next(
        self,
        agent: str | None = None,
        *,
        ttl: float = DEFAULT_LEASE,
        command_id: str | None = None,
        wait: float = 0.0,
    ) -> Lease | None:
        """Claim a ready task (or one whose lease expired); ``None`` if there is none.
        ``wait``: when none is ready, answer as soon as one is, else ``None`` after
        ``wait`` seconds (at once when the plan is finished; the server bounds it)."""
        body = await self._keyed(
            f"{self._room.path}/tasks/claim-next",
            {"agent": self._client.acting(agent), "ttl": ttl, "wait": wait},
            command_id,
            wait=wait,
        )
        lease = body["lease"]
        return None if lease is None else parse(Lease, lease)

    async def finished(self) -> bool:
        """Whether every task is done, failed or cancelled (an empty plan is not)."""
        tasks = await self.tasks()
        return bool(tasks) and all(t.status in TERMINAL for t in tasks)

    async def claim(
        self,
        task_id: str,
        agent: str | None = None,
        *,
        ttl: float = DEFAULT_LEASE,
        command_id: str | None = None,
        wait: float = 0.0,
    ) -> Lease:
        """Claim one named task (``LeaseHeld``, ``NotFound``, ``InvalidTransition``);
        ``wait``: up to that many seconds for it to become claimable first."""
        body = await self._keyed(
            f"{self._task(task_id)}/claim",
            {"agent": self._client.acting(agent), "ttl": ttl, "wait": wait},
            command_id,
            wait=wait,
        )
        return parse(Lease, body)

    async def renew(
        self, lease: Lease, ttl: float = DEFAULT_LEASE, *, command_id: str | None = None
    ) -> Lease:
        """Extend the lease by ``ttl`` from now; ``StaleFence`` if it was lost."""
        body = await self._lease_command(lease, "renew", command_id, ttl=ttl)
        return parse(Lease, body)

    async def complete(
        self, lease: Lease, result: JSON = None, *, command_id: str | None = None
    ) -> Task:
        """Record the result; ``StaleFence`` if the lease is no longer current."""
        body = await self._lease_command(lease, "complete", command_id, result=result)
        return parse(Task, body)

    async def fail(
        self, lease: Lease, error: JSON = None, *, command_id: str | None = None
    ) -> Task:
        """Give the task back: ready again while attempts remain, else ``failed``."""
        body = await self._lease_command(lease, "fail", command_id, error=error)
        return parse(Task, body)

    async def cancel(
        self, task_id: str, reason: JSON = None, *, command_id: str | None = None
    ) -> Task:
        """Cancel a task that is not finished; its holder's token becomes stale."""
        body = await self._keyed(f"{self._task(task_id)}/cancel", {"reason": reason}, command_id)
        return parse(Task, body)

    @contextlib.asynccontextmanager
    async def keep_alive(
        self, lease: Lease, *, ttl: float | None = None, every: float | None = None
    ) -> AsyncIterator[LeaseKeeper]:
        """Renew ``lease`` in the background while the body runs (every ``ttl / 3``).

        As the library's: a refused renewal (the lease was taken over, the task
        cancelled) cancels the body at once and raises ``StaleFence`` from this block;
        a renewal whose outcome stays unknown after the transport's retries is tried
        again at the next interval."""
        length = ttl if ttl is not None else lease.ttl
        interval = every if every is not None else length / 3
        async with keep_lease(lease, self.renew, length=length, interval=interval) as keeper:
            yield keeper
