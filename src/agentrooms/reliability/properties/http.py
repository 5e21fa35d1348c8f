"""The plan's and the cursor's calls over the HTTP API, for the property workers.

:class:`HttpPlan` and :class:`HttpEvents` answer the calls the fences and cursors
workers make on :class:`~agentrooms.rooms.plan.Plan` and
:class:`~agentrooms.rooms.events.Events`, each request sent to a random one of several
``agentrooms serve --dev`` servers (the agent named by ``X-Agent``), by the rules of
:mod:`agentrooms.reliability.outcomes`: a refused holder's call raises the library's
exception (``StaleFence`` with the current fence, ``InvalidTransition``), an answer
that may or may not have taken effect raises ``UnknownOutcome``; any other answer is a
bug and raises ``RuntimeError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx2

from agentrooms.reliability.outcomes import HttpRequests, UnknownOutcome, refusal, unexpected
from agentrooms.rooms.plan import Lease
from agentrooms.store.types import JSON

__all__ = ["Delivered", "HttpEvents", "HttpPlan", "TaskState", "UnknownOutcome", "lease_of"]


@dataclass(frozen=True, slots=True)
class TaskState:
    """What a worker reads of a task over HTTP."""

    id: str
    status: str


@dataclass(frozen=True, slots=True)
class Delivered:
    """One event as ``read-new`` answered it."""

    seq: int
    type: str
    data: JSON


class _Api:
    """Requests about ``room`` by the rules of
    :class:`~agentrooms.reliability.outcomes.HttpRequests`."""

    def __init__(self, bases: Sequence[str], room: str, *, seed: int, timeout: float) -> None:
        self.room = room
        self.requests = HttpRequests(bases, seed=seed, timeout=timeout)

    async def request(
        self, method: str, path: str, agent: str, body: Any = None
    ) -> httpx2.Response:
        return await self.requests.send(
            method, f"/v1/rooms/{self.room}{path}", headers={"X-Agent": agent}, body=body
        )

    @staticmethod
    def unexpected(answer: httpx2.Response) -> RuntimeError:
        return unexpected(answer)

    def refused(self, answer: httpx2.Response, lease: Lease) -> Exception:
        """The library's exception for a refused holder's call."""
        if answer.status_code == 409:
            found = refusal(answer.json()["error"], lease.task_id, lease.fence)
            if found is not None:
                return found
        return unexpected(answer)


class HttpPlan:
    """``claim_next``, ``renew``, ``complete`` and ``tasks`` of one room's plan."""

    def __init__(
        self, bases: Sequence[str], room: str, *, seed: int = 0, timeout: float = 5.0
    ) -> None:
        self.room = room
        self.api = _Api(bases, room, seed=seed, timeout=timeout)

    async def claim_next(self, agent: str, *, ttl: float) -> Lease | None:
        answer = await self.api.request("POST", "/tasks/claim-next", agent, {"ttl": ttl})
        if answer.status_code != 200:
            raise self.api.unexpected(answer)
        lease = answer.json()["lease"]
        return None if lease is None else lease_of(self.room, lease)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        body = {"fence": lease.fence, "expires_at": lease.expires_at, "ttl": ttl}
        answer = await self.api.request("POST", f"/tasks/{lease.task_id}/renew", lease.agent, body)
        if answer.status_code != 200:
            raise self.api.refused(answer, lease)
        return lease_of(self.room, answer.json())

    async def complete(self, lease: Lease, result: JSON = None) -> None:
        body = {"fence": lease.fence, "expires_at": lease.expires_at, "result": result}
        path = f"/tasks/{lease.task_id}/complete"
        answer = await self.api.request("POST", path, lease.agent, body)
        if answer.status_code != 200:
            raise self.api.refused(answer, lease)

    async def tasks(self) -> list[TaskState]:
        answer = await self.api.request("GET", "/tasks", "reader")
        if answer.status_code != 200:
            raise self.api.unexpected(answer)
        return [TaskState(t["id"], t["status"]) for t in answer.json()["tasks"]]

    async def close(self) -> None:
        await self.api.requests.close()


class HttpEvents:
    """``read_new`` (explicit ack) and ``ack`` of one room's log, per agent."""

    def __init__(
        self, bases: Sequence[str], room: str, *, seed: int = 0, timeout: float = 5.0
    ) -> None:
        self.api = _Api(bases, room, seed=seed, timeout=timeout)

    async def read_new(self, agent: str, limit: int = 100, *, ack: str = "auto") -> list[Delivered]:
        path = f"/events/read-new?ack={ack}&limit={limit}"
        answer = await self.api.request("POST", path, agent)
        if answer.status_code != 200:
            raise self.api.unexpected(answer)
        return [Delivered(e["seq"], e["type"], e["data"]) for e in answer.json()["events"]]

    async def ack(self, agent: str, seq: int) -> int:
        answer = await self.api.request("POST", "/events/ack", agent, {"seq": seq})
        if answer.status_code != 200:
            raise self.api.unexpected(answer)
        cursor: int = answer.json()["cursor"]
        return cursor

    async def close(self) -> None:
        await self.api.requests.close()


def lease_of(room: str, data: dict[str, Any]) -> Lease:
    """A lease as the API answers it (``task_id``, ``agent``, ``fence``, ...)."""
    return Lease(
        room, data["task_id"], data["agent"], data["fence"], data["expires_at"], data["ttl"]
    )
