"""The tools an agent calls, each a thin translation to the rooms library.

Every tool names its ``room``; who calls is fixed by the transport (stdio: the agent the
server was started for; HTTP: the bearer token, with the HTTP surface's scope and room
rules, a room outside the token answering exactly as an absent one). Nothing is kept
between calls: leases travel as ``task_id`` + ``fence``, lock grants as their ``token``,
the event cursor lives in the store. State-changing tools take an optional
``request_id`` that becomes the library's command id, scoped to the agent, so repeating
a call whose answer was lost applies nothing twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from agentrooms.errors import (
    AgentroomsError,
    BadRequest,
    Forbidden,
    InvalidTransition,
    LeaseHeld,
    LockHeld,
    NotFound,
    RateLimited,
    Unauthorized,
    VersionConflict,
)
from agentrooms.metrics import count_mcp_error
from agentrooms.rooms import Lease, Lock, Room, Rooms, TaskSpec
from agentrooms.rooms import keys as room_keys
from agentrooms.rooms.documents import check_doc_name
from agentrooms.server.auth import Principal
from agentrooms.server.deps import command_id, enter, held_grant
from agentrooms.server.gate import PRINCIPAL
from agentrooms.server.limits import HttpLimits, RateLimiter
from agentrooms.server.mcp.hints import (
    Hint,
    Verbatim,
    document_conflict,
    error_result,
    hint_for,
    lost_lock,
    ok_result,
    verbatim,
)
from agentrooms.server.models import DOC_PATTERN, MAX_INT, NAME_PATTERN, PARTITION
from agentrooms.store.base import Store
from agentrooms.store.types import Event

T = TypeVar("T")

__all__ = ["RoomTools", "TaskIn"]

log = logging.getLogger("agentrooms.server.mcp")

Body = Mapping[str, Any]

RoomArg = Annotated[
    str,
    Field(pattern=NAME_PATTERN, max_length=128, description="the room's name"),
]
TaskIdArg = Annotated[str, Field(pattern=NAME_PATTERN, max_length=128, description="the task's id")]
FenceArg = Annotated[
    int, Field(ge=0, le=MAX_INT, description="the fence your claim_task returned for this task")
]
RequestId = Annotated[
    str | None,
    Field(
        pattern=r"^[!-~]{1,64}$",
        max_length=64,
        description="idempotency key: a repeat with the same one applies once",
    ),
]
LeaseTtl = Annotated[
    float, Field(gt=0, le=86_400, description="lease length in seconds (renew before it ends)")
]
StatusArg = Annotated[
    str, Field(min_length=1, max_length=200, description="what you are doing, e.g. 'working'")
]
DocNameArg = Annotated[
    str,
    Field(pattern=DOC_PATTERN, max_length=193, description="document name, [partition/]name"),
]
Addressee = Annotated[str, Field(max_length=128)]  # a name: the library checks it
LockNameArg = Annotated[str, Field(pattern=NAME_PATTERN, max_length=128, description="lock name")]
LockToken = Annotated[
    str, Field(min_length=1, max_length=128, description="the token acquire_lock gave")
]
MAX_WAIT = 30.0  # the longest a claim_task or read_new_events call waits
WAKE_SLACK = 0.05  # seconds past a lease's end before a waiting claim looks again
WaitArg = Annotated[
    float,
    Field(ge=0, le=MAX_WAIT, description="seconds to wait if there is nothing yet (at most 30)"),
]
TERMINAL = frozenset({"done", "failed", "cancelled"})
Subject = Literal["task", "document", "lock", "events"]

# MCP's defaults (readOnlyHint and idempotentHint false) are left unsaid: the tool list
# is read into every model's context
READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
IDEMPOTENT = ToolAnnotations(idempotent_hint=True, open_world_hint=False)
CHANGES = ToolAnnotations(open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(destructive_hint=True, open_world_hint=False)


class TaskIn(BaseModel):
    """A task to add to the plan."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: Annotated[str, Field(pattern=NAME_PATTERN, max_length=128)]
    title: str = Field(default="", max_length=1000)
    payload: JsonValue = Field(default=None, description="anything the worker needs (JSON)")
    deps: list[Annotated[str, Field(pattern=NAME_PATTERN, max_length=128)]] = Field(
        default_factory=list, max_length=1000, description="ids of tasks that must be done first"
    )
    max_attempts: int = Field(default=3, ge=1, le=1000)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _event(event: Event) -> dict[str, Any]:
    out = {"seq": event.seq, "type": event.type, "data": verbatim(event.data)}
    if event.author is not None:
        out["author"] = event.author
    if event.to:
        out["to"] = list(event.to)
    if event.to_roles:
        out["to_roles"] = list(event.to_roles)
    return out


