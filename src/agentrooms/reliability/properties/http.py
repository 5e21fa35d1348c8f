"""The plan's and the cursor's calls over the HTTP API, for the property workers.

:class:`HttpPlan` and :class:`HttpEvents` answer the calls the fences and cursors
workers make on :class:`~agentrooms.rooms.plan.Plan` and
:class:`~agentrooms.rooms.events.Events`, each request sent to a random one of several
``agentrooms serve --dev`` servers (the agent named by ``X-Agent``). Failures are
reported as the library reports them: ``409 stale_fence`` is ``StaleFence`` (with the
current fence), ``409 invalid_transition`` is ``InvalidTransition``; a request sent
and not answered, or answered ``503``, is an unknown outcome (:class:`UnknownOutcome`);
a request no server accepted (connection refused: a killed server) goes to another one;
``429`` is waited out and sent again (the rules of
:class:`~agentrooms.reliability.surfaces.HttpSurface`, which this module does not import:
it brings in the MCP SDK, a second of start-up for every worker process). Any other
answer is a bug and raises ``RuntimeError``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx2

from agentrooms.errors import InvalidTransition, StaleFence
from agentrooms.rooms import keys
from agentrooms.rooms.plan import Lease
from agentrooms.store.types import JSON

__all__ = ["HttpEvents", "HttpPlan", "UnknownOutcome"]


class UnknownOutcome(ConnectionError):
    """The request was sent and its answer never came, or was a 503: it may or may not
    have taken effect."""


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
    """Requests about ``room`` to random servers of ``bases`` (drawn from ``seed``);
    ``timeout``: seconds before a sent request's outcome is unknown."""

    def __init__(self, bases: Sequence[str], room: str, *, seed: int, timeout: float) -> None:
        self.bases, self.room, self.timeout = list(bases), room, timeout
        self.rng = random.Random(seed)
        self.http = httpx2.AsyncClient(timeout=httpx2.Timeout(timeout))

    async def request(
        self, method: str, path: str, agent: str, body: Any = None
    ) -> httpx2.Response:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        url = f"/v1/rooms/{self.room}{path}"
        while True:
            base = self.rng.choice(self.bases)
            try:
                answer = await self.http.request(
                    method, f"{base}{url}", headers={"X-Agent": agent}, json=body
                )
            except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
                if loop.time() > deadline:  # never sent: another server may take it
                    raise UnknownOutcome(f"no server answered {method} {path}") from exc
                await asyncio.sleep(0.02)
                continue
            except httpx2.TransportError as exc:
                raise UnknownOutcome(f"{method} {path}: {type(exc).__name__}") from exc
            if answer.status_code == 429:
                await asyncio.sleep(min(1.0, float(answer.headers.get("Retry-After", "1"))))
                continue
            if answer.status_code == 503:
                raise UnknownOutcome(f"{method} {path}: 503 {answer.text[:200]}")
            if answer.status_code >= 500:
                raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text}")
            return answer

    @staticmethod
    def unexpected(answer: httpx2.Response) -> RuntimeError:
        request = answer.request
        return RuntimeError(
            f"{request.method} {request.url}: unexpected {answer.status_code} {answer.text}"
        )

    def refused(self, answer: httpx2.Response, lease: Lease) -> Exception:
        """The library's exception for a refused holder's call."""
        if answer.status_code == 409:
            error = answer.json()["error"]
            if error["type"] == "stale_fence":
                current = error.get("details", {}).get("current")
                return StaleFence(keys.task(lease.task_id), lease.fence, current)
            if error["type"] == "invalid_transition":
                return InvalidTransition(error["message"])
        return self.unexpected(answer)


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
        return None if lease is None else _lease(self.room, lease)

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        body = {"fence": lease.fence, "expires_at": lease.expires_at, "ttl": ttl}
        answer = await self.api.request("POST", f"/tasks/{lease.task_id}/renew", lease.agent, body)
        if answer.status_code != 200:
            raise self.api.refused(answer, lease)
        return _lease(self.room, answer.json())

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
        await self.api.http.aclose()


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
        await self.api.http.aclose()


def _lease(room: str, data: dict[str, Any]) -> Lease:
    return Lease(
        room, data["task_id"], data["agent"], data["fence"], data["expires_at"], data["ttl"]
    )
