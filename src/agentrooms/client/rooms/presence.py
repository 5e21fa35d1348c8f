"""A remote room's presence: who is in it, by heartbeat."""

from __future__ import annotations

from agentrooms.client.rooms.base import Part, parse, seg
from agentrooms.errors import BadRequest
from agentrooms.rooms.presence import DEFAULT_TTL as PRESENCE_TTL
from agentrooms.rooms.presence import Member, MemberPage
from agentrooms.store.types import JSON


class Presence(Part):
    """Who is in the room, by heartbeat (:class:`agentrooms.rooms.Presence`)."""

    def _member(self, agent: str | None) -> str:
        name = self._client.acting(agent) or self._client.agent
        if name is None:
            raise BadRequest("name the agent (the token's) whose presence this is")
        return f"{self._room.path}/presence/{seg(name)}"

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
        return parse(Member, data)

    async def who_is_online(self) -> list[Member]:
        """Members whose last heartbeat has not expired, by agent name."""
        path = f"{self._room.path}/presence"
        body = await self._http.json("GET", path, safety="idempotent")
        return [parse(Member, m) for m in body["members"]]

    async def page(self, limit: int = 100, after: str | None = None) -> MemberPage:
        path = f"{self._room.path}/presence"
        params = {"limit": limit, "after": after}
        body = await self._http.json("GET", path, safety="idempotent", params=params)
        return MemberPage([parse(Member, m) for m in body["members"]], body.get("next_after"))

    async def leave(self, agent: str | None = None) -> None:
        await self._http.call("DELETE", self._member(agent), safety="idempotent")