class RoomTools:
    """The tool implementations over one store. ``principal`` fixes the caller (stdio);
    without it each call's caller comes from its HTTP request (``scope[PRINCIPAL]``)."""

    def __init__(
        self,
        store: Store,
        *,
        principal: Principal | None,
        limits: HttpLimits,
    ) -> None:
        self.store = store
        self.rooms = Rooms(store)
        self.fixed = principal
        self.limits = limits
        self.limiter = None if limits.rate is None else RateLimiter(limits.rate, limits.burst)

    # ------------------------------------------------------------------ plumbing

    def principal(self, ctx: Context[Any, Any]) -> Principal:
        """Who is calling: the fixed agent, else the one the HTTP layer admitted."""
        return self.principal_of_request(ctx.request_context.request)

    def principal_of_request(self, request: Any) -> Principal:
        """The fixed agent, else the principal on an HTTP request's ASGI scope."""
        if self.fixed is not None:
            return self.fixed
        scope = getattr(request, "scope", None)
        principal = None if scope is None else scope.get(PRINCIPAL)
        if not isinstance(principal, Principal):
            raise Unauthorized("no authenticated caller for this request")
        return principal

    def enter(self, principal: Principal, room: str, scope: str) -> Room:
        """The room if ``principal`` may use ``scope`` there; a room outside its token is
        ``NotFound`` exactly like an absent one (the HTTP surface's rule)."""
        return enter(principal, self.rooms, room, scope)

    async def run(
        self,
        ctx: Context[Any, Any],
        room: str,
        scope: str,
        body: Callable[[Principal, Room], Awaitable[Body]],
        subject: Subject = "task",
    ) -> CallToolResult:
        """Admit the caller to ``room`` with ``scope``, run ``body``, and turn its outcome
        (or its error) into the tool result; a ``not_found`` is of the room or else of
        the tool's ``subject``."""

        async def entered(principal: Principal) -> Body:
            return await body(principal, self.enter(principal, room, scope))

        return await self.answer(ctx, entered, room, subject)

    async def answer(
        self,
        ctx: Context[Any, Any],
        body: Callable[[Principal], Awaitable[Body]],
        room: str | None = None,
        subject: Subject = "task",
    ) -> CallToolResult:
        """Run ``body`` for the caller and turn its outcome (or its error) into the tool
        result."""
        try:
            principal = self.principal(ctx)
            self.charge(principal)
            return ok_result(await body(principal))
        except _Answered as exc:
            hint = exc.hint
        except NotFound as exc:
            hint = hint_for(exc, missing=await self.missing(exc, room, subject, ctx))
        except AgentroomsError as exc:
            hint = hint_for(exc) if room is None else await self.explain(exc, room, ctx)
        except Exception:
            log.exception("MCP tool failed unexpectedly")
            hint = Hint(
                "internal_error",
                "the server failed unexpectedly (it is logged)",
                "retry once with the same request_id; if it fails again, report it",
            )
        count_mcp_error(hint.type)
        return error_result(hint)

    def charge(self, principal: Principal) -> None:
        if self.limiter is None:
            return
        wait = self.limiter.take(principal.agent)
        if wait > 0:
            raise RateLimited(wait, f"agent {principal.agent!r} is over its call rate")

    async def missing(
        self, exc: NotFound, room: str | None, subject: Subject, ctx: Context[Any, Any]
    ) -> str:
        """What a ``not_found`` is missing: the room (absent, or outside the token), else
        the tool's ``subject``."""
        if room is None or not self.principal(ctx).may_enter(room):
            return "room"
        try:
            await self.rooms.room(room).scope.read([])
        except NotFound:
            return "room"
        except AgentroomsError:
            return subject
        return subject

    async def explain(self, exc: AgentroomsError, room: str, ctx: Context[Any, Any]) -> Hint:
        """The hint for ``exc``; for a held lease or lock, with when it expires."""
        if isinstance(exc, LeaseHeld | LockHeld):
            lease = isinstance(exc, LeaseHeld)
            key = room_keys.task(exc.name) if lease else room_keys.lock(exc.name)
            try:
                snap = await self.rooms.room(room).scope.read([key])
            except AgentroomsError:
                return hint_for(exc)
            record = snap.get(key)
            expires: float | None = None
            if record is not None:
                expires = record.value.get("lease_expires") if lease else record.expires_at
            yours = exc.holder is not None and exc.holder == self.principal(ctx).agent
            expires_in = None if expires is None else expires - snap.now
            return hint_for(exc, expires_in=expires_in, yours=yours)
        return hint_for(exc)

    # --------------------------------------------------------------- the tools

    async def join_room(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        status: StatusArg = "online",
    ) -> CallToolResult:
        """Enter a room: announces you as online and returns where you stand: your event
        cursor, how many events you have not read (unread), how many tasks are ready, who
        is online, your role and which documents you may write. Call it first."""

        async def body(principal: Principal, r: Room) -> Body:
            member = await r.presence.heartbeat(principal.agent, status)
            out: dict[str, Any] = {"room": r.name, "you": principal.agent}
            if principal.has("events:read"):
                cursor = await r.events.cursor(principal.agent)
                head = await r.store.last_seq(r.name)
                out |= {"cursor": cursor, "unread": max(0, head - cursor)}
            if principal.has("plan:read"):
                out["ready"] = await r.plan.ready_count()
            if principal.has("rooms:read"):
                out["online"] = {m.agent: m.status for m in await r.presence.who_is_online()}
            out["heartbeat_every"] = round((member.expires_at - member.last_seen) / 2, 1)
            return out | {"role": principal.role, "writes": principal.writes()}

        return await self.run(ctx, room, "presence:write", body)

    async def heartbeat(
        self, room: RoomArg, ctx: Context[Any, Any], status: StatusArg = "online"
    ) -> CallToolResult:
        """Say you are still here (and what you are doing). Presence expires unless renewed:
        call it every heartbeat_every seconds that join_room returned."""

        async def body(principal: Principal, r: Room) -> Body:
            member = await r.presence.heartbeat(principal.agent, status)
            return {"status": member.status, "expires_in": member.expires_at - member.last_seen}

        return await self.run(ctx, room, "presence:write", body)

    async def who_is_online(self, room: RoomArg, ctx: Context[Any, Any]) -> CallToolResult:
        """Agents whose presence has not expired, with the status each last gave."""

        async def body(principal: Principal, r: Room) -> Body:
            return {"online": {m.agent: m.status for m in await r.presence.who_is_online()}}

        return await self.run(ctx, room, "rooms:read", body)

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

    async def _until(
        self,
        r: Room,
        wait: float,
        once: Callable[[], Awaitable[tuple[T | None, float | None]]],
    ) -> T | None:
        """Call ``once`` until it answers (not ``None``) or ``wait`` seconds pass, asleep
        on the store's watch in between: woken by any append to the room's log, or when
        ``once`` said something changes without one (its second value, in seconds)."""
        deadline = time.monotonic() + wait
        while True:
            head = await r.store.last_seq(r.name)  # before trying: no append goes unseen
            got, changes_in = await once()
            left = deadline - time.monotonic()
            if got is not None or left <= 0:
                return got
            if changes_in is not None:
                left = min(left, max(changes_in, 0.0) + WAKE_SLACK)
            await r.store.watch(r.name, head, left)

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

    async def read_new_events(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        limit: Annotated[int, Field(ge=1, le=1000, description="at most this many")] = 100,
        wait: WaitArg = 0.0,
        explicit: Annotated[
            bool, Field(description="keep your cursor until ack_events (at-least-once)")
        ] = False,
        skip_to_latest: Annotated[
            bool,
            Field(description="move your cursor to the newest event without reading (resync)"),
        ] = False,
        inbox: Annotated[
            bool, Field(description="only those addressed to you or your role")
        ] = False,
    ) -> CallToolResult:
        """Events you have not seen yet, oldest first, as {seq, type, data, author}, waiting
        up to wait seconds for one; your cursor moves past them (explicit: only on
        ack_events), so the next call returns only newer ones. more=true: call again."""

        async def body(principal: Principal, r: Room) -> Body:
            agent = principal.agent
            if skip_to_latest:
                return {"events": [], "cursor": await r.events.resync(agent, inbox=inbox)}

            ack: Literal["auto", "explicit"] = "explicit" if explicit else "auto"
            roles = [] if principal.role is None else [principal.role]
            more = False

            async def once() -> tuple[list[Event] | None, float | None]:
                nonlocal more
                if not inbox:
                    return (await r.events.read_new(agent, limit, ack=ack) or None), None
                page = await r.events.read_inbox(agent, roles, limit, ack=ack)
                more = page.more
                return (page.events or None), (0.0 if page.more else None)

            events = await self._until(r, wait, once)
            if not events or explicit or inbox:
                cursor = await r.events.cursor(agent, inbox=inbox)
                if not events:
                    return {"events": [], "cursor": cursor, "more": more or None}
            else:
                cursor = events[-1].seq
            if not inbox:
                more = len(events) == limit and await r.store.last_seq(r.name) > events[-1].seq
            return {"events": [_event(e) for e in events], "cursor": cursor, "more": more or None}

        return await self.run(ctx, room, "events:read", body, "events")

    async def ack_events(
        self,
        room: RoomArg,
        seq: Annotated[int, Field(ge=0, le=MAX_INT, description="the last event you handled")],
        ctx: Context[Any, Any],
        inbox: Annotated[bool, Field(description="of inbox reads")] = False,
    ) -> CallToolResult:
        """Move your cursor forward to seq (never back): the events up to it are handled.
        For read_new_events with explicit=true."""

        async def body(principal: Principal, r: Room) -> Body:
            return {"cursor": await r.events.ack(principal.agent, seq, inbox=inbox)}

        return await self.run(ctx, room, "events:read", body, "events")

    async def post_event(
        self,
        room: RoomArg,
        type: Annotated[
            str,
            Field(pattern=NAME_PATTERN, max_length=128, description="event type, e.g. 'note'"),
        ],
        ctx: Context[Any, Any],
        data: Annotated[JsonValue, Field(description="the event's data (JSON)")] = None,
        to: Annotated[
            list[Addressee], Field(max_length=100, description="inbox of these agents")
        ] = [],  # noqa: B006
        to_roles: Annotated[
            list[Addressee], Field(max_length=100, description="and of these roles")
        ] = [],  # noqa: B006
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Append an event to the room's log for every agent to read; you are its author."""

        async def body(principal: Principal, r: Room) -> Body:
            cmd = command_id(principal, request_id)
            seq = await r.events.post(
                type, data, command_id=cmd, author=principal.agent, to=to, to_roles=to_roles
            )
            return {"seq": seq}

        return await self.run(ctx, room, "events:write", body)

    async def read_document(
        self, room: RoomArg, name: DocNameArg, ctx: Context[Any, Any]
    ) -> CallToolResult:
        """A document's value and version. Write it back with write_document and that
        version."""

        async def body(principal: Principal, r: Room) -> Body:
            doc = await r.docs.get(name)
            return {"value": Verbatim(doc.value), "version": doc.version}

        return await self.run(ctx, room, "docs:read", body, "document")

    async def write_document(
        self,
        room: RoomArg,
        name: DocNameArg,
        value: Annotated[JsonValue, Field(description="the new value (JSON)")],
        version: Annotated[
            int,
            Field(
                ge=0,
                le=MAX_INT,
                description="the version you read (0 to create a new document); the write "
                "fails with version_conflict if it changed since",
            ),
        ],
        ctx: Context[Any, Any],
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Replace a document, only if it is still at the version you read (version 0:
        only if it does not exist yet). Returns the new version."""

        async def body(principal: Principal, r: Room) -> Body:
            check_doc_name(name)
            principal.check_doc_write(name)
            doc = await r.docs.put(
                name,
                value,
                if_match=version or None,
                create_only=version == 0,
                command_id=command_id(principal, request_id),
                author=principal.agent,
            )
            return {"version": doc.version}

        async def guarded(principal: Principal, r: Room) -> Body:
            try:
                return await body(principal, r)
            except VersionConflict as exc:
                current = exc.conflicts.get(room_keys.doc(name))
                raise _Answered(document_conflict(name, version, current)) from exc

        return await self.run(ctx, room, "docs:write", guarded, "document")

    async def delete_document(
        self,
        room: RoomArg,
        name: DocNameArg,
        version: Annotated[
            int, Field(ge=1, le=MAX_INT, description="the version you read (it must still be)")
        ],
        ctx: Context[Any, Any],
    ) -> CallToolResult:
        """Delete a document, only if it is still at the version you read."""

        async def body(principal: Principal, r: Room) -> Body:
            check_doc_name(name)
            principal.check_doc_write(name)
            try:
                await r.docs.delete(name, if_match=version, author=principal.agent)
            except VersionConflict as exc:
                current = exc.conflicts.get(room_keys.doc(name))
                raise _Answered(document_conflict(name, version, current)) from exc
            return {"deleted": name}

        return await self.run(ctx, room, "docs:write", body, "document")

    async def list_documents(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        partition: Annotated[
            str | None, Field(pattern=PARTITION, max_length=64, description="only this partition's")
        ] = None,
    ) -> CallToolResult:
        """The room's documents by name, with their versions (read_document for a value)."""

        async def body(principal: Principal, r: Room) -> Body:
            docs = await r.docs.list(partition)
            return {"documents": [{"name": d.name, "version": d.version} for d in docs]}

        return await self.run(ctx, room, "docs:read", body, "document")

    async def acquire_lock(
        self,
        room: RoomArg,
        name: LockNameArg,
        ctx: Context[Any, Any],
        ttl: Annotated[
            float, Field(gt=0, le=86_400, description="seconds until it expires by itself")
        ] = 30.0,
        wait: Annotated[
            float, Field(ge=0, le=3600, description="seconds to queue if it is held (capped)")
        ] = 0.0,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Take a named lock (optionally queueing up to wait seconds). Returns its token
        (for release_lock) and fence."""

        async def body(principal: Principal, r: Room) -> Body:
            lock = await self._acquire(principal, r, name, ttl, wait, request_id)
            return {
                "token": lock.token,
                "fence": lock.fence,
                "expires_at": _rounded(lock.expires_at),
                "granted_at": _rounded(lock.granted_at),
            }

        return await self.run(ctx, room, "locks:write", body)

    async def _acquire(
        self,
        principal: Principal,
        r: Room,
        name: str,
        ttl: float,
        wait: float,
        request_id: str | None,
    ) -> Lock:
        locks, cmd = r.locks, command_id(principal, request_id)
        if wait > 0:
            timeout = min(wait, self.limits.max_lock_wait)
            return await locks.wait_acquire(
                name, principal.agent, ttl=ttl, timeout=timeout, command_id=cmd
            )
        return await locks.try_acquire(name, principal.agent, ttl=ttl, command_id=cmd)

    async def release_lock(
        self,
        room: RoomArg,
        name: LockNameArg,
        token: LockToken,
        ctx: Context[Any, Any],
    ) -> CallToolResult:
        """Release a lock you hold (it passes to the next queued agent). released=false
        when your grant had already expired or changed hands."""

        async def body(principal: Principal, r: Room) -> Body:
            held = await held_grant(r, name, principal.agent, token)
            if held is None:
                return {"released": False}
            lock = Lock(r.name, name, principal.agent, token, held.value["fence"], 0.0, 0.0)
            return {"released": await r.locks.release(lock)}

        return await self.run(ctx, room, "locks:write", body, "lock")

    async def extend_lock(
        self,
        room: RoomArg,
        name: LockNameArg,
        token: LockToken,
        ctx: Context[Any, Any],
        ttl: Annotated[float, Field(gt=0, le=86_400, description="seconds from now")] = 30.0,
    ) -> CallToolResult:
        """Keep a lock you hold for ttl more seconds (before it expires)."""

        async def body(principal: Principal, r: Room) -> Body:
            held = await held_grant(r, name, principal.agent, token)
            if held is None:
                raise _Answered(lost_lock(name))
            value = held.value
            lock = Lock(r.name, name, principal.agent, token, value["fence"], 0.0, value["ttl"])
            extended = await r.locks.extend(lock, ttl)
            return {"fence": extended.fence, "expires_at": _rounded(extended.expires_at)}

        return await self.run(ctx, room, "locks:write", body, "lock")

    async def list_locks(self, room: RoomArg, ctx: Context[Any, Any]) -> CallToolResult:
        """The room's held locks: holder, since (granted_at), fence, expires_at, and the
        agents waiting in line for each, first first."""

        async def body(principal: Principal, r: Room) -> Body:
            out = []
            for info in await r.locks.held():
                line = await r.locks.waiters(info.name)
                out.append(
                    {
                        "name": info.name,
                        "holder": info.owner,
                        "since": _rounded(info.granted_at),
                        "fence": info.fence,
                        "expires_at": _rounded(info.expires_at),
                        "waiters": [w.owner for w in line] or None,
                    }
                )
            return {"locks": out}

        return await self.run(ctx, room, "rooms:read", body, "lock")

    async def list_rooms(self, ctx: Context[Any, Any]) -> CallToolResult:
        """The rooms you may enter, with how many tasks are ready in each."""

        async def body(principal: Principal) -> Body:
            if not principal.has("rooms:read"):
                raise Forbidden("this token lacks the 'rooms:read' scope")
            rooms = [i for i in await self.rooms.list() if principal.may_enter(i.name)]
            return {
                "rooms": [
                    {"name": i.name, "description": i.description or None, "ready": i.ready}
                    for i in rooms
                ]
            }

        return await self.answer(ctx, body)


class _Answered(Exception):
    """A failure already explained: its hint is the tool's answer."""

    def __init__(self, hint: Hint) -> None:
        self.hint = hint
        super().__init__(hint.text)
