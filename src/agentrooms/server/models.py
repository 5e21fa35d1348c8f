"""Request and response bodies: the models FastAPI validates with and the OpenAPI
document is generated from, so the two cannot drift.

Request models are strict (no type coercion, no unknown fields) and carry the same
bounds as the library checks, so a request the schema calls invalid is a ``400`` before
any route runs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from agentrooms.rooms import Task
from agentrooms.store.types import MAX_TTL

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
DOC_PATTERN = r"^(?:[A-Za-z0-9][A-Za-z0-9._:-]{0,63}/)?[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
PARTITION = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"  # a document partition (a role)
MAX_INT = 2**53 - 1  # exact in every JSON implementation
MAX_WAIT = 30.0  # the longest one claim or read of new events waits (HTTP and MCP)

Name = Annotated[str, Field(pattern=NAME_PATTERN, min_length=1, max_length=128)]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]
Seconds = Annotated[float, Field(gt=0, le=86_400)]
WAIT_HELP = "seconds to wait for one, woken by the store (0: answer at once)"
Wait = Annotated[float, Field(ge=0, le=MAX_WAIT, description=WAIT_HELP)]


class In(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class Out(BaseModel):
    """A response body read off the library's object of the same fields."""

    @classmethod
    def of(cls, obj: object) -> Self:
        return cls.model_validate(obj, from_attributes=True)


# ----------------------------------------------------------------------------- rooms


class RoomCreate(In):
    name: Name
    description: str = Field(default="", max_length=10_000)
    metadata: JsonValue = None


class RoomOut(Out):
    name: str
    description: str
    metadata: JsonValue
    created_at: float
    archived: bool
    last_seq: int
    ready: int


class RoomList(BaseModel):
    rooms: list[RoomOut]
    next_after: str | None = None  # pass as ?after= for the next page; null at the end


# ----------------------------------------------------------------------------- tasks


class TaskIn(In):
    id: Name
    title: str = Field(default="", max_length=1000)
    payload: JsonValue = None
    deps: list[Name] = Field(default_factory=list, max_length=1000)
    max_attempts: int = Field(default=3, ge=1, le=1000)


class TasksAdd(In):
    tasks: list[TaskIn] = Field(min_length=1, max_length=1000)


class TasksAdded(BaseModel):
    ready: list[str] = Field(description="ids of the added tasks that are ready at once")


class TaskOut(BaseModel):
    id: str
    title: str
    payload: JsonValue
    status: Literal["pending", "ready", "claimed", "done", "failed", "cancelled"]
    deps: list[str]
    waiting_on: list[str]
    dependents: list[str]
    owner: str | None
    result: JsonValue
    error: JsonValue
    attempts: int
    max_attempts: int
    fence: int
    lease_expires: float | None
    lease_granted_at: float | None = Field(description="store clock: the claim of this lease")
    lease_renewed_at: float | None = Field(description="store clock: its last renewal, if any")
    version: int
    lease_state: Literal["held", "expired, reclaimable", "expired, last attempt"] | None = Field(
        description="a claimed task's lease as of the read's store time (null: not claimed)"
    )
    lease_remaining: float | None = Field(
        description="seconds left on the lease as of the read (0: expired; null: not claimed)"
    )
    state: str = Field(
        description="what to show: the status, or lease_state once the lease has expired"
    )

    @classmethod
    def of(cls, task: Task) -> TaskOut:
        return cls.model_validate(
            {
                **task.to_value(),
                "version": task.version,
                "lease_state": task.lease_state,
                "lease_remaining": task.lease_remaining,
                "state": task.state,
            }
        )


class TaskList(BaseModel):
    tasks: list[TaskOut]
    next_after: str | None = None  # with ?limit=: the next page's ?after=; null at the end


class ClaimIn(In):
    agent: Name | None = Field(default=None, description="must be the token's agent when given")
    ttl: Seconds = 60.0
    wait: Wait = 0.0


class LeaseOut(Out):
    room: str
    task_id: str
    agent: str
    fence: int
    expires_at: float
    ttl: float
    granted_at: float | None = Field(description="store clock: the claim that granted it")


class ClaimNextOut(BaseModel):
    lease: LeaseOut | None = Field(description="null when no task is ready (after wait)")
    finished: bool = Field(
        default=False,
        description="with a null lease: every task is done, failed or cancelled (stop)",
    )


class LeaseIn(In):
    """The lease a claim returned, sent back by its holder."""

    task_id: Name | None = Field(default=None, description="must be the path's task when given")
    agent: Name | None = Field(default=None, description="must be the token's agent when given")
    fence: Count
    expires_at: float = Field(default=0.0, ge=0, le=1e12, description="as the claim returned it")
    granted_at: float | None = Field(
        default=None, ge=0, le=1e12, description="as the claim returned it (not checked)"
    )
    room: Name | None = Field(default=None, description="must be the path's room when given")
    ttl: Seconds | None = Field(default=None, description="renew: the new lease length")


class CompleteIn(LeaseIn):
    result: JsonValue = None


class FailIn(LeaseIn):
    error: JsonValue = None


class CancelIn(In):
    reason: JsonValue = None


# ------------------------------------------------------------------------- documents


class Guard(In):
    """Write only while this lease (``task``) or lock (``lock``) grant is current."""

    task: Name | None = None
    lock: Name | None = None
    fence: Count


class DocPut(In):
    value: JsonValue
    guard: Guard | None = None


