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
from agentrooms.store.types import JSON, Delete, Put, Record

DEFAULT_TTL = 120.0


@dataclass(frozen=True, slots=True)
class Member:
    agent: str
    status: str
    metadata: JSON
    last_seen: float  # store clock
    expires_at: float  # store clock

    @classmethod
    def of(cls, record: Record, now: float) -> Member:
        v = record.value
        expires = record.expires_at if record.expires_at is not None else now
        return cls(v["agent"], v["status"], v["metadata"], expires - v["ttl"], expires)


@dataclass(frozen=True, slots=True)
class MemberPage:
    """Members by agent name; ``next_after`` is the ``after`` of the next page, ``None``
    when no member follows."""

    members: list[Member]
    next_after: str | None


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
            members += [Member.of(record, page.now) for record in page.records]
            if page.next_after is None:
                return members
            after = page.next_after

    async def page(self, limit: int = 100, after: str | None = None) -> MemberPage:
        """Up to ``limit`` members by agent name after ``after`` (one scan of the room);
        ``NotFound`` if the room does not exist, ``BadRequest`` for a bad ``limit``."""
        records, now, next_after = await self._scope.page("presence/", limit, after)
        return MemberPage([Member.of(r, now) for r in records], next_after)

    async def leave(self, agent: str) -> None:
        keys.check_name(agent, "agent")
        await self._scope.transact(writes=[Delete(keys.presence(agent))])
