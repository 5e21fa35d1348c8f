"""The gate every request passes before any route runs (a pure ASGI middleware).

In order, each step answering with the error envelope and ending the request:

0. a path ending in ``/`` (no route's does, and nothing redirects): ``404``;
1. a token in the query string (``token`` / ``access_token``): ``401``, and it is not used;
2. a ``Content-Length`` over the body limit: ``413`` before a byte of the body is read;
3. under ``/v1/``: the bearer token (one read of its record in its reserved
   ``_auth.<d>`` room), or dev mode's caller, or, for the operator stream only
   (``GET /v1/ops/rooms/R/stream?ticket=T`` without an ``Authorization`` header), a
   single-use stream ticket (:mod:`.tickets`): ``401``. The dashboard's pages (``/ui``,
   ``/ui/rooms/R``; not its static files) are admitted the same way when they carry an
   ``Authorization`` header or the server is in dev mode, and pass through without a
   caller otherwise (the page then answers ``401`` itself);
4. the caller's token bucket: ``429`` with ``Retry-After``. A token seen before is charged
   *before* step 3 (its hash is kept in memory), so a limited caller costs no store read;
   then an event stream (``GET .../events/stream``) past the agent's
   ``max_streams_per_agent`` open streams, or an operator's change stream
   (``GET /v1/ops/rooms/<room>/stream``, the dashboard's) past its
   ``max_dashboard_streams``, a pool apart: ``429``; the slot is held until the stream's
   request ends. A stream ticket (``POST .../stream-tickets``) asked while that pool is
   full is refused the same way, so the page learns why (an ``EventSource`` sees no status);
5. the body, read chunk by chunk and counted: ``413`` at the first byte over the limit
   (chunked bodies and lying ``Content-Length`` headers alike), the rest left unread;
6. a JSON body's shape (depth, strings, items; NaN, surrogates): ``400``.

Only then does the application see the request, with the body replayed from memory and
the caller at ``scope["agentrooms.principal"]``. Nothing over a limit reaches a room's
records: the only store access before the limits is the token lookup. What guards the
connection and the whole app against a hostile client (header size and deadlines, body
deadline, Host and Origin in dev mode, failed authentications per address, revoking
tokens sent in URLs) is :mod:`.protocol` and :mod:`.perimeter`, which ``serve`` adds.
"""

from __future__ import annotations

import collections
import hmac
import re
from urllib.parse import parse_qsl

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrooms.errors import (
    AgentroomsError,
    BadRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
)
from agentrooms.server.access import PRINCIPAL
from agentrooms.server.auth import (
    AuthConfig,
    Principal,
    authenticate,
    dev_principal,
    hash_secret,
    parse_bearer,
)
from agentrooms.server.envelope import error_response
from agentrooms.server.limits import HttpLimits, RateLimiter, StreamSlots, parse_json
from agentrooms.server.tickets import redeem
from agentrooms.store.base import Store

__all__ = ["PRINCIPAL", "Gate"]

_QUERY_TOKENS = frozenset({"token", "access_token"})
_KNOWN_TOKENS = 10_000
_STREAM = re.compile(r"/v1/rooms/[^/]+/events/stream|/v1/ops/rooms/[^/]+/stream")
_OPS_STREAM = re.compile(r"/v1/ops/rooms/([^/]+)/stream")
_TICKETS = re.compile(r"/v1/ops/rooms/[^/]+/stream-tickets")
_PAGE = re.compile(r"/ui(/rooms/[^/]+)?")


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
    ) -> None:
        self.app, self.store, self.auth, self.limits = app, store, auth, limits
        self.limiter = None if limits.rate is None else RateLimiter(limits.rate, limits.burst)
        self.streams = StreamSlots(limits.max_streams_per_agent)
        self.dashboards = StreamSlots(limits.max_dashboard_streams)  # operator streams
        # token id -> (secret hash, agent): lets step 4 run before the store read
        self._known: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stream_of: tuple[StreamSlots, str] | None = None  # the slot this request holds
        try:
            headers = Headers(scope=scope)
            if len(scope["path"]) > 1 and scope["path"].endswith("/"):
                raise NotFound(f"no route {scope['method']} {scope['path'][:200]}")
            self._check_query(scope)
            self._check_length(headers)
            if scope["path"].startswith("/v1/") or scope["path"] == "/v1":
                principal = await self._admit(scope, headers)
                scope[PRINCIPAL] = principal
                if scope["method"] == "GET" and _STREAM.fullmatch(scope["path"]):
                    stream_of = self._open_stream(scope["path"], principal.agent)
                elif scope["method"] == "POST" and _TICKETS.fullmatch(scope["path"]):
                    self._check_dashboards(principal.agent)
            elif _PAGE.fullmatch(scope["path"]) and (self.auth.dev or "authorization" in headers):
                scope[PRINCIPAL] = await self._admit(scope, headers)
            receive = await self._buffer(scope, headers, receive)
        except _Gone:
            if stream_of is not None:
                stream_of[0].give(stream_of[1])
            return
        except AgentroomsError as exc:
            if stream_of is not None:
                stream_of[0].give(stream_of[1])
            extra = {"Connection": "close"} if isinstance(exc, PayloadTooLarge) else {}
            await error_response(exc, headers=extra)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            if stream_of is not None:
                stream_of[0].give(stream_of[1])

    # -- steps -----------------------------------------------------------------------

    @staticmethod
    def _check_query(scope: Scope) -> None:
        query = scope.get("query_string", b"").decode("latin-1")
        names = {name.lower() for name, _ in parse_qsl(query, keep_blank_values=True)}
        if names & _QUERY_TOKENS:
            raise Unauthorized(
                "tokens are not accepted in the query string (it ends up in logs); "
                "send 'Authorization: Bearer <token>'"
            )

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

    async def _admit(self, scope: Scope, headers: Headers) -> Principal:
        authorization = headers.get("authorization")
        ticket = _ticket_of(scope) if authorization is None else None
        if ticket is not None:
            principal = await redeem(self.store, self.auth, ticket[1], ticket[0])
            self._charge(principal.agent)
            return principal
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

    def _open_stream(self, path: str, agent: str) -> tuple[StreamSlots, str]:
        """A slot of ``agent``'s pool for the stream at ``path`` (the operator's change
        streams have their own); ``RateLimited`` when that pool is full."""
        if _OPS_STREAM.fullmatch(path):
            self._check_dashboards(agent)
            self.dashboards.take(agent)
            return self.dashboards, agent
        if not self.streams.take(agent):
            raise RateLimited(
                1.0,
                f"agent {agent!r} holds {self.streams.cap} open event streams, the most it "
                "may; close one (or resume it) first",
            )
        return self.streams, agent

    def _check_dashboards(self, agent: str) -> None:
        if self.dashboards.held(agent) >= self.dashboards.cap:
            raise RateLimited(
                5.0,
                f"agent {agent!r} holds {self.dashboards.cap} open dashboard streams, the "
                "most it may (max_dashboard_streams); close a dashboard tab first",
            )

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
        body = b"".join(chunks)
        if body and _is_json(headers.get("content-type")):
            parse_json(body, self.limits)
        return _replay(body, receive)


def _ticket_of(scope: Scope) -> tuple[str, str] | None:
    """``(room, ticket)`` of a ``GET`` of the operator stream carrying ``?ticket=``."""
    stream = _OPS_STREAM.fullmatch(scope["path"])
    if scope["method"] != "GET" or stream is None:
        return None
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
    tickets = [value for name, value in query if name == "ticket"]
    return None if not tickets else (stream.group(1), tickets[-1])


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
