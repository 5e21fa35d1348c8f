"""The tools of the plan: read_plan, add_tasks, claim_task and the leased task's."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field, JsonValue

from agentrooms.errors import (
    BadRequest,
)
from agentrooms.rooms import Lease, Room, Task, TaskSpec
from agentrooms.server.access import command_id
from agentrooms.server.auth import Principal
from agentrooms.server.mcp.hints import (
    verbatim,
)
from agentrooms.server.mcp.tools.base import (
    AfterArg,
    Body,
    Budget,
    FenceArg,
    LeaseTtl,
    LimitArg,
    RequestId,
    RoomArg,
    TaskIdArg,
    TaskIn,
    ToolsBase,
    WaitArg,
    _rounded,
)
from agentrooms.server.models import NAME_PATTERN

SUMMARY_IDS = 20  # ready ids and own tasks a read_plan summary names


class PlanTools(ToolsBase):
    """The plan and leased tasks."""

    async def read_plan(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        status: Annotated[
            str | None,
            Field(pattern="^(pending|ready|claimed|done|failed|cancelled)$", max_length=9),
        ] = None,
        details: Annotated[bool, Field(description="add title, payload, result, error")] = False,
        summary: Annotated[
            bool | None, Field(description="counts, ready ids, yours (default: if > limit)")
        ] = None,
        limit: LimitArg = 100,
        after: AfterArg = None,
    ) -> CallToolResult:
        """Tasks in id order: id, status, owner, deps, lease ("held" + seconds left, or
        "expired, reclaimable"); next: pass as after for more. A plan larger than limit
        gives a summary unless summary=false."""

        async def body(principal: Principal, r: Room) -> Body:
            page = await r.plan.page(limit, after, status)
            if summary or (summary is None and after is None and page.next_after is not None):
                return await self._summary(principal, r)
            budget = Budget(self.limits.max_result_bytes)
            out: list[dict[str, Any]] = []
            next_after = page.next_after
            for i, t in enumerate(page.tasks):
                item = self._task_item(t, details, budget, r.name, first=not out)
                if item is None:
                    next_after = page.tasks[i - 1].id
                    break
                out.append(item)
            return {"tasks": out, "next": next_after}

        return await self.run(ctx, room, "plan:read", body)

    def _task_item(
        self, t: Task, details: bool, budget: Budget, room: str, *, first: bool
    ) -> dict[str, Any] | None:
        """One task of read_plan, or ``None`` when it does not fit in ``budget`` (the page
        ends before it); the ``first`` of a page always goes, its values cut if need be."""
        item: dict[str, Any] = {"id": t.id, "status": t.status, "owner": t.owner}
        if t.lease_state is not None:
            item["lease"] = t.lease_state
            item["lease_remaining"] = _rounded(t.lease_remaining)
        if t.deps:
            item["deps"] = t.deps
        if not budget.fits(item) and not first:
            return None
        if details:
            fetch = f"GET /v1/rooms/{room}/tasks/{t.id} (HTTP API)"
            values = {"payload": t.payload, "result": t.result, "error": t.error}
            if not first and not budget.fits(values):
                return None
            item |= {
                "title": t.title or None,
                **{
                    k: verbatim(v) if not first else budget.value(v, fetch)
                    for k, v in values.items()
                },
                "attempts": t.attempts or None,
                "lease_granted_at": _rounded(t.lease_granted_at),
                "lease_renewed_at": _rounded(t.lease_renewed_at),
            }
        return item

    async def _summary(self, principal: Principal, r: Room) -> Body:
        """The plan in a few lines: counts by status, ready ids (the first
        :data:`SUMMARY_IDS`), the caller's claimed tasks."""
        tasks = await r.plan.tasks()
        counts = Counter(t.status for t in tasks)
        ready = [t.id for t in tasks if t.status == "ready"]
        yours = [
            {"id": t.id, "lease_remaining": _rounded(t.lease_remaining)}
            for t in tasks
            if t.status == "claimed" and t.owner == principal.agent
        ]
        return {
            "summary": True,
            "total": len(tasks),
            "counts": dict(sorted(counts.items())),
            "ready": ready[:SUMMARY_IDS],
            "ready_more": len(ready) > SUMMARY_IDS or None,
            "yours": yours[:SUMMARY_IDS],
            "hint": "claim_task takes the next ready task; summary=false pages through tasks",
        }

    async def add_tasks(
        self,
        room: RoomArg,
        tasks: Annotated[list[TaskIn], Field(min_length=1, max_length=1000)],
        ctx: Context[Any, Any],
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Add tasks, all or none; a task is ready once its deps are done. Returns the ids
        ready at once. bad_request names the task at fault: fix it, call again."""

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
                description="omit for the next ready one",
            ),
        ] = None,
        ttl: LeaseTtl = 60.0,
        wait: WaitArg = 0.0,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Lease the next ready task (or task_id), waiting up to wait s. Returns task,
        fence (for renew_lease/complete_task/fail_task), expires_at. claimed=false:
        finished=true: stop; else call again with wait. lease_held: take another."""

        async def body(principal: Principal, r: Room) -> Body:
            cmd = command_id(principal, request_id)
            agent = principal.agent
            wait_for = min(wait, self.limits.max_wait)
            got = (
                await r.plan.claim_next(agent, ttl=ttl, command_id=cmd, wait=wait_for)
                if task_id is None
                else await r.plan.claim(task_id, agent, ttl=ttl, command_id=cmd, wait=wait_for)
            )
            if got is None:
                finished = await r.plan.finished()
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
        """Extend your lease to ttl s from now, before it expires. stale_fence: another
        agent has it now; drop the work and claim_task again."""

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
        result: Annotated[JsonValue, Field(description="JSON")] = None,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Finish a task you hold with its result. stale_fence: drop it, claim again."""

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
        error: Annotated[JsonValue, Field(description="JSON")] = None,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Give back a task you hold with what went wrong: ready again while attempts
        remain, else failed."""

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
        reason: Annotated[JsonValue, Field(description="JSON")] = None,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Cancel an unfinished task; tasks that depend on it never become ready."""

        async def body(principal: Principal, r: Room) -> Body:
            cmd = command_id(principal, request_id)
            done = await r.plan.cancel(task_id, reason, command_id=cmd, author=principal.agent)
            return {"task_id": done.id, "status": done.status}

        return await self.run(ctx, room, "plan:write", body)
