"""Bearer tokens: who is calling, which rooms it may enter, what it may do there.

A token is the string ``ar_<id>_<secret>``: ``id`` (16 hex digits) names the record
``token/<id>`` in the reserved store room ``_auth.<d>``, ``d`` the id's first hex digit
(:data:`TOKEN_ROOMS`: sixteen rooms, so a Redis Cluster spreads token checks over its
primaries; :data:`AUTH_ROOM` holds stream tickets), and ``secret`` is 32 random
bytes (64 hex digits) of which only the SHA-256 is stored, so a copy of the store gives
nobody a usable token. No room name the rooms layer accepts starts with ``_``, so no HTTP
path can reach the tokens.

A token binds:

* an **agent**: the only agent its requests act as (a body naming another gets 403);
* the **rooms** it may enter, a list or ``"*"``; any other room answers exactly as an
  absent one (404, same body), so a token cannot probe which rooms exist;
* **scopes** (:data:`SCOPES`); ``admin`` implies every other but ``tokens:admin``, the
  administration of tokens themselves (:mod:`.token_admin`);
* a **role** that owns one document partition of each room: a token with role ``R`` and
  ``docs:write`` writes documents ``R/<name>``. Other partitions, and unpartitioned
  documents (shared by the whole room), are written only with ``admin``. Every token with
  ``docs:read`` reads every document of its rooms.

Expiry is judged by the store's clock, like every expiry in agentrooms. Revoking keeps the
record (``revoked_at``) so :func:`list_tokens` still shows it.

:func:`mint`, :func:`revoke` and :func:`list_tokens` work on a :class:`Store` directly
(the CLI calls them); :func:`authenticate` is what the HTTP gate calls per request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from agentrooms.errors import BadRequest, Forbidden, Unauthorized, VersionConflict
from agentrooms.rooms.documents import partition_of
from agentrooms.rooms.keys import check_name
from agentrooms.store.base import Store
from agentrooms.store.types import MAX_TTL, Absent, Put, VersionIs

__all__ = [
    "ADMIN",
    "ALL_ROOMS",
    "AUTH_ROOM",
    "SCOPES",
    "AuthConfig",
    "MintedToken",
    "Principal",
    "TokenInfo",
    "authenticate",
    "dev_principal",
    "hash_secret",
    "list_tokens",
    "mint",
    "parse_bearer",
    "parse_token",
    "principal_of",
    "revoke",
]

AUTH_ROOM = "_auth"
ALL_ROOMS = "*"
ADMIN = "admin"
SCOPES = frozenset(
    {
        "rooms:read",
        "rooms:write",
        "plan:read",
        "plan:write",
        "lease:acquire",
        "docs:read",
        "docs:write",
        "events:read",
        "events:write",
        "presence:write",
        "locks:write",
        "ops:read",
        "tokens:admin",
        ADMIN,
    }
)
TOKEN_ROOMS = tuple(f"{AUTH_ROOM}.{digit:x}" for digit in range(16))
"""The store rooms of the token records, by the first hex digit of the token's id."""
DEFAULT_TTL = 30 * 86_400.0
_TOKEN = re.compile(r"ar_([0-9a-f]{16})_([0-9a-f]{64})")
_ROLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")  # a document partition name


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """How the server authenticates.

    ``dev=True`` is local development without tokens: a request without an
    ``Authorization`` header acts as the agent named by its ``X-Agent`` header (else
    ``dev_agent``) with every scope in every room. :func:`agentrooms.server.serve`
    refuses to bind anything but 127.0.0.1 or ::1 in this mode. Bearer tokens are still
    checked when sent.
    """

    dev: bool = False
    dev_agent: str = "dev"


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one request, as its token (or dev mode) says."""

    agent: str
    rooms: frozenset[str] | None  # None: every room
    scopes: frozenset[str]
    role: str | None
    token_id: str | None = None  # None in dev mode
    expires_at: float | None = None  # store clock; None in dev mode

    def may_enter(self, room: str) -> bool:
        return self.rooms is None or room in self.rooms

    def has(self, scope: str) -> bool:
        """Whether the token holds ``scope``: ``admin`` implies all but ``tokens:admin``."""
        return scope in self.scopes or (ADMIN in self.scopes and scope != "tokens:admin")

    def may_write_doc(self, name: str) -> bool:
        """The partition rule: own role's partition, everything else only with admin."""
        if ADMIN in self.scopes:
            return True
        partition = partition_of(name)
        return partition is not None and partition == self.role and self.has("docs:write")

    def check_doc_write(self, name: str) -> None:
        """``Forbidden``, naming what this token may write, unless it may write ``name``."""
        if not self.may_write_doc(name):
            raise Forbidden(f"this token writes {self.writes()}; {name!r} needs the 'admin' scope")

    def writes(self) -> str:
        """The documents this token may write, in words: every one, its role's
        partition, or none."""
        if self.has(ADMIN):
            return "every document"
        if self.role is not None and self.has("docs:write"):
            return f"only its own partition {self.role!r}"
        return "no document" if self.role else "no document (it has no role)"


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What is stored about a token (never its secret)."""

    id: str
    agent: str
    rooms: list[str] | Literal["*"]
    scopes: list[str]
    role: str | None
    created_at: float  # store clock
    expires_at: float  # store clock
    revoked_at: float | None = None

    def to_value(self, secret_hash: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "agent": self.agent,
            "rooms": self.rooms,
            "scopes": self.scopes,
            "role": self.role,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "hash": secret_hash,
        }

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> TokenInfo:
        fields = {k: v for k, v in value.items() if k != "hash"}
        return cls(**fields)

    def principal(self) -> Principal:
        rooms = None if self.rooms == ALL_ROOMS else frozenset(self.rooms)
        scopes = frozenset(self.scopes)
        return Principal(self.agent, rooms, scopes, self.role, self.id, self.expires_at)


@dataclass(frozen=True, slots=True)
class MintedToken:
    """A new token: ``token`` is shown once and never stored."""

    token: str
    info: TokenInfo


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _key(token_id: str) -> str:
    return f"token/{token_id}"


def _room(token_id: str) -> str:
    """The store room of a token's record; ``Unauthorized`` for an id that is not 16
    hex digits (no such token can exist)."""
    if not re.fullmatch(r"[0-9a-f]{16}", token_id):
        raise Unauthorized("unknown or invalid token")
    return TOKEN_ROOMS[int(token_id[0], 16)]


def parse_token(token: str) -> tuple[str, str]:
    """``(id, secret)`` of a token string; ``Unauthorized`` if it is not one."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        raise Unauthorized("malformed token: expected ar_<id>_<secret>")
    return match.group(1), match.group(2)


