"""The library's room objects over the HTTP API: :class:`Client`, its :class:`Rooms`, and
one :class:`Room`'s plan, documents, events, presence and locks.

Each method has the name, arguments and result types of the library method it mirrors
(:mod:`agentrooms.rooms`), and raises the same :mod:`agentrooms.errors` classes. What
HTTP changes:

* The acting agent is always the token's. Methods that name an agent (``claim``,
  ``read_new``, ``heartbeat``...) take it as the library does, but it may be left out;
  naming another agent is ``Forbidden`` (the server's ``403``).
* Every state-changing command the server keys (add, claim, claim_next, renew, complete,
  fail, cancel, post, document put, lock acquire) sends an ``Idempotency-Key``: pass
  ``command_id=`` to choose it (a retry from another process then finds the first
  outcome), else one is made per call; a retry of an unknown outcome reuses it
  (:mod:`.http`).
* A document write needs a condition (``if_match``, ``create_only`` or
  ``must_exist``): an unconditional one is the server's ``428 precondition_required``.
* ``claim_next`` has no ``accept`` filter, ``try_acquire`` no ``read=``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx

from agentrooms.errors import (
    BadRequest,
    Forbidden,
    InvalidTransition,
    LockHeld,
    NotFound,
    StaleFence,
    StoreUnavailable,
)
from agentrooms.rooms import keys
from agentrooms.rooms.documents import Document
from agentrooms.rooms.events import InboxPage
from agentrooms.rooms.locks import DEFAULT_TTL as LOCK_TTL
from agentrooms.rooms.locks import Lock, LockInfo, WaiterInfo
from agentrooms.rooms.plan import DEFAULT_LEASE, Lease, LeaseKeeper, Task, TaskList, TaskSpec
from agentrooms.rooms.presence import DEFAULT_TTL as PRESENCE_TTL
from agentrooms.rooms.presence import Member, MemberPage
from agentrooms.rooms.room import RoomInfo, RoomList
from agentrooms.store.types import JSON, Event, FenceAtMost

from .http import Http, error_from

__all__ = ["Client", "Documents", "Events", "Locks", "Plan", "Presence", "Room", "Rooms"]

D = TypeVar("D")
Ack = Literal["auto", "explicit"]
TOKEN_ENV = "AGENTROOMS_TOKEN"


def _of(kind: type[D], data: Mapping[str, Any], **extra: Any) -> D:
    """The dataclass ``kind`` from a response body's fields (others are ignored)."""
    names = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    return kind(**{k: v for k, v in {**data, **extra}.items() if k in names})


def _seg(value: str) -> str:
    return quote(value, safe="")


