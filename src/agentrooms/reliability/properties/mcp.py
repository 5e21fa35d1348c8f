"""The plan's and the cursor's calls through MCP tools (streamable HTTP, the official SDK
client), for the property workers.

:class:`McpPlan` answers what the fences workers call on
:class:`~agentrooms.rooms.plan.Plan` with ``claim_task``, ``renew_lease``,
``complete_task`` and ``read_plan``; :class:`McpEvents` answers the cursors consumers'
``read_new`` with ``read_new_events``. Each is one agent's
:class:`~agentrooms.reliability.surfaces.McpSession` on several ``agentrooms serve
--dev`` servers (a session opens on the server ``seed`` picks, and stays there until
that server loses it: the clients of a run spread over the servers), so an
answer means what it means there: a lost connection or ``store_unavailable`` is
``UnknownOutcome``; a refused holder's ``stale_fence`` or ``invalid_transition``
raises the library's exception (:func:`~agentrooms.reliability.outcomes.refusal`).

MCP has no tool that acknowledges events: ``read_new_events`` moves the agent's cursor
past what it returns (the library's ``ack="auto"``), so :class:`McpEvents` reads that
way only, and its consumers are checked for the auto-ack property (see
:func:`~agentrooms.reliability.properties.cursors.check_cursors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from agentrooms.reliability.outcomes import refusal
from agentrooms.reliability.properties.http import Delivered, TaskState
from agentrooms.reliability.surfaces import McpSession
from agentrooms.rooms.plan import Lease
from agentrooms.store.types import JSON

__all__ = ["McpEvents", "McpPlan"]


class McpPlan(McpSession):
    """``claim_next``, ``renew``, ``complete`` and ``tasks`` of ``room``'s plan, as
    ``agent`` (every lease it asks for is that agent's)."""

    TYPED = frozenset({"stale_fence", "invalid_transition"})

    def __init__(
        self, bases: Sequence[str], room: str, agent: str, *, seed: int = 0, timeout: float = 5.0
    ) -> None:
        super().__init__(_rotated(bases, seed), agent, seed=seed, timeout=timeout)
        self.room = room

    def _mine(self, agent: str) -> None:
        if agent != self.agent:
            raise ValueError(f"this session is agent {self.agent!r}, not {agent!r}")

    async def claim_next(self, agent: str, *, ttl: float) -> Lease | None:
        self._mine(agent)
        body = await self._call("claim_task", room=self.room, ttl=ttl)
        if "error" in body:
            raise RuntimeError(f"claim_task: {body}")
        if not body["claimed"]:
            return None
        task_id = body["task"]["id"]
        return Lease(self.room, task_id, agent, body["fence"], body["expires_at"], body["ttl"])

    async def renew(self, lease: Lease, ttl: float) -> Lease:
        self._mine(lease.agent)
        body = await self._call(
            "renew_lease", room=self.room, task_id=lease.task_id, fence=lease.fence, ttl=ttl
        )
        self._refused(body, lease)
        return Lease(self.room, lease.task_id, lease.agent, body["fence"], body["expires_at"], ttl)

    async def complete(self, lease: Lease, result: JSON = None) -> None:
        self._mine(lease.agent)
        body = await self._call(
            "complete_task",
            room=self.room,
            task_id=lease.task_id,
            fence=lease.fence,
            result=result,
        )
        self._refused(body, lease)

    @staticmethod
    def _refused(body: dict[str, object], lease: Lease) -> None:
        """Raise the library's exception for a refused holder's call."""
        error = body.get("error")
        if isinstance(error, dict):
            raise refusal(error, lease.task_id, lease.fence) or RuntimeError(str(error))

    async def tasks(self) -> list[TaskState]:
        """Every task, page after page (``summary=false``: never the summary)."""
        out: list[TaskState] = []
        after: str | None = None
        while True:
            extra: dict[str, Any] = {} if after is None else {"after": after}
            body = await self._call("read_plan", room=self.room, summary=False, limit=1000, **extra)
            if "error" in body:
                raise RuntimeError(f"read_plan: {body}")
            out += [TaskState(t["id"], t["status"]) for t in body["tasks"]]
            after = body.get("next")
            if after is None:
                return out


class McpEvents(McpSession):
    """``read_new`` of ``room``'s log as ``agent``, with the auto ack that MCP has."""

    def __init__(
        self, bases: Sequence[str], room: str, agent: str, *, seed: int = 0, timeout: float = 5.0
    ) -> None:
        super().__init__(_rotated(bases, seed), agent, seed=seed, timeout=timeout)
        self.room = room

    async def read_new(
        self, agent: str, limit: int = 100, *, ack: Literal["auto", "explicit"] = "auto"
    ) -> list[Delivered]:
        """The agent's next events; ``ValueError`` for ``ack="explicit"`` (no MCP tool
        acknowledges events) or another agent than the session's."""
        if ack != "auto":
            raise ValueError("MCP reads events with the auto ack only")
        if agent != self.agent:
            raise ValueError(f"this session is agent {self.agent!r}, not {agent!r}")
        body = await self._call("read_new_events", room=self.room, limit=limit)
        if "error" in body:
            raise RuntimeError(f"read_new_events: {body}")
        return [Delivered(e["seq"], e["type"], e["data"]) for e in body["events"]]


def _rotated(bases: Sequence[str], seed: int) -> list[str]:
    """``bases`` starting at the one ``seed`` picks (where the first session opens)."""
    k = seed % len(bases)
    return [*bases[k:], *bases[:k]]
