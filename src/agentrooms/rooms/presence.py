"""Presence: who is in the room, by heartbeat with a TTL judged by the store's clock.

An agent beats every ``ttl / 2`` seconds (default TTL 120 s, beat every 60 s); its record
``presence/<agent>`` expires by the store's clock when the beats stop, so a client whose
own clock is wrong sees the same members as everybody else.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrooms.errors import BadRequest
from agentrooms.rooms import keys
from agentrooms.rooms.scope import Scope
from agentrooms.store.types import JSON, Delete, Put

DEFAULT_TTL = 120.0


@dataclass(frozen=True, slots=True)
class Member:
    agent: str
    status: str
    metadata: JSON
    last_seen: float  # store clock
    expires_at: float  # store clock


class Presence:
    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    async def heartbeat(
        self, agent: str, status: str = "online", metadata: JSON = None, *, ttl: float = DEFAULT_TTL
    ) -> Member:
        keys.check_name(agent, "agent")
        if not isinstance(status, str) or not 0 < len(status) <= 200:
            raise BadRequest("status must be a string of 1 to 200 characters")
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86_400:
            raise BadRequest(f"a presence ttl must be between 0 and 86400 seconds, got {ttl!r}")
        value = {"agent": agent, "status": status, "metadata": metadata, "ttl": float(ttl)}
        done = await self._scope.transact(writes=[Put(keys.presence(agent), value, ttl=ttl)])
        return Member(agent, status, metadata, done.now, done.now + ttl)

    async def who_is_online(self) -> list[Member]:
        """Members whose last heartbeat has not expired, by agent name."""
        await self._scope.read([])
        members: list[Member] = []
        after: str | None = None
        while True:
            page = await self._scope.store.scan(self._scope.room, "presence/", after, 1000)
            for record in page.records:
                v = record.value
                expires = record.expires_at if record.expires_at is not None else page.now
                members.append(
                    Member(v["agent"], v["status"], v["metadata"], expires - v["ttl"], expires)
                )
            if page.next_after is None:
                return members
            after = page.next_after

    async def leave(self, agent: str) -> None:
        keys.check_name(agent, "agent")
        await self._scope.transact(writes=[Delete(keys.presence(agent))])
