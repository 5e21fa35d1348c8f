"""The room API over HTTP: a remote agent's :class:`Client` (async) and
:class:`SyncClient` (blocking), with the library's room objects and errors.

    from agentrooms.client import Client

    async with Client("http://127.0.0.1:8787", token) as client:
        room = client.room("demo")
        lease = await room.plan.claim_next()
        if lease is not None:
            async with room.plan.keep_alive(lease):
                await room.plan.complete(lease, {"ok": True})

Needs the ``client`` extra (httpx): ``pip install 'agentrooms[client]'``. Retries of
unknown outcomes are made safe by idempotency keys (:mod:`.http`); how each method
differs from the library's: :mod:`.rooms`.
"""

from agentrooms.extras import require

require("client", "agentrooms.client")

from agentrooms.client.http import RemoteError, RemoteRequestError  # noqa: E402
from agentrooms.client.rooms import (  # noqa: E402
    Client,
    Documents,
    Events,
    Locks,
    Plan,
    Presence,
    Room,
    Rooms,
)
from agentrooms.client.sync import SyncClient, SyncRoom  # noqa: E402

__all__ = [
    "Client",
    "Documents",
    "Events",
    "Locks",
    "Plan",
    "Presence",
    "RemoteError",
    "RemoteRequestError",
    "Room",
    "Rooms",
    "SyncClient",
    "SyncRoom",
]
