"""Recording surfaces over the network: the HTTP API and MCP (streamable HTTP), each
against several ``agentrooms serve`` processes on one store.

What each :class:`~agentrooms.reliability.recorder.Surface` operation maps to:

=============  ==========================================  ==============================
operation      HTTP (:class:`HttpSurface`)                 MCP (:class:`McpSurface`)
=============  ==========================================  ==============================
read           ``GET docs/K``: value, version = ETag;      ``read_document``; not_found
               404: absent                                 is absent
cas            ``PUT docs/K`` with ``If-Match: "v"`` (or   ``write_document(version=v)``
               ``If-None-Match: *``); 412 and its ETag:    (0: create); version_conflict
               failed, at that version                     and its current_version
put            no unconditional write in the API: a        the same loop of read_document
               loop of GET then the conditional PUT,       and write_document
               until one succeeds (it takes effect at
               that PUT, an unconditional write there)
delete         a loop of GET then ``DELETE`` with          not expressible (no delete
               ``If-Match``, until 204, or 404 (absent)    tool): not in MCP workloads
append         ``POST events`` of the log room: its seq    ``post_event`` there: its seq
read_log       ``GET events?after=0`` (one page) of the    ``read_new_events`` of a new
               log room                                    agent (its cursor is at 0),
                                                           in a session of its own
commit         ``POST events`` of a second room (the       ``post_event`` to the second
               commands room) with ``Idempotency-Key``     room with ``request_id`` = the
               = the command id, data the command id:      command id
               its seq is the command's position; a
               replay answers the first seq
read_commits   ``GET events`` of the commands room         ``read_new_events`` there, as
                                                           for read_log
=============  ==========================================  ==============================

A room's log also carries the room's own events (``doc.written`` for every document
write, ``room.created`` first), so one run uses three rooms: ``R`` for the documents,
``R-log`` for the appends and ``R-commands`` for the commits. Each log's seq 1 is its
``room.created``; the surfaces report positions after it (seq - 1), and any event of
another type there ends the run as a bug.

Neither surface says whether a commit was a replay, so a commit's ``replayed`` is
``None`` (the model then checks its position only). Idempotency keys are scoped to the
agent, so every commit is sent as one agent (:data:`COMMITTER`) by every client.

Each request of an :class:`HttpSurface` goes to a random server of its list, and what
its answer means (acknowledged, unknown, failed) follows
:mod:`agentrooms.reliability.outcomes`: a request never sent goes to another server, a
429 is waited out, a lost answer or a 503 is an *unknown outcome*
(:class:`UnknownOutcome`), any other 5xx ends the run as a bug; each is counted in
:attr:`HttpSurface.reports` by how the caller saw it. An MCP
session lives on the server it opened on, so an :class:`McpSurface` stays on one server
until that server loses its session (a killed server: the SDK's ``MCPError``
"Connection closed", an unknown outcome), then opens a new one on another. Each MCP
tool call has its own read timeout (the SDK's ``read_timeout_seconds``): a stopped
server's call ends with ``MCPError`` "timed out", an unknown outcome, and the session
moves to another server too (the session itself:
:class:`~agentrooms.reliability.mcp_session.McpSession`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

import httpx2

from agentrooms.reliability.history import Operation
from agentrooms.reliability.mcp_session import McpSession, only
from agentrooms.reliability.outcomes import HttpRequests, UnknownOutcome, unexpected
from agentrooms.reliability.recorder import Workload, run_client

__all__ = [
    "COMMITTER",
    "HttpSurface",
    "McpSession",
    "McpSurface",
    "UnknownOutcome",
    "create_rooms",
    "logs",
    "record_mcp_tasks",
]

COMMITTER = "committer"
"""The agent every commit is sent as (idempotency keys are scoped to the agent)."""
PAGE = 1000  # the API's largest page of events


class Unsupported(NotImplementedError):
    """The surface has no way to express this operation."""


def logs(room: str) -> tuple[str, str]:
    """The rooms of a run on documents in ``room``: its log room and commands room."""
    return f"{room}-log", f"{room}-commands"


def _positions(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """A log room's events after its ``room.created`` (seq 1), as ``(seq - 1, data)``."""
    if not events or events[0]["seq"] != 1 or events[0]["type"] != "room.created":
        raise RuntimeError(f"a log room does not start with room.created: {events[:1]}")
    rest = events[1:]
    if any(e["type"] != "op" for e in rest):
        raise RuntimeError(f"a log room holds events no client posted: {rest}")
    return [(e["seq"] - 1, e["data"]) for e in rest]


