"""The entry points: a :class:`Client` on the HTTP API, its :class:`Rooms` and one
:class:`Room`."""

from __future__ import annotations

import os

import httpx

from agentrooms.client.http import Http
from agentrooms.client.rooms.base import parse, seg
from agentrooms.client.rooms.documents import Documents
from agentrooms.client.rooms.events import Events
from agentrooms.client.rooms.locks import Locks
from agentrooms.client.rooms.plan import Plan
from agentrooms.client.rooms.presence import Presence
from agentrooms.errors import Forbidden
from agentrooms.rooms.room import RoomInfo, RoomList
from agentrooms.store.types import JSON

TOKEN_ENV = "AGENTROOMS_TOKEN"


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
        return RoomList([parse(RoomInfo, r) for r in body["rooms"]], body.get("next_after"))

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
        body = await self._http.json("POST", f"/rooms/{seg(name)}/archive", safety="idempotent")
        return parse(RoomInfo, body)

    async def delete(self, name: str) -> None:
        """Delete the room and everything in it (not retried once sent)."""
        await self._http.call("DELETE", f"/rooms/{seg(name)}", safety="once")


class Room:
    """One room's plan, documents, events, presence and locks."""

    def __init__(self, client: Client, name: str) -> None:
        self.name = name
        self.client = client
        self.path = f"/rooms/{seg(name)}"
        self.plan = Plan(self)
        self.docs = Documents(self)
        self.events = Events(self)
        self.presence = Presence(self)
        self.locks = Locks(self)

    async def describe(self) -> RoomInfo:
        """The room's description, log head and ready count; ``NotFound`` if absent."""
        body = await self.client.http.json("GET", self.path, safety="idempotent")
        return parse(RoomInfo, body)
