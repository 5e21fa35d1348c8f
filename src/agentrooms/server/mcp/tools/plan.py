"""The tools of the plan: read_plan, add_tasks, claim_task and the leased task's."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field, JsonValue

from agentrooms.errors import (
    BadRequest,
    InvalidTransition,
    LeaseHeld,
    NotFound,
)
from agentrooms.rooms import Lease, Room, TaskSpec
from agentrooms.server.auth import Principal
from agentrooms.server.deps import command_id
from agentrooms.server.mcp.hints import (
    verbatim,
)
from agentrooms.server.mcp.tools.base import (
    TERMINAL,
    Body,
    FenceArg,
    LeaseTtl,
    RequestId,
    RoomArg,
    TaskIdArg,
    TaskIn,
    ToolsBase,
    WaitArg,
    _rounded,
)
from agentrooms.server.models import NAME_PATTERN


class PlanTools(ToolsBase):
    async def read_plan(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        status: Annotated[
            str | None,
            Field(
                pattern="^(pending|ready|claimed|done|failed|cancelled)$",
                max_length=9,
                description="only tasks with this status",
            ),
        ] = None,
        details: Annotated[
            bool, Field(description="also return title, payload, result, error, attempts")
        ] = False,
    ) -> CallToolResult:
        """The plan's tasks in id order, compactly: id, status, owner, deps; a claimed
        task's lease: "held" with the seconds left, or "expired, reclaimable" (claim_task
        hands it out). Ask for details only when you need payloads or results."""

        async def body(principal: Principal, r: Room) -> Body:
            out = []
            for t in await r.plan.tasks(status):
                item: dict[str, Any] = {"id": t.id, "status": t.status, "owner": t.owner}
                if t.lease_state is not None:
                    item["lease"] = t.lease_state
                    item["lease_remaining"] = _rounded(t.lease_remaining)
                if t.deps:
                    item["deps"] = t.deps
                if details:
                    item |= {
                        "title": t.title or None,
                        "payload": verbatim(t.payload),
                        "result": verbatim(t.result),
                        "error": verbatim(t.error),
                        "attempts": t.attempts or None,
                        "lease_granted_at": _rounded(t.lease_granted_at),
                        "lease_renewed_at": _rounded(t.lease_renewed_at),
                    }
                out.append(item)
            return {"tasks": out}

        return await self.run(ctx, room, "plan:read", body)

    async def add_tasks(
        self,
        room: RoomArg,
        tasks: Annotated[list[TaskIn], Field(min_length=1, max_length=1000)],
        ctx: Context[Any, Any],
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Add tasks to the plan, all or none. A task becomes ready when every task in its
        deps is done. Returns the ids that are ready at once."""

        async def body(principal: Principal, r: Room) -> Body:
            if len(tasks) > self.limits.max_batch:
                raise BadRequest(f"add at most {self.limits.max_batch} tasks at once")
            specs = [
                TaskSpec(t.id, t.title, t.payload, tuple(t.deps), t.max_attempts) for t in tasks
            ]
            cmd = command_id(principal, request_id)
            ready = await r.plan.add(specs, command_id=cmd, author=principal.agent)
            return {"added": len(specs), "ready": ready}

        return await self.run(ctx, room, "plan:write", body)

    async def claim_task(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        task_id: Annotated[
            str | None,
            Field(
                pattern=NAME_PATTERN,
                max_length=128,
                description="claim this task; omit to get the next ready one",
            ),
        ] = None,
        ttl: LeaseTtl = 60.0,
        wait: WaitArg = 0.0,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Claim the next ready task (or the one named) under a lease, waiting up to wait
        seconds for one. Returns the task, your fence (for renew_lease / complete_task /
        fail_task) and when the lease expires. claimed=false: finished=true means every
        task is done, failed or cancelled (stop); else nothing is ready yet."""

        async def body(principal: Principal, r: Room) -> Body:
            cmd = command_id(principal, request_id)

            async def once() -> tuple[Lease | bool | None, float | None]:
                return await self._claim_once(r, principal.agent, task_id, ttl, cmd, wait > 0)

            got: Lease | bool | None = await self._until(r, wait, once)
            if got is None or isinstance(got, bool):
                finished = got is True
                hint = (
                    "every task is done, failed or cancelled: no work is left"
                    if finished
                    else "nothing is ready yet; call claim_task with wait (seconds) to wait"
                )
                return {"claimed": False, "finished": finished, "hint": hint}
            task = await r.plan.get(got.task_id)
            return {
                "claimed": True,
                "task": {
                    "id": task.id,
                    "title": task.title or None,
                    "payload": verbatim(task.payload),
                    "deps": task.deps or None,
                    "attempt": task.attempts,
                },
                "fence": got.fence,
                "expires_at": _rounded(got.expires_at),
                "ttl": got.ttl,
            }

        return await self.run(ctx, room, "lease:acquire", body)

    async def _claim_once(
        self,
        r: Room,
        agent: str,
        task_id: str | None,
        ttl: float,
        cmd: str | None,
        waiting: bool,
    ) -> tuple[Lease | bool | None, float | None]:
        """One try at a claim: the lease; ``True`` when the plan is finished (it has tasks
        and all are done, failed or cancelled); else ``None`` with the seconds until a
        held lease ends (it may then be reclaimed without any event). Named and
        ``waiting``, a task not added yet, pending or leased to another is ``None`` too."""
        if task_id is not None:
            try:
                return await r.plan.claim(task_id, agent, ttl=ttl, command_id=cmd), None
            except (NotFound, LeaseHeld, InvalidTransition):
                if not waiting:
                    raise
                try:
                    tasks = [await r.plan.get(task_id)]
                except NotFound:
                    await r.scope.read([])  # the room itself is missing: say so
                    return None, None
                if tasks[0].status in TERMINAL or (
                    tasks[0].status == "claimed" and tasks[0].owner == agent
                ):
                    raise
        else:
            lease = await r.plan.claim_next(agent, ttl=ttl, command_id=cmd)
            if lease is not None:
                return lease, None
            tasks = await r.plan.tasks()
            if tasks and all(t.status in TERMINAL for t in tasks):
                return True, None
        ends = [t.lease_remaining for t in tasks if t.lease_remaining is not None]
        return None, min(ends, default=None)

    def _lease(self, principal: Principal, r: Room, task_id: str, fence: int, ttl: float) -> Lease:
        return Lease(r.name, task_id, principal.agent, fence, 0.0, ttl)

    async def renew_lease(
        self,
        room: RoomArg,
        task_id: TaskIdArg,
        fence: FenceArg,
        ctx: Context[Any, Any],
        ttl: LeaseTtl = 60.0,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Extend your lease on a task to ttl seconds from now."""

        async def body(principal: Principal, r: Room) -> Body:
            lease = self._lease(principal, r, task_id, fence, ttl)
            renewed = await r.plan.renew(lease, ttl, command_id=command_id(principal, request_id))
            return {"fence": renewed.fence, "expires_at": _rounded(renewed.expires_at)}

        return await self.run(ctx, room, "lease:acquire", body)

    async def complete_task(
        self,
        room: RoomArg,
        task_id: TaskIdArg,
        fence: FenceArg,
        ctx: Context[Any, Any],
        result: Annotated[JsonValue, Field(description="the task's result (JSON)")] = None,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Record the result of a task you hold; tasks waiting on it may become ready."""

        async def body(principal: Principal, r: Room) -> Body:
            lease = self._lease(principal, r, task_id, fence, 60.0)
            cmd = command_id(principal, request_id)
            done = await r.plan.complete(lease, result, command_id=cmd)
            return {"task_id": done.id, "status": done.status}

        return await self.run(ctx, room, "lease:acquire", body)

    async def fail_task(
        self,
        room: RoomArg,
        task_id: TaskIdArg,
        fence: FenceArg,
        ctx: Context[Any, Any],
        error: Annotated[JsonValue, Field(description="what went wrong (JSON)")] = None,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Give a task you hold back: it is ready again while attempts remain, else failed."""

        async def body(principal: Principal, r: Room) -> Body:
            lease = self._lease(principal, r, task_id, fence, 60.0)
            after = await r.plan.fail(lease, error, command_id=command_id(principal, request_id))
            return {
                "task_id": after.id,
                "status": after.status,
                "attempts": after.attempts,
                "max_attempts": after.max_attempts,
            }

        return await self.run(ctx, room, "lease:acquire", body)

    async def cancel_task(
        self,
        room: RoomArg,
        task_id: TaskIdArg,
        ctx: Context[Any, Any],
        reason: Annotated[JsonValue, Field(description="why (JSON)")] = None,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Cancel a task that is not finished; tasks waiting on it will not become ready."""

        async def body(principal: Principal, r: Room) -> Body:
            cmd = command_id(principal, request_id)
            done = await r.plan.cancel(task_id, reason, command_id=cmd, author=principal.agent)
            return {"task_id": done.id, "status": done.status}

        return await self.run(ctx, room, "plan:write", body)