async def create_rooms(base: str, room: str) -> None:
    """Create ``room`` and its :func:`logs` rooms through the HTTP API at ``base`` (a
    ``--dev`` server)."""
    async with httpx2.AsyncClient(timeout=10.0) as http:
        for name in (room, *logs(room)):
            answer = await http.post(
                f"{base}/v1/rooms", json={"name": name}, headers={"X-Agent": COMMITTER}
            )
            if answer.status_code != 201:
                raise RuntimeError(f"creating room {name!r}: {answer.status_code} {answer.text}")


class _Conditional(Protocol):
    async def read(self, key: str) -> tuple[str | None, int | None]: ...

    async def cas(self, key: str, version: int | None, value: str) -> tuple[bool, int | None]: ...


async def _put(surface: _Conditional, key: str, value: str) -> int:
    """An unconditional write where the surface has only conditional ones: read, then
    compare-and-set at that version, until one succeeds (the write takes effect at it)."""
    while True:
        _, version = await surface.read(key)
        ok, new = await surface.cas(key, version, value)
        if ok:
            assert new is not None
            return new


def _version(answer: httpx2.Response) -> int | None:
    tag = answer.headers.get("ETag")
    return None if tag is None else int(tag.strip('"'))


class HttpSurface:
    """One recording client of the HTTP API, as agent ``agent``, on the documents of
    ``room`` and its :func:`logs` rooms; each request to a random one of
    ``bases`` (drawn from ``seed``). ``timeout``: seconds before a sent request's
    outcome is unknown."""

    def __init__(
        self,
        bases: Sequence[str],
        room: str,
        agent: str,
        *,
        seed: int = 0,
        timeout: float = 10.0,
    ) -> None:
        self.bases, self.room, self.agent = list(bases), room, agent
        self.log, self.commands = logs(room)
        self.timeout = timeout
        self.requests = HttpRequests(bases, seed=seed, timeout=timeout)
        self.reports = self.requests.reports
        self.answered = self.requests.answered  # answers per server

    async def _send(
        self,
        method: str,
        path: str,
        *,
        agent: str | None = None,
        headers: dict[str, str] | None = None,
        body: Any = None,
    ) -> httpx2.Response:
        sent_headers = {"X-Agent": agent or self.agent, **(headers or {})}
        return await self.requests.send(method, f"/v1{path}", headers=sent_headers, body=body)

    @staticmethod
    def _unexpected(answer: httpx2.Response) -> RuntimeError:
        return unexpected(answer)

    async def read(self, key: str) -> tuple[str | None, int | None]:
        answer = await self._send("GET", f"/rooms/{self.room}/docs/{key}")
        if answer.status_code == 404:
            return None, None
        if answer.status_code != 200:
            raise self._unexpected(answer)
        body = answer.json()
        if body["version"] != _version(answer):
            raise RuntimeError(f"the ETag {answer.headers.get('ETag')} is not the version {body}")
        value: str = body["value"]
        return value, body["version"]

    async def cas(self, key: str, version: int | None, value: str) -> tuple[bool, int | None]:
        condition = {"If-None-Match": "*"} if version is None else {"If-Match": f'"{version}"'}
        path = f"/rooms/{self.room}/docs/{key}"
        answer = await self._send("PUT", path, headers=condition, body={"value": value})
        if answer.status_code in (200, 201):
            return True, _version(answer)
        if answer.status_code != 412:
            raise self._unexpected(answer)
        current = _version(answer)
        if current is None and version is None:
            # it existed when the create failed, and was gone when the 412 read it
            # back: which version it had is lost, so the outcome is recorded as unknown
            # (a failure is one of the outcomes an unknown one allows)
            seen = "HTTP 412 without the current version: unknown outcome"
            self.reports[seen] += 1
            raise UnknownOutcome("the 412 of a create does not name the version it met", seen)
        return False, current

    async def put(self, key: str, value: str) -> int:
        return await _put(self, key, value)

    async def delete(self, key: str) -> None:
        while True:
            _, version = await self.read(key)
            if version is None:
                return
            answer = await self._send(
                "DELETE", f"/rooms/{self.room}/docs/{key}", headers={"If-Match": f'"{version}"'}
            )
            if answer.status_code in (204, 404):
                return
            if answer.status_code != 412:
                raise self._unexpected(answer)

    async def _post(self, room: str, data: str, key: str | None, agent: str | None) -> int | None:
        headers = {} if key is None else {"Idempotency-Key": key}
        body = {"type": "op", "data": data}
        answer = await self._send(
            "POST", f"/rooms/{room}/events", agent=agent, headers=headers, body=body
        )
        if answer.status_code == 409 and answer.json()["error"]["type"] == "contention_exhausted":
            return None
        if answer.status_code != 201:
            raise self._unexpected(answer)
        seq: int = answer.json()["seq"]
        return seq - 1  # after the room's room.created

    async def append(self, item: str) -> int:
        seq = await self._post(self.log, item, None, None)
        if seq is None:
            raise RuntimeError("an append without a command id gave up after conflicts")
        return seq

    async def _events(self, room: str) -> list[tuple[int, str]]:
        answer = await self._send("GET", f"/rooms/{room}/events?after=0&limit={PAGE}")
        if answer.status_code != 200:
            raise self._unexpected(answer)
        events: list[dict[str, Any]] = answer.json()["events"]
        if len(events) == PAGE:
            raise RuntimeError("the log outgrew one page: read_log must be one request")
        return _positions(events)

    async def read_log(self) -> list[tuple[int, str]]:
        return await self._events(self.log)

    async def commit(self, command_id: str) -> tuple[int, bool | None] | None:
        seq = await self._post(self.commands, command_id, command_id, COMMITTER)
        return None if seq is None else (seq, None)

    async def read_commits(self) -> list[str]:
        return [data for _, data in await self._events(self.commands)]

    async def close(self) -> None:
        await self.requests.close()


