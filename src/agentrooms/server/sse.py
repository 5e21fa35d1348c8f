"""What the server's Server-Sent Events streams share: the response class, the wait on
the room's log (woken by ``Store.watch``, never a poll), the keep-alive comment and the
in-band error frame of a stream whose 200 is already sent."""

from __future__ import annotations

import json
import time

from starlette.responses import StreamingResponse

from agentrooms.errors import AgentroomsError
from agentrooms.store.base import Store

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RETRY = b"retry: 1000\n\n"


class EventStream(StreamingResponse):
    media_type = "text/event-stream"


async def grown(
    store: Store, room: str, position: int, deadline: float, keepalive: float
) -> int | None:
    """Wait until the room's log passes ``position`` (return its head then), for at most
    ``keepalive`` seconds and never past ``deadline`` (monotonic): ``None`` if it did not."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    head = await store.watch(room, position, min(keepalive, remaining))
    return head if head > position else None


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def error_frame(exc: AgentroomsError) -> bytes:
    """The ``event: error`` frame that reports ``exc`` in-band before the stream ends."""
    body = {"type": exc.code, "message": str(exc), "details": exc.details()}
    return f"event: error\ndata: {json.dumps({'error': body})}\n\n".encode()