def parse_bearer(authorization: str | None) -> tuple[str, str]:
    """``(id, secret)`` from an ``Authorization`` header value."""
    if authorization is None:
        raise Unauthorized("missing bearer token (send 'Authorization: Bearer ar_...')")
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise Unauthorized("the Authorization header must be 'Bearer <token>'")
    return parse_token(credentials.strip())


def _check_rooms(rooms: Iterable[str] | str) -> list[str] | Literal["*"]:
    if isinstance(rooms, str):
        if rooms == "*":
            return "*"
        raise BadRequest("rooms is a list of room names or '*'")
    return sorted({check_name(r, "room name") for r in rooms})


def _check_scopes(scopes: Iterable[str]) -> list[str]:
    chosen = sorted(set(scopes))
    unknown = [s for s in chosen if s not in SCOPES]
    if unknown:
        raise BadRequest(f"unknown scopes {unknown!r}; known: {sorted(SCOPES)!r}")
    return chosen


def _check_role(role: str | None) -> str | None:
    if role is not None and (not isinstance(role, str) or not _ROLE.fullmatch(role)):
        raise BadRequest(f"a role is a document partition name, got {role!r}")
    return role


async def mint(
    store: Store,
    agent: str,
    *,
    rooms: Iterable[str] | str,
    scopes: Iterable[str],
    role: str | None = None,
    ttl: float = DEFAULT_TTL,
) -> MintedToken:
    """Create a token for ``agent``; the returned ``token`` string is the only copy."""
    check_name(agent, "agent")
    room_list, scope_list, role = _check_rooms(rooms), _check_scopes(scopes), _check_role(role)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_TTL:
        raise BadRequest(f"a token ttl is a positive number of seconds up to {MAX_TTL:.0f}")
    token_id, secret = secrets.token_hex(8), secrets.token_hex(32)
    room = _room(token_id)
    now = (await store.read(room, [])).now
    info = TokenInfo(token_id, agent, room_list, scope_list, role, now, now + float(ttl))
    await store.transact(
        room,
        [Absent(_key(token_id))],
        [Put(_key(token_id), info.to_value(hash_secret(secret)))],
    )
    return MintedToken(f"ar_{token_id}_{secret}", info)