class McpSurface(McpSession):
    """One recording client of the MCP endpoints (``/mcp``) of ``bases``, as agent
    :data:`COMMITTER` (its ``request_id``s must share an agent), on the documents of
    ``room`` and its :func:`logs` rooms (sessions as :class:`McpSession`)."""

    TYPED = frozenset({"not_found", "version_conflict", "contention_exhausted"})

    def __init__(
        self, bases: Sequence[str], room: str, *, seed: int = 0, timeout: float = 10.0
    ) -> None:
        super().__init__(bases, COMMITTER, seed=seed, timeout=timeout)
        self.room = room
        self.log, self.commands = logs(room)

    async def read(self, key: str) -> tuple[str | None, int | None]:
        body = await self._call("read_document", room=self.room, name=key)
        if "error" in body:
            if body["error"]["type"] != "not_found":
                raise RuntimeError(f"read_document: {body}")
            return None, None
        return body["value"], body["version"]

    async def cas(self, key: str, version: int | None, value: str) -> tuple[bool, int | None]:
        body = await self._call(
            "write_document", room=self.room, name=key, value=value, version=version or 0
        )
        if "error" not in body:
            return True, body["version"]
        if body["error"]["type"] != "version_conflict":
            raise RuntimeError(f"write_document: {body}")
        current: int | None = body["error"]["details"].get("current_version")
        return False, current

    async def put(self, key: str, value: str) -> int:
        return await _put(self, key, value)

    async def delete(self, key: str) -> None:
        raise Unsupported("MCP has no tool that deletes a document")

    async def append(self, item: str) -> int:
        body = await self._call("post_event", room=self.log, type="op", data=item)
        if "error" in body:
            raise RuntimeError(f"post_event: {body}")
        seq: int = body["seq"]
        return seq - 1  # after the room's room.created

    async def _events(self, room: str) -> list[tuple[int, str]]:
        # the only event read of MCP goes through a cursor: a new agent's is at 0
        try:
            async with self._session(f"reader-{uuid.uuid4().hex[:12]}") as reader:
                body = await self._call("read_new_events", reader, room=room, limit=PAGE)
        except Exception as exc:
            # the call's own outcome (counted already) comes wrapped by the SDK's task
            # group; unless the store answered it (store_unavailable), the server did
            # not: the client moves to another, as when its own session is lost
            leaf = only(exc)
            if not isinstance(leaf, UnknownOutcome):
                seen = f"a reading session: {type(exc).__name__}"
                self.reports[seen] += 1
                leaf = UnknownOutcome(f"no reading session on {self.base}", seen)
                leaf.__cause__ = exc
            if not leaf.seen.startswith("store_unavailable"):
                self._lost()
            raise leaf from leaf.__cause__
        if "error" in body or body.get("more"):
            raise RuntimeError(f"read_new_events did not read the whole log: {body}")
        events: list[dict[str, Any]] = body["events"]
        return _positions(events)

    async def read_log(self) -> list[tuple[int, str]]:
        return await self._events(self.log)

    async def commit(self, command_id: str) -> tuple[int, bool | None] | None:
        body = await self._call(
            "post_event", room=self.commands, type="op", data=command_id, request_id=command_id
        )
        if "error" in body:
            if body["error"]["type"] != "contention_exhausted":
                raise RuntimeError(f"post_event: {body}")
            return None
        return body["seq"] - 1, None

    async def read_commits(self) -> list[str]:
        return [data for _, data in await self._events(self.commands)]


async def record_mcp_tasks(surfaces: Sequence[McpSurface], workload: Workload) -> list[Operation]:
    """Run one client per MCP surface as tasks of this process (each closed when it is
    done); the merged history."""

    async def one(surface: McpSurface, client: int) -> list[Operation]:
        try:
            return await run_client(surface, client, workload)
        finally:
            await surface.close()

    histories = await asyncio.gather(*(one(s, i) for i, s in enumerate(surfaces)))
    return [op for h in histories for op in h]
