"""Plumbing of the tools: argument types, annotations, and admitting a caller and
turning an outcome into a tool result."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from agentrooms.errors import (
    AgentroomsError,
    BadRequest,
    LeaseHeld,
    LockHeld,
    NotFound,
    RateLimited,
    Unauthorized,
)
from agentrooms.metrics import count_mcp_error
from agentrooms.rooms import Lease, Room, Rooms
from agentrooms.rooms import keys as room_keys
from agentrooms.server.access import PRINCIPAL, enter
from agentrooms.server.auth import Principal
from agentrooms.server.limits import HttpLimits, RateLimiter
from agentrooms.server.mcp.arguments import REQUEST_ID_PATTERN
from agentrooms.server.mcp.hints import (
    Hint,
    Verbatim,
    error_result,
    hint_for,
    ok_result,
    verbatim,
)
from agentrooms.server.models import DOC_PATTERN, MAX_INT, MAX_WAIT, NAME_PATTERN
from agentrooms.store.base import Store
from agentrooms.store.types import Event

__all__ = ["TaskIn", "ToolsBase"]

log = logging.getLogger("agentrooms.server.mcp")

Body = Mapping[str, Any]

RoomArg = Annotated[str, Field(pattern=NAME_PATTERN, max_length=128)]
TaskIdArg = Annotated[str, Field(pattern=NAME_PATTERN, max_length=128)]
FenceArg = Annotated[int, Field(ge=0, le=MAX_INT, description="from claim_task")]
RequestId = Annotated[
    str | None,
    Field(
        pattern=REQUEST_ID_PATTERN,
        max_length=64,
        description="idempotency key",
    ),
]
LeaseTtl = Annotated[float, Field(gt=0, le=86_400, description="lease seconds")]
StatusArg = Annotated[str, Field(min_length=1, max_length=200, description="what you are doing")]
DocNameArg = Annotated[
    str, Field(pattern=DOC_PATTERN, max_length=193, description="[partition/]name")
]
LockNameArg = Annotated[str, Field(pattern=NAME_PATTERN, max_length=128)]
LockToken = Annotated[str, Field(min_length=1, max_length=128, description="from acquire_lock")]
LimitArg = Annotated[int, Field(ge=1, le=1000)]
AfterArg = Annotated[str | None, Field(max_length=200, description="last page's next")]
WaitArg = Annotated[
    float,
    Field(ge=0, le=MAX_WAIT, description="seconds to wait for one"),
]
Subject = Literal["task", "document", "lock", "events"]

# MCP's defaults (readOnlyHint, destructiveHint and idempotentHint false) are left
# unsaid, and idempotentHint and destructiveHint beside readOnlyHint (MCP reads them
# only for tools that change state): the tool list is read into every model's context
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
IDEMPOTENT = ToolAnnotations(idempotent_hint=True, open_world_hint=False)
CHANGES = ToolAnnotations(open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(destructive_hint=True, open_world_hint=False)


class TaskIn(BaseModel):
    """A task to add to the plan."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: Annotated[str, Field(pattern=NAME_PATTERN, max_length=128)]
    title: str = Field(default="", max_length=1000)
    payload: JsonValue = Field(default=None, description="for the worker")
    deps: list[Annotated[str, Field(pattern=NAME_PATTERN, max_length=128)]] = Field(
        default_factory=list, max_length=1000, description="task ids to finish first"
    )
    max_attempts: int = Field(default=3, ge=1, le=1000)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (as a tool result carries it)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


class Budget:
    """The bytes one tool result may still take (``HttpLimits.max_result_bytes``): a list
    stops when its next item does not fit (the caller returns ``next`` there); a value
    that does not fit is replaced by a truncation marker saying how to fetch it."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def fits(self, value: Any) -> bool:
        """Take ``value``'s size if it fits (``True``), else take nothing."""
        size = json_size(value)
        if size > self.left:
            return False
        self.left -= size
        return True

    def value(self, value: Any, fetch: str) -> Any:
        """``value`` (kept verbatim) if it fits, else ``{truncated, bytes, fetch}``."""
        if value is None:
            return None
        if self.fits(value):
            return Verbatim(value)
        return {"truncated": True, "bytes": json_size(value), "fetch": fetch}


OffsetArg = Annotated[int, Field(ge=0, le=MAX_INT, description="next_offset of the last part")]


def part_of(value: Any, offset: int, limit: int, key: str = "value") -> dict[str, Any]:
    """``{key: value}`` when ``value`` fits in ``limit`` bytes (and ``offset`` is 0), else
    one part of its compact JSON text from character ``offset``: ``{json, offset,
    next_offset, total_chars, truncated}`` (``next_offset`` absent at the end); joined
    in order, the parts are that JSON text."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if offset == 0 and json_size(text) <= limit:
        return {key: Verbatim(value)}
    if offset > len(text):
        raise BadRequest(f"offset {offset} is past the end ({len(text)} characters)")
    n = max(1, limit // 2)
    while n > 1 and json_size(text[offset : offset + n]) > limit:
        n = n * 3 // 4
    end = min(len(text), offset + n)
    return {
        "json": text[offset:end],
        "offset": offset,
        "next_offset": end if end < len(text) else None,
        "total_chars": len(text),
        "truncated": True,
    }


def _event(event: Event, budget: Budget | None = None) -> dict[str, Any]:
    data: Any = verbatim(event.data)
    if budget is not None:
        data = budget.value(event.data, f"read_event seq={event.seq}")
    out = {"seq": event.seq, "type": event.type, "data": data}
    if event.author is not None:
        out["author"] = event.author
    if event.to:
        out["to"] = list(event.to)
    if event.to_roles:
        out["to_roles"] = list(event.to_roles)
    return out


class ToolsBase:
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

    def _lease(self, principal: Principal, r: Room, task_id: str, fence: int, ttl: float) -> Lease:
        return Lease(r.name, task_id, principal.agent, fence, 0.0, ttl)


class _Answered(Exception):
    """A failure already explained: its hint is the tool's answer."""

    def __init__(self, hint: Hint) -> None:
        self.hint = hint
        super().__init__(hint.text)