async def revoke(store: Store, token: str) -> bool:
    """Revoke a token by id (or by the full token string). ``False`` if there is no
    such token or it was already revoked."""
    token_id = parse_token(token)[0] if token.startswith("ar_") else token
    key = _key(token_id)
    try:
        room = _room(token_id)
    except Unauthorized:
        return False
    while True:
        snap = await store.read(room, [key])
        record = snap.get(key)
        if record is None or record.value.get("revoked_at") is not None:
            return False
        value = {**record.value, "revoked_at": snap.now}
        try:
            await store.transact(room, [VersionIs(key, record.version)], [Put(key, value)])
        except VersionConflict:
            continue
        return True


async def list_tokens(store: Store) -> list[TokenInfo]:
    """Every token (revoked and expired ones included), by id: each token room read to
    its end, in id order (the rooms split the ids by their first digit)."""
    out: list[TokenInfo] = []
    for room in TOKEN_ROOMS:
        after: str | None = None
        while True:
            page = await store.scan(room, "token/", after, 1000)
            out += [TokenInfo.from_value(r.value) for r in page.records]
            if page.next_after is None:
                break
            after = page.next_after
    return out


async def authenticate(store: Store, token_id: str, secret: str) -> tuple[Principal, str]:
    """The principal of a token and its stored hash; ``Unauthorized`` for an unknown,
    wrong, expired or revoked token. One read of the token's record."""
    key = _key(token_id)
    snap = await store.read(_room(token_id), [key])
    record = snap.get(key)
    stored = "" if record is None else str(record.value.get("hash", ""))
    if not hmac.compare_digest(hash_secret(secret), stored) or record is None:
        raise Unauthorized("unknown or invalid token")
    return _valid(TokenInfo.from_value(record.value), snap.now).principal(), stored


async def principal_of(store: Store, token_id: str) -> Principal:
    """The principal of the token with id ``token_id`` (no secret: for a caller that
    proved it otherwise, e.g. a stream ticket the token minted); ``Unauthorized`` for an
    unknown, expired or revoked token. One read of the token's record."""
    snap = await store.read(_room(token_id), [_key(token_id)])
    record = snap.get(_key(token_id))
    if record is None:
        raise Unauthorized("unknown or invalid token")
    return _valid(TokenInfo.from_value(record.value), snap.now).principal()


def _valid(info: TokenInfo, now: float) -> TokenInfo:
    if info.revoked_at is not None:
        raise Unauthorized("token revoked")
    if info.expires_at <= now:
        raise Unauthorized("token expired")
    return info


def dev_principal(config: AuthConfig, agent: str | None) -> Principal:
    """Dev mode's caller: the ``X-Agent`` header's agent, every scope, every room."""
    name = check_name(agent if agent is not None else config.dev_agent, "X-Agent")
    return Principal(name, None, SCOPES, None)
