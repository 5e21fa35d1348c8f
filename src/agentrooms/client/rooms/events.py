"""A remote room's event log, the token agent's cursors and the event stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from agentrooms.client.http import error_from
from agentrooms.client.rooms.base import Ack, Part, parse
from agentrooms.rooms.events import InboxPage
from agentrooms.store.types import JSON, Event


def _event(data: Mapping[str, Any]) -> Event:
    return parse(
        Event, data, to=tuple(data.get("to") or ()), to_roles=tuple(data.get("to_roles") or ())
    )


class Events(Part):
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
        body = await self._keyed(f"{self._room.path}/events", event, command_id)
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
        self, agent: str | None = None, limit: int = 100, *, ack: Ack = "auto", wait: float = 0.0
    ) -> list[Event]:
        """Up to ``limit`` events after the cursor, in order. ``ack="auto"`` moves the
        cursor past them in the same call (at-most-once: not retried once sent);
        ``"explicit"`` leaves it for :meth:`ack` (at-least-once, retried). ``wait``: when
        none is new, answer as soon as one arrives, else with none after ``wait`` s."""
        return (await self._read_new(agent, limit, ack, inbox=False, wait=wait)).events

    async def read_inbox(
        self, agent: str | None = None, limit: int = 100, *, ack: Ack = "auto", wait: float = 0.0
    ) -> InboxPage:
        """Up to ``limit`` events addressed to the token's agent or its token's role,
        through its inbox cursor (:meth:`agentrooms.rooms.Events.read_inbox`; the server
        takes the roles from the token); ``wait`` as :meth:`read_new`'s."""
        return await self._read_new(agent, limit, ack, inbox=True, wait=wait)

    async def _read_new(
        self, agent: str | None, limit: int, ack: Ack, *, inbox: bool, wait: float
    ) -> InboxPage:
        self._client.acting(agent)
        params: dict[str, Any] = {"ack": ack, "limit": limit}
        if inbox:
            params["inbox"] = "true"
        if wait > 0:
            params["wait"] = wait
        body = await self._http.json(
            "POST",
            f"{self._room.path}/events/read-new",
            safety="once" if ack == "auto" else "idempotent",
            params=params,
            read_timeout=self._waiting(wait),
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
