"""The gate every request passes before any route runs (a pure ASGI middleware).

In order, each step answering with the error envelope and ending the request:

0. a path ending in ``/`` (no route does; nothing redirects): ``404``;
1. with ``hosts`` given (``serve`` gives the loopback names in dev mode): a ``Host``
   naming another host, or an ``Origin`` naming another host (or ``null``): ``403``, so a
   page on another site cannot reach a dev server through DNS rebinding;
2. a token in the query string (a parameter ``token`` / ``access_token``, or anything
   shaped like a token in any name or value): ``401``. It is not used, the query string is
   replaced by ``redacted`` before anything (the access log included) sees it, and a
   genuine token found there is revoked: it has been written into URLs;
3. a ``Content-Length`` over the body limit: ``413`` before a byte of the body is read;
4. an address whose failed authentications used up its allowance (``auth_failures``,
   refilled at ``auth_failure_rate`` per second), sending a token this process has not
   already verified: ``429`` with ``Retry-After``, before any store read. Every ``401``
   answered to an address (by the gate or by ``/mcp``) spends from its allowance;
5. under ``/v1/``: the bearer token (one read of its record in the reserved ``_auth``
   room), or dev mode's caller: ``401``;
6. the caller's token bucket: ``429`` with ``Retry-After``. A token seen before is charged
   *before* step 5 (its hash is kept in memory), so a limited caller costs no store read;
7. an event stream (``GET .../events/stream``) past the agent's ``max_streams_per_agent``
   open streams: ``429``; the slot is held until the stream's request ends;
8. the body, read chunk by chunk and counted: ``413`` at the first byte over the limit
   (chunked bodies and lying ``Content-Length`` headers alike), the rest left unread;
   not complete within ``body_timeout`` seconds: ``408``. Both close the connection;
9. a JSON body's shape (depth, strings, items; NaN, surrogates): ``400``.

Only then does the application see the request, with the body replayed from memory and
the caller at ``scope["agentrooms.principal"]``. Nothing over a limit reaches a room's
records: the only store access before the limits is the token lookup.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import re
from collections.abc import Collection
from urllib.parse import parse_qsl, urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrooms.errors import (
    AgentroomsError,
    BadRequest,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
)
from agentrooms.server.auth import (
    AuthConfig,
    Principal,
    authenticate,
    dev_principal,
    hash_secret,
    parse_bearer,
    revoke,
)
from agentrooms.server.envelope import RequestTimeout, error_response
from agentrooms.server.limits import HttpLimits, RateLimiter, StreamSlots, parse_json
from agentrooms.store.base import Store

__all__ = ["LOOPBACK_HOSTS", "PRINCIPAL", "Gate", "redact_tokens"]

PRINCIPAL = "agentrooms.principal"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_QUERY_TOKENS = frozenset({"token", "access_token"})
_KNOWN_TOKENS = 10_000
_TOKEN_SHAPE = re.compile(r"ar_([0-9a-f]{16})_([0-9a-f]{64})")
_LOOSE_TOKEN = re.compile(r"ar_[0-9A-Fa-f]{16}_[0-9A-Fa-f]{8,}")  # logged: never in full
_STREAM = re.compile(r"/v1/rooms/[^/]+/events/stream")
_CLOSE = {"Connection": "close"}
_MAX_REVOKED = 3  # token-shaped strings of one query string looked up (and revoked)


def redact_tokens(text: str) -> str:
    """``text`` with the secret of anything shaped like a token replaced (for logs)."""
    return _LOOSE_TOKEN.sub(lambda m: m.group(0)[:20] + "<redacted>", text)


class _Gone(Exception):
    """The client disconnected while sending its body: nobody to answer."""


class Gate:
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
        self.limiter = None if limits.rate is None else RateLimiter(limits.rate, limits.burst)
        self.failures = (
            None
            if limits.auth_failures is None
            else RateLimiter(limits.auth_failure_rate, limits.auth_failures)
        )
        self.streams = StreamSlots(limits.max_streams_per_agent)
        # token id -> (secret hash, agent): lets step 6 run before the store read
        self._known: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = str(client[0]) if client else ""

        async def observed(message: Message) -> None:
            failed = message["type"] == "http.response.start" and message["status"] == 401
            if failed and self.failures is not None:
                self.failures.take(address)
            await send(message)

        stream_of: str | None = None
        try:
            headers = Headers(scope=scope)
            self._check_hosts(headers)
            if len(scope["path"]) > 1 and scope["path"].endswith("/"):
                raise NotFound(f"no route {scope['method']} {scope['path'][:200]}")
            await self._check_query(scope, address)
            self._check_length(headers)
            self._check_failures(address, headers)
            if scope["path"].startswith("/v1/") or scope["path"] == "/v1":
                principal = await self._admit(headers)
                scope[PRINCIPAL] = principal
                if scope["method"] == "GET" and _STREAM.fullmatch(scope["path"]):
                    stream_of = self._open_stream(principal.agent)
            receive = await self._buffer(scope, headers, receive)
        except _Gone:
            if stream_of is not None:
                self.streams.give(stream_of)
            return
        except AgentroomsError as exc:
            if stream_of is not None:
                self.streams.give(stream_of)
            closing = isinstance(exc, PayloadTooLarge | RequestTimeout)
            await error_response(exc, headers=_CLOSE if closing else {})(scope, receive, observed)
            return
        try:
            await self.app(scope, receive, observed)
        finally:
            if stream_of is not None:
                self.streams.give(stream_of)

    # -- steps -----------------------------------------------------------------------

    def _check_hosts(self, headers: Headers) -> None:
        if self.hosts is None:
            return
        host = _hostname(headers.get("host", ""))
        if host not in self.hosts:
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
        found = [m for text in (query, *(t for p in pairs for t in p)) for m in _find(text)]
        if not names & _QUERY_TOKENS and not found and not _LOOSE_TOKEN.search(query):
            return
        scope["query_string"] = b"redacted"
        revoked = False
        limited = self.failures is not None and self.failures.peek(address) > 0
        genuine = [] if limited else list(dict.fromkeys(found))
        for token_id, secret in genuine[:_MAX_REVOKED]:
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

    def _check_failures(self, address: str, headers: Headers) -> None:
        authorization = headers.get("authorization")
        if authorization is None or self.failures is None:
            return
        wait = self.failures.peek(address)
        if wait <= 0 or self._proven(authorization):
            return
        raise RateLimited(
            wait,
            f"too many failed authentications from {address}; retry after {wait:.3f}s",
        )

    def _proven(self, authorization: str) -> bool:
        try:
            token_id, secret = parse_bearer(authorization)
        except Unauthorized:
            return False
        known = self._known.get(token_id)
        return known is not None and hmac.compare_digest(known[0], hash_secret(secret))

    def _open_stream(self, agent: str) -> str:
        if not self.streams.take(agent):
            raise RateLimited(
                1.0,
                f"agent {agent!r} holds {self.streams.cap} open event streams, the most it "
                "may; close one (or resume it) first",
            )
        return agent

    def _check_length(self, headers: Headers) -> None:
        declared = headers.get("content-length")
        if declared is None:
            return
        if not declared.strip().isdigit():
            raise BadRequest("Content-Length must be a non-negative integer")
        if int(declared) > self.limits.max_body_bytes:
            raise PayloadTooLarge(
                f"the body of {int(declared)} bytes is over the {self.limits.max_body_bytes}-byte "
                "limit"
            )

    async def _admit(self, headers: Headers) -> Principal:
        authorization = headers.get("authorization")
        if authorization is None and self.auth.dev:
            principal = dev_principal(self.auth, headers.get("x-agent"))
            self._charge(principal.agent)
            return principal
        token_id, secret = parse_bearer(authorization)
        known = self._known.get(token_id)
        proven = known is not None and hmac.compare_digest(known[0], hash_secret(secret))
        if known is not None and proven:
            self._charge(known[1])
        principal, stored = await authenticate(self.store, token_id, secret)
        self._known[token_id] = (stored, principal.agent)
        self._known.move_to_end(token_id)
        if len(self._known) > _KNOWN_TOKENS:
            self._known.popitem(last=False)
        if not proven:
            self._charge(principal.agent)
        return principal

    def _charge(self, agent: str) -> None:
        if self.limiter is None:
            return
        wait = self.limiter.take(agent)
        if wait > 0:
            raise RateLimited(
                wait, f"agent {agent!r} is over its request rate; retry after {wait:.3f}s"
            )

    async def _buffer(self, scope: Scope, headers: Headers, receive: Receive) -> Receive:
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.limits.body_timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _Gone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.limits.max_body_bytes:
                        raise PayloadTooLarge(
                            f"the body is over the {self.limits.max_body_bytes}-byte limit "
                            "(stopped reading there)"
                        )
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise RequestTimeout(
                f"the body did not arrive within {self.limits.body_timeout:g}s"
            ) from None
        body = b"".join(chunks)
        if body and _is_json(headers.get("content-type")):
            parse_json(body, self.limits)
        return _replay(body, receive)


def _hostname(netloc: str) -> str:
    """The host of a ``Host`` header or an origin's authority, without port or brackets."""
    host = netloc.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _find(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in _TOKEN_SHAPE.finditer(text)]


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