class DocOut(Out):
    name: str
    value: JsonValue
    version: int
    writer: str | None = Field(
        default=None, description="the agent that wrote this version (null: no author named)"
    )


class DocList(BaseModel):
    documents: list[DocOut]


# ---------------------------------------------------------------------------- events


Role = Annotated[str, Field(pattern=PARTITION, min_length=1, max_length=64)]


class EventIn(In):
    type: Name
    data: JsonValue = None
    to: list[Name] = Field(
        default_factory=list, max_length=100, description="agents it is addressed to (inbox)"
    )
    to_roles: list[Role] = Field(
        default_factory=list, max_length=100, description="roles it is addressed to (inbox)"
    )


class Posted(BaseModel):
    seq: int = Field(description="the event's sequence number (a replay answers the first call's)")


class EventOut(Out):
    seq: int
    type: str
    data: JsonValue
    time: float
    author: str | None = Field(
        description="the agent that appended it: for a post, the token's (null: none named)"
    )
    to: list[str] = Field(default_factory=list, description="agents it is addressed to")
    to_roles: list[str] = Field(default_factory=list, description="roles it is addressed to")


class EventList(BaseModel):
    events: list[EventOut]


class InboxList(EventList):
    """An inbox read: the events addressed to the caller, and how far the log was read."""

    scanned: int = Field(description="the log was looked at up to this sequence")
    more: bool = Field(description="stopped before the log's head: read again at once")


class AckIn(In):
    seq: Count
    inbox: bool = Field(default=False, description="move the inbox cursor, not the full one")


class CursorOut(BaseModel):
    cursor: int


# -------------------------------------------------------------------------- presence


class HeartbeatIn(In):
    status: str = Field(default="online", min_length=1, max_length=200)
    metadata: JsonValue = None
    ttl: Seconds = 120.0


class MemberOut(Out):
    agent: str
    status: str
    metadata: JsonValue
    last_seen: float
    expires_at: float


class MemberList(BaseModel):
    members: list[MemberOut]
    next_after: str | None = None  # with ?limit=: the next page's ?after=; null at the end


# ----------------------------------------------------------------------------- locks


class AcquireIn(In):
    agent: Name | None = Field(default=None, description="must be the token's agent when given")
    ttl: Seconds = 30.0
    wait: float = Field(
        default=0.0, ge=0, le=3600, description="seconds to queue for a held lock (server-capped)"
    )


class LockOut(BaseModel):
    room: str
    name: str
    owner: str
    token: str = Field(description="proof of this grant: send it to release or extend")
    fence: int
    expires_at: float
    ttl: float
    granted_at: float | None = Field(description="store clock: the write that granted it")
    renewed_at: float | None = Field(description="store clock: its last extend, if any")


class LockRef(In):
    token: str = Field(pattern=r"^[0-9a-f]{32}$")
    fence: Count


class ExtendIn(LockRef):
    ttl: Seconds | None = None


class RequeueIn(LockRef):
    wait: float = Field(
        default=30.0, gt=0, le=3600, description="seconds to wait for the next turn (capped)"
    )


class Released(BaseModel):
    released: bool


class HolderOut(Out):
    owner: str
    fence: int
    expires_at: float | None
    granted_at: float | None = Field(description="store clock: the write that granted it")
    renewed_at: float | None = Field(description="store clock: its last extend, if any")


class WaiterOut(Out):
    waiter: str
    owner: str
    ticket: int = Field(description="place in line: lower goes first")
    joined_at: float | None = Field(description="store clock: when it joined the line")
    expires_at: float | None


class LockState(BaseModel):
    name: str
    holder: HolderOut | None = Field(description="null: free (an expired grant holds nothing)")
    waiters: list[WaiterOut] = Field(description="the agents in line, first in line first")


# ---------------------------------------------------------------------------- health


class Status(BaseModel):
    status: str


# ---------------------------------------------------------------------------- tokens


class TokenMint(In):
    agent: Name
    rooms: list[Name] | Literal["*"] = Field(max_length=1000)
    scopes: list[str] = Field(max_length=64)
    role: str | None = Field(default=None, pattern=PARTITION)
    ttl: float = Field(default=30 * 86_400.0, gt=0, le=MAX_TTL)


class TokenOut(Out):
    id: str
    agent: str
    rooms: list[str] | Literal["*"]
    scopes: list[str]
    role: str | None
    created_at: float
    expires_at: float
    revoked_at: float | None = None


class Minted(BaseModel):
    token: str = Field(description="ar_<id>_<secret>: shown this once, stored only hashed")
    info: TokenOut


class TokenList(BaseModel):
    now: float = Field(description="the store's clock, to judge expiries by")
    tokens: list[TokenOut]
    next_after: str | None = None  # pass as ?after= for the next page; null at the end


class StoreOut(BaseModel):
    backend: str = Field(description="memory, sqlite, redis, redis-cluster or postgres")
    durability: str
    warnings: list[str] = Field(description="settings that can lose acknowledged writes")


class ServerOut(BaseModel):
    """``GET /v1/server``: what ``agentrooms doctor --server`` shows (no credentials)."""

    version: str
    now: float = Field(description="the store's clock")
    store: StoreOut
    limits: dict[str, float | int | None] = Field(description="the server's limits; null: off")
    token: TokenOut | None = Field(description="the caller's token; null in dev mode")
    agent: str
    scopes: list[str]


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")
