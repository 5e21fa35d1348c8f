"""The room's event log: post, read through the caller's own cursor, ack, and stream.

``read-new`` is a POST because it moves the caller's cursor (``ack=auto``, at-most-once
for a reader that crashes mid-batch) or may (``ack=explicit``: the cursor moves only on
``ack``, at-least-once). The stream is Server-Sent Events, one event per log entry with
``id: <seq>``; it starts after ``Last-Event-ID`` (a reconnecting client's), else
``?after=``, else the caller's cursor, and is woken by ``Store.watch``. It does not move
the cursor: a consumer acks what it processed. It ends after ``max_events`` events or
``timeout`` seconds (capped by the server), and an idle stream carries a keep-alive
comment; clients reconnect with ``Last-Event-ID``.

A post may address its event (``to``, ``to_roles``); ``read-new?inbox=true`` reads what
is addressed to the caller or its token's role through the caller's inbox cursor, which
``ack`` and ``cursor`` reach with ``inbox`` (docs/why-messages.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request

from agentrooms.errors import AgentroomsError
from agentrooms.rooms import Room
from agentrooms.server.deps import EventsRead, EventsWrite, IdempotencyKey, command_id, limits_of
from agentrooms.server.models import (
    MAX_INT,
    MAX_WAIT,
    WAIT_HELP,
    AckIn,
    CursorOut,
    EventIn,
    EventList,
    EventOut,
    InboxList,
    Posted,
)
from agentrooms.server.routes import COMMON, errors
from agentrooms.server.sse import HEADERS, RETRY, EventStream, comment, error_frame, grown
from agentrooms.store.types import Event

router = APIRouter(prefix="/rooms/{room}/events", tags=["events"], responses=errors(*COMMON))

BATCH = 100
Limit = Annotated[int, Query(ge=1, le=1000)]
After = Annotated[int, Query(ge=0, le=MAX_INT)]


@router.post("", status_code=201, summary="Append an event", responses=errors(409, 422))
async def post_event(access: EventsWrite, body: EventIn, key: IdempotencyKey = None) -> Posted:
    """The event's author is the token's agent (the body cannot name one). ``to`` and
    ``to_roles`` address it: it is in the inbox of those agents and of every token with
    one of those roles (and in the log for every reader)."""
    seq = await access.room.events.post(
        body.type,
        body.data,
        command_id=command_id(access.principal, key),
        author=access.agent,
        to=body.to,
        to_roles=body.to_roles,
    )
    return Posted(seq=seq)


@router.get("", summary="Events after a position (no cursor)", responses=errors(410))
async def read_events(access: EventsRead, after: After = 0, limit: Limit = 100) -> EventList:
    events = await access.room.events.read(after, limit)
    return EventList(events=[EventOut.of(e) for e in events])


@router.post("/read-new", summary="Events after the caller's cursor", responses=errors(409, 410))
async def read_new(
    request: Request,
    access: EventsRead,
    ack: Literal["auto", "explicit"] = "auto",
    limit: Limit = 100,
    inbox: Annotated[
        bool, Query(description="only events addressed to the caller or its token's role")
    ] = False,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT, description=WAIT_HELP)] = 0.0,
) -> InboxList | EventList:
    """``inbox=true``: the caller's inbox, through its inbox cursor (the full cursor is
    not moved), with ``scanned`` and ``more`` (``more``: read again at once). ``wait``:
    when none is new, answer as soon as one arrives, else with none after ``wait``."""
    events_of = access.room.events
    wait = min(wait, limits_of(request).max_wait)
    if inbox:
        page = await events_of.read_inbox(access.agent, _roles(access), limit, ack=ack, wait=wait)
        found = [EventOut.of(e) for e in page.events]
        return InboxList(events=found, scanned=page.scanned, more=page.more)
    events = await events_of.read_new(access.agent, limit, ack=ack, wait=wait)
    return EventList(events=[EventOut.of(e) for e in events])


def _roles(access: EventsRead) -> list[str]:
    return [] if access.principal.role is None else [access.principal.role]


@router.post("/ack", summary="Move the caller's cursor forward", responses=errors(409))
async def ack(access: EventsRead, body: AckIn) -> CursorOut:
    return CursorOut(cursor=await access.room.events.ack(access.agent, body.seq, inbox=body.inbox))


@router.get("/cursor", summary="The caller's cursor")
async def cursor(
    access: EventsRead, inbox: Annotated[bool, Query(description="its inbox cursor")] = False
) -> CursorOut:
    return CursorOut(cursor=await access.room.events.cursor(access.agent, inbox=inbox))


@router.get(
    "/stream",
    summary="Server-Sent Events from a position (Last-Event-ID resumes)",
    response_class=EventStream,
    responses={
        200: {
            "description": "id: <seq>, data: the event as JSON; ': keep-alive' when idle",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **errors(410),
    },
)
async def stream(
    request: Request,
    access: EventsRead,
    after: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
    max_events: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    timeout: Annotated[float | None, Query(gt=0, le=86_400)] = None,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", pattern=r"^[0-9]{1,15}$")
    ] = None,
) -> EventStream:
    limits = limits_of(request)
    if last_event_id is not None:
        position = int(last_event_id)
    elif after is not None:
        position = after
    else:
        position = await access.room.events.cursor(access.agent)
    first = await access.room.events.read(position, BATCH)  # errors answered before the 200
    duration = min(timeout or limits.max_stream_seconds, limits.max_stream_seconds)
    frames = _frames(access.room, position, first, max_events, duration, limits.keepalive_seconds)
    return EventStream(frames, headers=HEADERS)


def _frame(event: Event) -> bytes:
    data = json.dumps(EventOut.of(event).model_dump(mode="json"), separators=(",", ":"))
    return f"id: {event.seq}\ndata: {data}\n\n".encode()


async def _frames(
    room: Room,
    position: int,
    batch: list[Event],
    max_events: int | None,
    duration: float,
    keepalive: float,
) -> AsyncIterator[bytes]:
    deadline = time.monotonic() + duration
    sent = 0
    yield RETRY
    try:
        while True:
            for event in batch:
                yield _frame(event)
                sent, position = sent + 1, event.seq
                if max_events is not None and sent >= max_events:
                    return
            if deadline - time.monotonic() <= 0:
                return
            if (
                not batch
                and await grown(room.store, room.name, position, deadline, keepalive) is None
            ):
                yield comment("keep-alive")
                continue
            batch = await room.events.read(position, BATCH)
    except AgentroomsError as exc:  # the 200 is sent: report in-band and end
        yield error_frame(exc)
