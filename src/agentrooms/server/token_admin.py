"""Token administration by a caller: mint, list and revoke as a :class:`Principal`, so
no token can hand out more than it has (the HTTP routes under ``/v1/tokens`` call these;
the CLI on a store calls :mod:`.auth` directly, as the store's owner).

The scope ``tokens:admin`` admits a caller; ``admin`` does not imply it (minting is a
power over the server, not over rooms: docs/why-tokens.md). What a caller may touch is
its **reach**, the tokens it could have minted itself:

* rooms: its own rooms (``"*"`` only if it has ``"*"``);
* scopes: each one it has (``admin`` implies the room scopes, never ``tokens:admin``);
* role: any role if it has ``admin``, else no role or its own when the new token has
  ``docs:write`` (that role's partition is what the token writes);
* expiry (at mint only): not after its own (dev mode's caller has none).

:func:`mint_as` refuses a token past the caller's reach with ``Forbidden`` naming every
part that exceeds; :func:`list_as` leaves tokens out of reach out and :func:`revoke_as`
answers ``False`` for them, exactly as for an absent token, so a caller cannot probe
tokens it could not have minted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from agentrooms.errors import BadRequest, Forbidden
from agentrooms.server.auth import (
    ADMIN,
    ALL_ROOMS,
    AUTH_ROOM,
    TOKEN_ROOMS,
    MintedToken,
    Principal,
    TokenInfo,
    mint,
    parse_token,
    revoke,
)
from agentrooms.store.base import Store

__all__ = ["TOKENS_ADMIN", "check_admin", "exceeds", "info_of", "list_as", "mint_as", "revoke_as"]

TOKENS_ADMIN = "tokens:admin"


def check_admin(principal: Principal) -> None:
    """``Forbidden`` unless ``principal`` holds ``tokens:admin`` itself."""
    if not principal.has(TOKENS_ADMIN):
        raise Forbidden(f"this token lacks the {TOKENS_ADMIN!r} scope ('admin' does not imply it)")


def exceeds(
    principal: Principal,
    rooms: list[str] | str,
    scopes: Iterable[str],
    role: str | None,
    expires_at: float | None = None,
) -> list[str]:
    """What a token of ``rooms``, ``scopes``, ``role`` (and ``expires_at``) holds beyond
    ``principal`` (see the module's rules), in words; empty when it is within reach."""
    over: list[str] = []
    if principal.rooms is not None:
        if rooms == ALL_ROOMS:
            over.append("rooms '*' (this token enters only its own rooms)")
        else:
            extra = sorted(set(rooms) - principal.rooms)
            if extra:
                over.append(f"rooms {extra!r}")
    chosen = sorted(set(scopes))
    missing = [s for s in chosen if not principal.has(s)]
    if missing:
        over.append(f"scopes {missing!r}")
    writes = "docs:write" in chosen or ADMIN in chosen
    if role is not None and role != principal.role and writes and ADMIN not in principal.scopes:
        over.append(f"role {role!r} (this token writes {principal.writes()})")
    limit = principal.expires_at
    if expires_at is not None and limit is not None and expires_at > limit:
        over.append("an expiry after this token's own")
    return over


def _refuse(over: list[str]) -> None:
    if over:
        raise Forbidden(f"a token may not mint more than it holds: {'; '.join(over)}")


async def mint_as(
    principal: Principal,
    store: Store,
    agent: str,
    *,
    rooms: list[str] | str,
    scopes: list[str],
    role: str | None,
    ttl: float,
) -> MintedToken:
    """:func:`~.auth.mint` on behalf of ``principal``: ``Forbidden`` without
    ``tokens:admin``, or naming what exceeds the caller's reach; ``BadRequest`` for what
    :func:`~.auth.mint` refuses. The expiry is checked by the store's clock before the
    one write that creates the token."""
    check_admin(principal)
    _refuse(exceeds(principal, rooms, scopes, role))
    if principal.expires_at is not None:
        now = (await store.read(AUTH_ROOM, [])).now
        _refuse(exceeds(principal, rooms, scopes, role, now + ttl))
    return await mint(store, agent, rooms=rooms, scopes=scopes, role=role, ttl=ttl)


def _within(principal: Principal, info: TokenInfo) -> bool:
    return not exceeds(principal, info.rooms, info.scopes, info.role)


async def list_as(
    principal: Principal, store: Store, limit: int, after: str | None
) -> tuple[list[TokenInfo], str | None, float]:
    """One page of the tokens in ``principal``'s reach, by id, after the token id
    ``after``: ``(tokens, next_after, now)``, where ``next_after`` is the id to pass next
    (``None`` at the end; a page may hold fewer than ``limit`` tokens) and ``now`` the
    store's clock. One snapshot per page; ``Forbidden`` without ``tokens:admin``."""
    check_admin(principal)
    if after is not None and not _ID.fullmatch(after):
        raise BadRequest(f"after must be a token id (16 hex digits), not {after!r}")
    values, following = await _page(store, limit, after)
    now = (await store.read(AUTH_ROOM, [])).now
    infos = [TokenInfo.from_value(v) for v in values]
    return [t for t in infos if _within(principal, t)], following, now


_ID = re.compile(r"[0-9a-f]{16}")


async def _page(
    store: Store, limit: int, after: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Up to ``limit`` token records after the id ``after``, in id order, and the id to
    continue after (``None`` once every token room is read to its end). The token rooms
    split the ids by their first digit, so id order is the rooms' order, then each
    room's; a page reads on into the next rooms until it is full."""
    values: list[dict[str, Any]] = []
    first = 0 if after is None else int(after[0], 16)
    cursor = None if after is None else f"token/{after}"
    for room in TOKEN_ROOMS[first:]:
        while len(values) < limit:
            page = await store.scan(room, "token/", cursor, limit - len(values))
            values += [r.value for r in page.records]
            cursor = page.next_after
            if cursor is None:
                break
        if len(values) >= limit:
            return values, str(values[-1]["id"])
        cursor = None
    return values, None


async def revoke_as(principal: Principal, store: Store, token_id: str) -> bool:
    """Revoke the token ``token_id`` (an id, or a whole token: only its id is used) if it
    is in ``principal``'s reach; ``False`` for no such live token or one out of reach.
    ``Forbidden`` without ``tokens:admin``."""
    check_admin(principal)
    token_id = parse_token(token_id)[0] if token_id.startswith("ar_") else token_id
    info = await info_of(store, token_id)
    if info is None or not _within(principal, info):
        return False
    return await revoke(store, token_id)


async def info_of(store: Store, token_id: str) -> TokenInfo | None:
    """What is stored about the token ``token_id`` (never its secret); ``None`` if there
    is no such token. One read."""
    if not _ID.fullmatch(token_id):
        return None  # no token has such an id
    room = TOKEN_ROOMS[int(token_id[0], 16)]
    record = (await store.read(room, [f"token/{token_id}"])).get(f"token/{token_id}")
    return None if record is None else TokenInfo.from_value(record.value)
