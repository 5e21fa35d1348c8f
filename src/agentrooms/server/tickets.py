"""Stream tickets: how a browser's ``EventSource`` (which cannot send headers) opens the
operator stream ``GET /v1/ops/rooms/{room}/stream`` with a bearer token's authority.

A page holding a token asks ``POST /v1/ops/rooms/{room}/stream-tickets`` (bearer token,
scope ``ops:read``) for a ticket and opens ``.../stream?ticket=T``. A ticket:

* is 32 random bytes (64 hex digits, never shaped like a token); only its SHA-256 is stored,
  as ``ticket/<hash>`` in the reserved room :data:`~agentrooms.server.auth.AUTH_ROOM`;
* names the token that minted it and one room, and is good for :data:`TICKET_TTL` seconds
  of the store's clock;
* is **single use**: :func:`redeem` deletes it in the same conditional write that admits
  it (two redeemers of one ticket: exactly one is admitted);
* carries the token's authority *at redemption*: a token revoked or expired since is
  refused.

Every refusal is ``Unauthorized``. Why a ticket and not a cookie or the token in the URL:
docs/why-ui-stream-tickets.md.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from agentrooms.errors import Unauthorized, VersionConflict
from agentrooms.server.auth import AUTH_ROOM, AuthConfig, Principal, dev_principal, principal_of
from agentrooms.server.auth import hash_secret as _hash
from agentrooms.store.base import Store
from agentrooms.store.types import Absent, Delete, Put, VersionIs

__all__ = ["TICKET_TTL", "Ticket", "mint_ticket", "redeem"]

TICKET_TTL = 30.0


@dataclass(frozen=True, slots=True)
class Ticket:
    """A minted ticket: ``ticket`` is shown once; ``expires_at`` is store-clock time."""

    ticket: str
    room: str
    expires_at: float


def _key(ticket: str) -> str:
    return f"ticket/{_hash(ticket)}"


async def mint_ticket(
    store: Store, principal: Principal, room: str, ttl: float = TICKET_TTL
) -> Ticket:
    """A new single-use ticket for ``principal`` to open ``room``'s operator stream, good
    for ``ttl`` seconds. The caller has already checked the principal's room and scope."""
    ticket = secrets.token_hex(32)
    now = (await store.read(AUTH_ROOM, [])).now
    value = {
        "token_id": principal.token_id,
        "agent": principal.agent,
        "room": room,
        "expires_at": now + ttl,
    }
    key = _key(ticket)
    await store.transact(AUTH_ROOM, [Absent(key)], [Put(key, value, ttl=ttl)])
    return Ticket(ticket, room, now + ttl)


async def redeem(store: Store, auth: AuthConfig, ticket: str, room: str) -> Principal:
    """Consume ``ticket`` for ``room``'s stream and return the principal it stands for;
    ``Unauthorized`` if it is unknown, used, expired, for another room, or its token is
    no longer valid (a dev-mode ticket needs the server still in dev mode)."""
    key = _key(ticket)
    snap = await store.read(AUTH_ROOM, [key])
    record = snap.get(key)
    if record is None or float(record.value["expires_at"]) <= snap.now:
        raise Unauthorized("unknown, used or expired stream ticket")
    if record.value["room"] != room:
        raise Unauthorized("this stream ticket is for another room")
    try:
        await store.transact(AUTH_ROOM, [VersionIs(key, record.version)], [Delete(key)])
    except VersionConflict:
        raise Unauthorized("unknown, used or expired stream ticket") from None
    token_id = record.value["token_id"]
    if token_id is None:
        if not auth.dev:
            raise Unauthorized("a dev-mode stream ticket on a server that requires tokens")
        return dev_principal(auth, str(record.value["agent"]))
    return await principal_of(store, str(token_id))
