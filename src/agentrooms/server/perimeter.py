"""The perimeter: what :func:`agentrooms.server.serve` puts around the whole app (the HTTP
API and ``/mcp`` alike) against a hostile client, before anything else sees a request.

In order, each refusal answering with the API's error envelope:

1. with ``hosts`` given (``serve`` gives the loopback names in dev mode): a ``Host`` naming
   another host, or an ``Origin`` naming another host (or ``null``): ``403``, so a page on
   another site cannot reach a dev server through DNS rebinding;
2. a token in the query string (a parameter ``token`` / ``access_token``, or anything
   shaped like a token in any name or value): ``401``. It is not used; the query string
   becomes ``redacted`` before anything (the access log included) sees it; and a genuine
   token found there (at most :data:`MAX_REVOKED` per request) is revoked, since it has
   been written into URLs;
3. an address whose failed authentications used up its allowance (``auth_failures``,
   refilled at ``auth_failure_rate`` per second), sending an ``Authorization`` header that
   has not already authenticated in this process: ``429`` with ``Retry-After``, before any
   store read. Every ``401`` answered to an address spends from its allowance; a header
   that authenticated (the app put a token's principal on the scope) stays welcome;
4. the body not complete within ``body_timeout`` seconds: the app is told the client
   left, and the perimeter answers ``408`` (connection closed) if the app had not
   answered yet.

Everything here is per process and in memory; all of it only ever makes a request cheaper
to refuse.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import re
from collections.abc import Collection
from urllib.parse import parse_qsl, urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrooms.errors import AgentroomsError, Forbidden, RateLimited, Unauthorized
from agentrooms.server.auth import AuthConfig, Principal, authenticate, revoke
from agentrooms.server.envelope import RequestTimeout, error_response
from agentrooms.server.gate import PRINCIPAL
from agentrooms.server.limits import HttpLimits, RateLimiter
from agentrooms.store.base import Store

__all__ = ["LOOPBACK_HOSTS", "MAX_REVOKED", "Perimeter", "redact_tokens"]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_REVOKED = 3  # token-shaped strings of one query string looked up (and revoked)
_QUERY_TOKENS = frozenset({"token", "access_token"})
_TOKEN = re.compile(r"ar_([0-9a-f]{16})_([0-9a-f]{64})")
_LOOSE_TOKEN = re.compile(r"ar_[0-9A-Fa-f]{16}_[0-9A-Fa-f]{8,}")  # never logged in full
_PROVEN = 10_000  # Authorization headers remembered as having authenticated
_CLOSE = {"Connection": "close"}


def redact_tokens(text: str) -> str:
    """``text`` with the secret of anything shaped like a token replaced (for logs)."""
    return _LOOSE_TOKEN.sub(lambda m: m.group(0)[:20] + "<redacted>", text)


class Perimeter:
    """An ASGI wrapper applying the module's checks to every HTTP request of ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: Store,
        auth: AuthConfig,
        limits: HttpLimits,
        hosts: Collection[str] | None = None,
    ) -> None:
        self.app, self.store, self.auth, self.limits = app, store, auth, limits
        self.hosts = None if hosts is None else frozenset(h.strip("[]").lower() for h in hosts)
        self.failures = (
            None
            if limits.auth_failures is None
            else RateLimiter(limits.auth_failure_rate, limits.auth_failures)
        )
        self._proven: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = str(client[0]) if client else ""
        headers = Headers(scope=scope)
        authorization = headers.get("authorization")
        answered = False

        async def observed(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = True
                self._judge(address, authorization, scope, message["status"])
            await send(message)

        try:
            self._check_hosts(headers)
            await self._check_query(scope, address)
            self._check_failures(address, authorization)
        except AgentroomsError as exc:
            await error_response(exc)(scope, receive, observed)
            return
        timed = _Deadline(receive, self.limits.body_timeout)
        await self.app(scope, timed, observed)
        if timed.expired and not answered:
            late = RequestTimeout(f"the body did not arrive within {self.limits.body_timeout:g}s")
            await error_response(late, headers=_CLOSE)(scope, receive, send)

    # -- checks ----------------------------------------------------------------------

    def _check_hosts(self, headers: Headers) -> None:
        if self.hosts is None:
            return
        if _hostname(headers.get("host", "")) not in self.hosts:
            raise Forbidden(
                f"this server answers only Host {sorted(self.hosts)!r} "
                "(dev mode refuses other names: DNS rebinding)"
            )
        origin = headers.get("origin")
        if origin is not None:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or _hostname(parts.netloc) not in self.hosts:
                raise Forbidden(f"requests from Origin {origin[:100]!r} are not accepted")

    async def _check_query(self, scope: Scope, address: str) -> None:
        raw = scope.get("query_string", b"")
        if not raw:
            return
        query = raw.decode("latin-1")
        pairs = parse_qsl(query, keep_blank_values=True)
        names = {name.lower() for name, _ in pairs}
        texts = [query, *(text for pair in pairs for text in pair)]
        found = [(m.group(1), m.group(2)) for text in texts for m in _TOKEN.finditer(text)]
        if not names & _QUERY_TOKENS and not found and not _LOOSE_TOKEN.search(query):
            return
        scope["query_string"] = b"redacted"
        revoked = False
        if self._limited(address) == 0:
            for token_id, secret in list(dict.fromkeys(found))[:MAX_REVOKED]:
                try:
                    await authenticate(self.store, token_id, secret)
                except Unauthorized:
                    continue
                revoked = await revoke(self.store, token_id) or revoked
        raise Unauthorized(
            "tokens are not accepted in the query string (it ends up in logs); send "
            "'Authorization: Bearer <token>'"
            + ("; the token sent there is now revoked: mint a new one" if revoked else "")
        )

    def _check_failures(self, address: str, authorization: str | None) -> None:
        if authorization is None:
            return
        wait = self._limited(address)
        if wait > 0 and _digest(authorization) not in self._proven:
            raise RateLimited(
                wait, f"too many failed authentications from {address}; retry after {wait:.3f}s"
            )

    def _limited(self, address: str) -> float:
        return 0.0 if self.failures is None else self.failures.peek(address)

    def _judge(self, address: str, authorization: str | None, scope: Scope, status: int) -> None:
        """Count a ``401`` against the address; remember a header that authenticated."""
        if status == 401 and self.failures is not None:
            self.failures.take(address)
        principal = scope.get(PRINCIPAL)
        if authorization is not None and isinstance(principal, Principal) and principal.token_id:
            key = _digest(authorization)
            self._proven[key] = None
            self._proven.move_to_end(key)
            if len(self._proven) > _PROVEN:
                self._proven.popitem(last=False)


class _Deadline:
    """``receive`` with a deadline on the body: past it, the app is told the client left
    (``expired`` says so); after the body's last chunk, messages pass untimed."""

    def __init__(self, receive: Receive, seconds: float) -> None:
        self.receive, self.seconds = receive, seconds
        self.ends = asyncio.get_running_loop().time() + seconds
        self.expired = self.done = False

    async def __call__(self) -> Message:
        if self.expired:
            return {"type": "http.disconnect"}
        if self.done:
            return await self.receive()
        remaining = self.ends - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(remaining, 0.0)):
                message = await self.receive()
        except TimeoutError:
            self.expired = True
            return {"type": "http.disconnect"}
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.done = True
        return message


def _digest(authorization: str) -> bytes:
    return hashlib.sha256(authorization.encode("utf-8", "surrogateescape")).digest()


def _hostname(netloc: str) -> str:
    """The host of a ``Host`` header or an origin's authority, without port or brackets."""
    host = netloc.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
