"""Token administration (``tokens:admin``, which ``admin`` does not imply) and what the
server is (any valid token): the routes behind ``agentrooms tokens ... --server`` and
``agentrooms doctor --server``. The rules of who may mint what are
:mod:`agentrooms.server.token_admin`'s."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response, Security
from fastapi.security import HTTPAuthorizationCredentials

from agentrooms import __version__
from agentrooms.errors import NotFound
from agentrooms.server.auth import AUTH_ROOM
from agentrooms.server.deps import bearer, limits_of
from agentrooms.server.deps import principal_of as caller_of
from agentrooms.server.models import Minted, ServerOut, StoreOut, TokenList, TokenMint, TokenOut
from agentrooms.server.routes import errors
from agentrooms.server.token_admin import info_of, list_as, mint_as, revoke_as
from agentrooms.store.base import Store

router = APIRouter(tags=["tokens"], responses=errors(400, 401, 403, 429, 503))
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]
TokenId = Annotated[
    str, Path(pattern=r"^[0-9a-f]{16}$", description="the token's id (never its secret)")
]


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


@router.post("/tokens", status_code=201, summary="Mint a token (its secret is shown once)")
async def mint_token(request: Request, body: TokenMint, _: Bearer) -> Minted:
    """A new token for ``agent``; ``403`` naming what it would hold beyond the caller's
    own rooms, scopes, role or expiry. Not idempotent: a retry mints another token."""
    minted = await mint_as(
        caller_of(request),
        _store(request),
        body.agent,
        rooms=body.rooms,
        scopes=body.scopes,
        role=body.role,
        ttl=body.ttl,
    )
    return Minted(token=minted.token, info=TokenOut.of(minted.info))


@router.get("/tokens", summary="Tokens within the caller's reach, by id, paginated")
async def list_tokens(
    request: Request,
    _: Bearer,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[str | None, Query(pattern=r"^[0-9a-f]{16}$")] = None,
) -> TokenList:
    """Revoked and expired tokens included, never a secret; ``next_after`` is the
    ``after`` of the next page (``null`` at the end)."""
    tokens, following, now = await list_as(caller_of(request), _store(request), limit, after)
    return TokenList(now=now, tokens=[TokenOut.of(t) for t in tokens], next_after=following)


@router.delete(
    "/tokens/{token_id}", status_code=204, summary="Revoke a token", responses=errors(404)
)
async def revoke_token(request: Request, token_id: TokenId, _: Bearer) -> Response:
    """``404`` for no such live token, or one beyond the caller's reach (the same answer)."""
    if not await revoke_as(caller_of(request), _store(request), token_id):
        raise NotFound("no such token, or already revoked")
    return Response(status_code=204)


@router.get("/server", tags=["operations"], summary="This server, its store and your token")
async def server(request: Request, _: Bearer) -> ServerOut:
    """The version, the store's backend and durability (never its URL), every limit,
    and the caller's token (``null`` in dev mode) with the scopes it holds."""
    store, principal = _store(request), caller_of(request)
    info = await store.info()
    now = (await store.read(AUTH_ROOM, [])).now
    stored = None if principal.token_id is None else await info_of(store, principal.token_id)
    limits = limits_of(request)
    return ServerOut(
        version=__version__,
        now=now,
        store=StoreOut(backend=info.backend, durability=info.durability, warnings=info.warnings),
        limits={name: getattr(limits, name) for name in limits.__dataclass_fields__},
        token=None if stored is None else TokenOut.of(stored),
        agent=principal.agent,
        scopes=sorted(principal.scopes),
    )