class Client:
    """The HTTP API at ``url`` as the token's agent. ``token`` defaults to
    ``$AGENTROOMS_TOKEN`` (none: a server in dev mode). ``agent``, when given, is the
    agent the token acts as, checked locally where a method names one. Use as
    ``async with Client(url, token) as client:`` or :meth:`close` it."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        agent: str | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.http = Http(url, token, timeout=timeout, retries=retries, transport=transport)
        self.url = self.http.base_url
        self.agent = agent
        self.rooms = Rooms(self)

    def room(self, name: str) -> Room:
        """A handle on room ``name`` (each call checks that it exists)."""
        return Room(self, name)

    def acting(self, agent: str | None) -> str | None:
        """``agent`` if it may be named here (``Forbidden`` if it is known not to be the
        token's agent; the server checks it in any case)."""
        if agent is not None and self.agent is not None and agent != self.agent:
            raise Forbidden(f"this token acts as {self.agent!r}, not {agent!r}")
        return agent

    async def close(self) -> None:
        await self.http.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Rooms:
    """The rooms the token may enter."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._http = client.http

    def room(self, name: str) -> Room:
        return self._client.room(name)

    async def get(self, name: str) -> Room:
        """A handle on an existing room; ``NotFound`` otherwise."""
        room = self.room(name)
        await room.describe()
        return room

    async def create(self, name: str, description: str = "", metadata: JSON = None) -> Room:
        """Create room ``name``; ``VersionConflict`` if it already exists."""
        body = {"name": name, "description": description, "metadata": metadata}
        await self._http.json("POST", "/rooms", safety="once", body=body)
        return self.room(name)

    async def page(
        self, limit: int = 100, after: str | None = None, *, include_archived: bool = False
    ) -> RoomList:
        """One page of rooms by name; ``next_after`` the next page's ``after``."""
        params = {"limit": limit, "after": after, "archived": str(include_archived).lower()}
        body = await self._http.json("GET", "/rooms", safety="idempotent", params=params)
        return RoomList([_of(RoomInfo, r) for r in body["rooms"]], body.get("next_after"))

    async def list(self, *, include_archived: bool = False) -> list[RoomInfo]:
        """Every room the token may enter, by name (page by page)."""
        out: list[RoomInfo] = []
        after: str | None = None
        while True:
            page = await self.page(1000, after, include_archived=include_archived)
            out += page.rooms
            if page.next_after is None:
                return out
            after = page.next_after

    async def describe(self, name: str) -> RoomInfo:
        return await self.room(name).describe()

    async def archive(self, name: str) -> RoomInfo:
        """Make the room read-only."""
        body = await self._http.json("POST", f"/rooms/{_seg(name)}/archive", safety="idempotent")
        return _of(RoomInfo, body)

    async def delete(self, name: str) -> None:
        """Delete the room and everything in it (not retried once sent)."""
        await self._http.call("DELETE", f"/rooms/{_seg(name)}", safety="once")


class Room:
    """One room's plan, documents, events, presence and locks."""

    def __init__(self, client: Client, name: str) -> None:
        self.name = name
        self.client = client
        self.path = f"/rooms/{_seg(name)}"
        self.plan = Plan(self)
        self.docs = Documents(self)
        self.events = Events(self)
        self.presence = Presence(self)
        self.locks = Locks(self)

    async def describe(self) -> RoomInfo:
        """The room's description, log head and ready count; ``NotFound`` if absent."""
        body = await self.client.http.json("GET", self.path, safety="idempotent")
        return _of(RoomInfo, body)


class _Part:
    def __init__(self, room: Room) -> None:
        self._room = room
        self._client = room.client
        self._http = room.client.http

    @property
    def room(self) -> str:
        return self._room.name

    def _key(self, command_id: str | None) -> dict[str, str]:
        return {} if command_id is None else {"Idempotency-Key": command_id}


# ------------------------------------------------------------------------------ plan


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


class Plan(_Part):
    """The room's tasks, claimed under fenced leases (:class:`agentrooms.rooms.Plan`)."""

    def _task(self, task_id: str) -> str:
        return f"{self._room.path}/tasks/{_seg(task_id)}"

    async def get(self, task_id: str) -> Task:
        return _of(Task, await self._http.json("GET", self._task(task_id), safety="idempotent"))

    async def tasks(self, status: str | None = None) -> list[Task]:
        """Every task in id order (optionally only those with ``status``)."""
        params = {"status": status}
        path = f"{self._room.path}/tasks"
        body = await self._http.json("GET", path, safety="idempotent", params=params)
        return [_of(Task, t) for t in body["tasks"]]

    async def page(
        self, limit: int = 100, after: str | None = None, status: str | None = None
    ) -> TaskList:
        params = {"limit": limit, "after": after, "status": status}
        path = f"{self._room.path}/tasks"
        body = await self._http.json("GET", path, safety="idempotent", params=params)
        return TaskList([_of(Task, t) for t in body["tasks"]], body.get("next_after"))

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
        body = await self._http.json(
            "POST",
            f"{self._room.path}/tasks",
            safety="keyed",
            body={"tasks": tasks},
            headers=self._key(command_id),
        )
        ready: list[str] = body["ready"]
        return ready

    async def claim_next(
        self,
        agent: str | None = None,
        *,
        ttl: float = DEFAULT_LEASE,
        command_id: str | None = None,
    ) -> Lease | None:
        """Claim a ready task (or one whose lease expired); ``None`` if there is none."""
        body = await self._http.json(
            "POST",
            f"{self._room.path}/tasks/claim-next",
            safety="keyed",
            body={"agent": self._client.acting(agent), "ttl": ttl},
            headers=self._key(command_id),
        )
        lease = body["lease"]
        return None if lease is None else _of(Lease, lease)

    async def claim(
        self,
        task_id: str,
        agent: str | None = None,
        *,
        ttl: float = DEFAULT_LEASE,
        command_id: str | None = None,
    ) -> Lease:
        """Claim one named task (``LeaseHeld``, ``NotFound``, ``InvalidTransition``)."""
        body = await self._http.json(
            "POST",
            f"{self._task(task_id)}/claim",
            safety="keyed",
            body={"agent": self._client.acting(agent), "ttl": ttl},
            headers=self._key(command_id),
        )
        return _of(Lease, body)

    async def renew(
        self, lease: Lease, ttl: float = DEFAULT_LEASE, *, command_id: str | None = None
    ) -> Lease:
        """Extend the lease by ``ttl`` from now; ``StaleFence`` if it was lost."""
        body = await self._http.json(
            "POST",
            f"{self._task(lease.task_id)}/renew",
            safety="keyed",
            body=_lease_body(lease, ttl=ttl),
            headers=self._key(command_id),
        )
        return _of(Lease, body)

    async def complete(
        self, lease: Lease, result: JSON = None, *, command_id: str | None = None
    ) -> Task:
        """Record the result; ``StaleFence`` if the lease is no longer current."""
        body = await self._http.json(
            "POST",
            f"{self._task(lease.task_id)}/complete",
            safety="keyed",
            body=_lease_body(lease, result=result),
            headers=self._key(command_id),
        )
        return _of(Task, body)

    async def fail(
        self, lease: Lease, error: JSON = None, *, command_id: str | None = None
    ) -> Task:
        """Give the task back: ready again while attempts remain, else ``failed``."""
        body = await self._http.json(
            "POST",
            f"{self._task(lease.task_id)}/fail",
            safety="keyed",
            body=_lease_body(lease, error=error),
            headers=self._key(command_id),
        )
        return _of(Task, body)

    async def cancel(
        self, task_id: str, reason: JSON = None, *, command_id: str | None = None
    ) -> Task:
        """Cancel a task that is not finished; its holder's token becomes stale."""
        body = await self._http.json(
            "POST",
            f"{self._task(task_id)}/cancel",
            safety="keyed",
            body={"reason": reason},
            headers=self._key(command_id),
        )
        return _of(Task, body)

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


# ------------------------------------------------------------------------- documents


def _guard(fence: FenceAtMost | None) -> dict[str, Any] | None:
    """A library fence (``lease.guard()``, ``lock.guard()``) as the API's ``guard``."""
    if fence is None:
        return None
    for prefix, kind in (("task/", "task"), ("lockfence/", "lock")):
        if fence.key.startswith(prefix):
            return {kind: fence.key[len(prefix) :], "fence": fence.fence}
    raise BadRequest(f"a document write is fenced by a lease or a lock, not {fence.key!r}")


def _etag(version: int | None) -> str | None:
    return None if version is None else f'"{version}"'


class Documents(_Part):
    """Versioned documents (:class:`agentrooms.rooms.Documents`)."""

    def _doc(self, name: str) -> str:
        return f"{self._room.path}/docs/{quote(name, safe='/')}"

    async def get(self, name: str) -> Document:
        return _of(Document, await self._http.json("GET", self._doc(name), safety="idempotent"))

    async def list(self, partition: str | None = None) -> list[Document]:
        """Documents by name (optionally one partition's)."""
        body = await self._http.json(
            "GET", f"{self._room.path}/docs", safety="idempotent", params={"partition": partition}
        )
        return [_of(Document, d) for d in body["documents"]]

    async def put(
        self,
        name: str,
        value: JSON,
        *,
        if_match: int | None = None,
        create_only: bool = False,
        must_exist: bool = False,
        fence: FenceAtMost | None = None,
        command_id: str | None = None,
    ) -> Document:
        """Write the document under one condition: ``if_match`` (that version),
        ``create_only`` (absent) or ``must_exist`` (any version); ``fence`` (a lease's or
        lock's ``guard()``): only while it is current (``StaleFence``). A failed
        condition is ``VersionConflict`` naming the current version."""
        if (if_match is not None) + create_only + must_exist > 1:
            raise BadRequest("if_match, create_only and must_exist exclude each other")
        headers = self._key(command_id)
        if if_match is not None:
            headers["If-Match"] = f'"{if_match}"'
        elif create_only:
            headers["If-None-Match"] = "*"
        elif must_exist:
            headers["If-Match"] = "*"
        body: dict[str, Any] = {"value": value}
        if fence is not None:
            body["guard"] = _guard(fence)
        data = await self._http.json(
            "PUT", self._doc(name), safety="keyed", body=body, headers=headers
        )
        return _of(Document, data)

    async def delete(
        self, name: str, *, if_match: int | None = None, must_exist: bool = False
    ) -> None:
        """Delete the document at version ``if_match`` (``VersionConflict`` otherwise)
        or, with ``must_exist``, at any version. Not retried once sent (the server keys
        no delete): an unknown outcome is ``StoreUnavailable``."""
        if (if_match is None) == (not must_exist):
            raise BadRequest("delete needs exactly one of if_match or must_exist")
        header = "*" if must_exist else f'"{if_match}"'
        await self._http.call(
            "DELETE", self._doc(name), safety="once", headers={"If-Match": header}
        )


# ---------------------------------------------------------------------------- events


def _event(data: Mapping[str, Any]) -> Event:
    return _of(
        Event, data, to=tuple(data.get("to") or ()), to_roles=tuple(data.get("to_roles") or ())
    )


class Events(_Part):
    """The room's log and the token agent's cursor (:class:`agentrooms.rooms.Events`)."""

    async def post(
        self,
        type: str,
        data: JSON = None,
        *,
        to: Sequence[str] = (),
        to_roles: Sequence[str] = (),
        command_id: str | None = None,
    ) -> int:
        """Append an event (its author is the token's agent), addressed to the agents
        ``to`` and the roles ``to_roles`` if given (their inboxes); its sequence number."""
        event: dict[str, Any] = {"type": type, "data": data}
        if to:
            event["to"] = list(to)
        if to_roles:
            event["to_roles"] = list(to_roles)
        body = await self._http.json(
            "POST",
            f"{self._room.path}/events",
            safety="keyed",
            body=event,
            headers=self._key(command_id),
        )
        seq: int = body["seq"]
        return seq

    async def read(self, after: int = 0, limit: int = 100) -> list[Event]:
        """Events after ``after`` without any cursor."""
        body = await self._http.json(
            "GET",
            f"{self._room.path}/events",
            safety="idempotent",
            params={"after": after, "limit": limit},
        )
        return [_event(e) for e in body["events"]]

    async def cursor(self, agent: str | None = None, *, inbox: bool = False) -> int:
        self._client.acting(agent)
        body = await self._http.json(
            "GET",
            f"{self._room.path}/events/cursor",
            safety="idempotent",
            params={"inbox": "true"} if inbox else None,
        )
        position: int = body["cursor"]
        return position

    async def read_new(
        self, agent: str | None = None, limit: int = 100, *, ack: Ack = "auto"
    ) -> list[Event]:
        """Up to ``limit`` events after the cursor, in order. ``ack="auto"`` moves the
        cursor past them in the same call (at-most-once: not retried once sent);
        ``"explicit"`` leaves it for :meth:`ack` (at-least-once, retried)."""
        return (await self._read_new(agent, limit, ack, inbox=False)).events

    async def read_inbox(
        self, agent: str | None = None, limit: int = 100, *, ack: Ack = "auto"
    ) -> InboxPage:
        """Up to ``limit`` events addressed to the token's agent or its token's role,
        through its inbox cursor (:meth:`agentrooms.rooms.Events.read_inbox`; the server
        takes the roles from the token)."""
        return await self._read_new(agent, limit, ack, inbox=True)

    async def _read_new(self, agent: str | None, limit: int, ack: Ack, *, inbox: bool) -> InboxPage:
        self._client.acting(agent)
        params: dict[str, Any] = {"ack": ack, "limit": limit}
        if inbox:
            params["inbox"] = "true"
        body = await self._http.json(
            "POST",
            f"{self._room.path}/events/read-new",
            safety="once" if ack == "auto" else "idempotent",
            params=params,
        )
        events = [_event(e) for e in body["events"]]
        scanned = body.get("scanned")
        return InboxPage(
            events,
            events[-1].seq if scanned is None and events else scanned or 0,
            bool(body.get("more")),
        )

    async def ack(self, agent: str | None = None, seq: int = 0, *, inbox: bool = False) -> int:
        """Move the cursor (``inbox``: the inbox cursor) forward to ``seq`` (never back);
        the cursor after."""
        self._client.acting(agent)
        body = await self._http.json(
            "POST",
            f"{self._room.path}/events/ack",
            safety="idempotent",
            body={"seq": seq, "inbox": inbox},
        )
        position: int = body["cursor"]
        return position

    async def subscribe(
        self, agent: str | None = None, *, ack: Ack = "auto", batch: int = 100, wait: float = 30.0
    ) -> AsyncIterator[Event]:
        """Yield every new event for the token's agent, as it arrives.

        ``ack="auto"``: each batch is taken with ``read_new`` (the cursor moves), and
        between batches the iterator waits on the event stream (Server-Sent Events) for
        the log to grow. ``ack="explicit"``: events come from the stream itself, from
        the cursor on, resumed with ``Last-Event-ID`` after each reconnect; the caller
        acknowledges with :meth:`ack` after processing each."""
        self._client.acting(agent)
        local = await self.cursor()
        while True:
            if ack == "auto":
                events = await self.read_new(None, batch)
                for event in events:
                    local = event.seq
                    yield event
                if not events:
                    async for _ in self._stream(local, wait, max_events=1):
                        break
                continue
            async for event in self._stream(local, wait):
                local = event.seq
                yield event

    async def stream(self, after: int = 0, *, wait: float = 30.0) -> AsyncIterator[Event]:
        """Every event after ``after``, as it arrives, without any cursor (the Server-Sent
        Events stream, reconnected every ``wait`` seconds with ``Last-Event-ID``)."""
        while True:
            async for event in self._stream(after, wait):
                after = event.seq
                yield event

    async def _stream(
        self, after: int, wait: float, max_events: int | None = None
    ) -> AsyncIterator[Event]:
        """The events after ``after`` from one stream of at most ``wait`` seconds."""
        params = {"max_events": max_events, "timeout": wait}
        headers = {"Last-Event-ID": str(after), "Accept": "text/event-stream"}
        path = f"{self._room.path}/events/stream"
        async with self._http.stream(path, params, headers, wait + 30.0) as response:
            kind, data = "message", list[str]()
            async for line in response.aiter_lines():
                if line == "":
                    if data:
                        body = json.loads("\n".join(data))
                        if kind == "error":
                            raise error_from(500, body, self.room)
                        yield _event(body)
                    kind, data = "message", list[str]()
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data":
                    data.append(value)
                elif name == "event":
                    kind = value


# -------------------------------------------------------------------------- presence


class Presence(_Part):
    """Who is in the room, by heartbeat (:class:`agentrooms.rooms.Presence`)."""

    def _member(self, agent: str | None) -> str:
        name = self._client.acting(agent) or self._client.agent
        if name is None:
            raise BadRequest("name the agent (the token's) whose presence this is")
        return f"{self._room.path}/presence/{_seg(name)}"

    async def heartbeat(
        self,
        agent: str | None = None,
        status: str = "online",
        metadata: JSON = None,
        *,
        ttl: float = PRESENCE_TTL,
    ) -> Member:
        body = {"status": status, "metadata": metadata, "ttl": ttl}
        data = await self._http.json("PUT", self._member(agent), safety="idempotent", body=body)
        return _of(Member, data)

    async def who_is_online(self) -> list[Member]:
        """Members whose last heartbeat has not expired, by agent name."""
        path = f"{self._room.path}/presence"
        body = await self._http.json("GET", path, safety="idempotent")
        return [_of(Member, m) for m in body["members"]]

    async def page(self, limit: int = 100, after: str | None = None) -> MemberPage:
        path = f"{self._room.path}/presence"
        params = {"limit": limit, "after": after}
        body = await self._http.json("GET", path, safety="idempotent", params=params)
        return MemberPage([_of(Member, m) for m in body["members"]], body.get("next_after"))

    async def leave(self, agent: str | None = None) -> None:
        await self._http.call("DELETE", self._member(agent), safety="idempotent")


# ----------------------------------------------------------------------------- locks


class Locks(_Part):
    """Named locks with fencing tokens and a FIFO line (:class:`agentrooms.rooms.Locks`)."""

    def _lock(self, name: str) -> str:
        return f"{self._room.path}/locks/{_seg(name)}"

    async def _acquire(
        self, name: str, owner: str | None, ttl: float, wait: float, command_id: str | None
    ) -> Lock:
        body = {"agent": self._client.acting(owner), "ttl": ttl, "wait": wait}
        data = await self._http.json(
            "POST",
            f"{self._lock(name)}/acquire",
            safety="keyed",
            body=body,
            headers=self._key(command_id),
            read_timeout=wait + 30.0,
        )
        return _of(Lock, data)

    async def try_acquire(
        self,
        name: str,
        owner: str | None = None,
        *,
        ttl: float = LOCK_TTL,
        command_id: str | None = None,
    ) -> Lock:
        """Take the lock now or raise ``LockHeld`` naming the holder."""
        return await self._acquire(name, owner, ttl, 0.0, command_id)

    async def wait_acquire(
        self,
        name: str,
        owner: str | None = None,
        *,
        ttl: float = LOCK_TTL,
        timeout: float = 30.0,
        command_id: str | None = None,
    ) -> Lock:
        """Queue for the lock (FIFO) up to ``timeout`` seconds (the server caps it);
        ``LockHeld`` if it was not handed over."""
        return await self._acquire(name, owner, ttl, timeout, command_id)

    async def acquire(
        self,
        name: str,
        owner: str | None = None,
        *,
        ttl: float = LOCK_TTL,
        tries: int = 5,
        step: float = 0.15,
    ) -> Lock:
        """Try ``tries`` times, waiting ``step``, ``2*step``... between tries, then
        raise ``LockHeld``."""
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            raise BadRequest("tries must be a positive integer")
        for attempt in range(1, tries + 1):
            try:
                return await self.try_acquire(name, owner, ttl=ttl)
            except LockHeld:
                if attempt == tries:
                    raise
                await asyncio.sleep(step * attempt)
        raise AssertionError("unreachable")

    async def release(self, lock: Lock) -> bool:
        """Release if ``lock`` is still the current grant (owner-checked: a grant of
        another agent is ``Forbidden``); ``False`` if it had expired or changed hands.
        Not retried once sent: an unknown outcome is ``StoreUnavailable``."""
        data = await self._http.json(
            "POST",
            f"{self._lock(lock.name)}/release",
            safety="once",
            body={"token": lock.token, "fence": lock.fence},
        )
        released: bool = data["released"]
        return released

    async def extend(self, lock: Lock, ttl: float | None = None) -> Lock:
        """Extend a grant still held; ``StaleFence`` if it expired or changed hands."""
        data = await self._http.json(
            "POST",
            f"{self._lock(lock.name)}/extend",
            safety="idempotent",
            body={"token": lock.token, "fence": lock.fence, "ttl": ttl},
        )
        return _of(Lock, data)

    async def requeue(self, lock: Lock, *, timeout: float = 30.0) -> Lock:
        """Pass the grant on and queue again, in one write; the next grant within
        ``timeout`` seconds, else ``LockHeld``."""
        data = await self._http.json(
            "POST",
            f"{self._lock(lock.name)}/requeue",
            safety="once",
            body={"token": lock.token, "fence": lock.fence, "wait": timeout},
            read_timeout=timeout + 30.0,
        )
        return _of(Lock, data)

    async def holder(self, name: str) -> LockInfo | None:
        """The lock's holder, ``None`` if it is free."""
        data = await self._http.json("GET", self._lock(name), safety="idempotent")
        holder = data["holder"]
        return None if holder is None else _of(LockInfo, holder, name=name)

    async def waiters(self, name: str) -> list[WaiterInfo]:
        """The agents in the lock's line, first in line first."""
        data = await self._http.json("GET", self._lock(name), safety="idempotent")
        return [_of(WaiterInfo, w) for w in data["waiters"]]

    @contextlib.asynccontextmanager
    async def hold(
        self,
        name: str,
        owner: str | None = None,
        *,
        ttl: float = LOCK_TTL,
        tries: int = 5,
        step: float = 0.15,
        queue_timeout: float | None = None,
    ) -> AsyncIterator[Lock]:
        """``async with locks.hold("plan") as lock:`` — released even if the body
        raises. With ``queue_timeout`` it queues instead of polling."""
        if queue_timeout is None:
            lock = await self.acquire(name, owner, ttl=ttl, tries=tries, step=step)
        else:
            lock = await self.wait_acquire(name, owner, ttl=ttl, timeout=queue_timeout)
        try:
            yield lock
        finally:
            await self.release(lock)
