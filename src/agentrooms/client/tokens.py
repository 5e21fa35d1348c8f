"""Token administration and the server's description over HTTP (``/v1/tokens``,
``/v1/server``), with the library's own types: what ``agentrooms tokens ... --server``
and ``agentrooms doctor --server`` call.

    from agentrooms.client import Client
    from agentrooms.client.tokens import Tokens

    async with Client(url, token) as client:
        minted = await Tokens(client).mint("worker-1", rooms=["r"], scopes=["plan:read"])

Minting needs the ``tokens:admin`` scope (``admin`` does not imply it) and refuses, with
``Forbidden``, a token holding more than the caller's own; see
:mod:`agentrooms.server.token_admin`. Errors are the library's (:mod:`.http`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentrooms.client.rooms import Client
from agentrooms.server.auth import DEFAULT_TTL, MintedToken, TokenInfo, parse_token

__all__ = ["TokenPage", "Tokens", "server_info"]

TokenPage = tuple[list[TokenInfo], str | None, float]
"""``(tokens, next_after, now)``: one page, the ``after`` of the next (``None`` at the
end) and the store's clock."""


def _info(value: dict[str, Any]) -> TokenInfo:
    return TokenInfo.from_value(value)


class Tokens:
    """The server's tokens, as the client's token may administer them."""

    def __init__(self, client: Client) -> None:
        self.http = client.http

    async def mint(
        self,
        agent: str,
        *,
        rooms: Iterable[str] | str,
        scopes: Iterable[str],
        role: str | None = None,
        ttl: float = DEFAULT_TTL,
    ) -> MintedToken:
        """A new token (its ``token`` string is the only copy). Sent once, never retried
        after it left this process: a retry would mint a second token."""
        body = {
            "agent": agent,
            "rooms": rooms if isinstance(rooms, str) else list(rooms),
            "scopes": list(scopes),
            "role": role,
            "ttl": ttl,
        }
        out = await self.http.json("POST", "/tokens", safety="once", body=body)
        return MintedToken(out["token"], _info(out["info"]))

    async def page(self, limit: int = 100, after: str | None = None) -> TokenPage:
        """One page of the tokens within the caller's reach, by id (:data:`TokenPage`)."""
        params = {"limit": limit, "after": after}
        out = await self.http.json("GET", "/tokens", safety="idempotent", params=params)
        return [_info(t) for t in out["tokens"]], out.get("next_after"), float(out["now"])

    async def list(self) -> tuple[list[TokenInfo], float]:
        """Every token within the caller's reach (all pages) and the store's clock."""
        tokens, after, now = await self.page(1000)
        while after is not None:
            more, after, now = await self.page(1000, after)
            tokens += more
        return tokens, now

    async def revoke(self, token: str) -> bool:
        """Revoke a token by id or by the whole token (only its id is sent: a secret in
        a URL is revoked by the server as leaked). ``False`` if there is no such live
        token within reach. A retry is safe: revoking is idempotent."""
        from agentrooms.errors import NotFound

        token_id = parse_token(token)[0] if token.startswith("ar_") else token
        try:
            await self.http.call("DELETE", f"/tokens/{token_id}", safety="idempotent")
        except NotFound:
            return False
        return True


async def server_info(client: Client) -> dict[str, Any]:
    """``GET /v1/server`` (version, store kind, limits, the caller's token and scopes)
    as JSON data, with ``healthz``: the answer of ``/healthz`` (``"ok"``)."""
    health = await client.http.json("GET", f"{client.http.base_url}/healthz", safety="idempotent")
    out: dict[str, Any] = await client.http.json("GET", "/server", safety="idempotent")
    return {"healthz": health.get("status"), **out}
