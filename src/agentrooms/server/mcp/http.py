"""MCP over streamable HTTP, stateless: any instance serves any request.

No MCP session is kept (``stateless_http=True`` for clients of the handshake revisions;
2026-07-28 requests carry no session anyway), and the tools keep nothing between calls:
the caller is named by each request's bearer token, leases travel as ``task_id`` +
``fence``, the event cursor lives in the store. So a load balancer may send each call of
one agent loop to a different process.

Every request is admitted here before the SDK sees it, exactly as the HTTP API's gate
does: a token in the query string is refused, the bearer token is checked with
:func:`agentrooms.server.auth.authenticate` (or, in dev mode, ``X-Agent`` names the
agent), and failures answer ``401`` with the API's error envelope. The principal rides
the ASGI scope to the tools (``scope["agentrooms.principal"]``), which apply the token's
rooms and scopes per call.

The body is read here too, at most ``HttpLimits.max_body_bytes`` (counted, whatever
``Content-Length`` says): a larger one is read to its end and dropped (up to
``DRAIN_FACTOR`` times the cap, so the client gets the answer rather than a connection
reset) and answered ``413`` with a JSON-RPC error
(``payload_too_large``, naming the limit of one call's arguments), which the client
hands to the model like any other error of the call. Everything under the cap goes to the
SDK, which answers a body that is not JSON with a JSON-RPC parse error (``-32700``), and
to the tools, which check the arguments' sizes alike on every transport
(:mod:`.arguments`). Mounted next to the HTTP API, this endpoint is therefore served
ahead of the API's gate, whose limits answer in the API's own envelope.

Push: a 2026-07-28 client may hold a ``subscriptions/listen`` stream (SSE mode, the
default): it is fed by the store (see :mod:`.push`), so it works from any instance. In
JSON-response mode, and for clients of earlier revisions, there is no push: the agent
polls ``read_new_events``, which returns each event once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast
from urllib.parse import parse_qsl

from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import INVALID_REQUEST
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrooms.errors import AgentroomsError, Unauthorized
from agentrooms.metrics import count_mcp_error
from agentrooms.server import check_bind
from agentrooms.server.auth import (
    AuthConfig,
    Principal,
    authenticate,
    dev_principal,
    parse_bearer,
)
from agentrooms.server.envelope import error_response
from agentrooms.server.gate import PRINCIPAL
from agentrooms.server.limits import HttpLimits
from agentrooms.server.mcp.arguments import body_too_large
from agentrooms.server.mcp.server import AgentroomsMCP, build_mcp, check_profile
from agentrooms.server.observe import Observe
from agentrooms.store import Limits, open_store
from agentrooms.store.base import Store

__all__ = ["McpHttp", "create_mcp_app", "mount_mcp", "serve_mcp_http"]

_QUERY_TOKENS = frozenset({"token", "access_token"})
DRAIN_FACTOR = 16  # a body over the cap is read (and dropped) up to this many times the cap


class McpHttp:
    """An ASGI app answering MCP streamable HTTP requests on whatever path it is routed
    at. Add it to another app with :func:`mount_mcp` (or route to it yourself and run
    :meth:`lifespan` in that app's lifespan); or serve :func:`create_mcp_app`.

    ``host`` is the host the server is reached at: for a loopback host the SDK's DNS
    rebinding protection is on (only loopback ``Host``/``Origin`` headers); give
    ``transport_security`` to choose otherwise.
    """

    def __init__(
        self,
        store: Store,
        *,
        auth: AuthConfig,
        limits: HttpLimits | None = None,
        json_response: bool = False,
        host: str = "127.0.0.1",
        transport_security: TransportSecuritySettings | None = None,
        profile: str = "full",
    ) -> None:
        self.store = store
        self.auth = auth
        self.limits = limits or HttpLimits()
        self.server: AgentroomsMCP = build_mcp(
            store, agent=None, auth=auth, limits=self.limits, profile=profile
        )
        self._inner = self.server.streamable_http_app(
            streamable_http_path="/",
            stateless_http=True,
            json_response=json_response,
            max_request_body_size=self.limits.max_body_bytes,
            transport_security=transport_security,
            host=host,
        )
        self.session_manager = self.server.session_manager

    def lifespan(self) -> AbstractAsyncContextManager[None]:
        """Run while serving: the SDK's request task group."""
        return self.session_manager.run()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._inner(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            scope[PRINCIPAL] = await self._admit(scope)
            receive = await self._read_body(Headers(scope=scope), receive)
        except _Gone:
            return
        except _TooLarge:
            await self._too_large()(scope, receive, send)
            return
        except AgentroomsError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self.session_manager.handle_request(scope, receive, send)

    async def _read_body(self, headers: Headers, receive: Receive) -> Receive:
        """The whole body, counted as it arrives, then replayed to the SDK (later
        messages, a disconnect, pass through). Over the cap (declared or counted) the
        rest is read and dropped, up to ``DRAIN_FACTOR`` times the cap, so that the
        client, still sending, gets the answer rather than a reset (a larger declared
        body is not read at all); then ``_TooLarge``."""
        cap = self.limits.max_body_bytes
        declared = headers.get("content-length", "").strip()
        if declared.isdigit() and int(declared) > cap:
            if int(declared) <= cap * DRAIN_FACTOR:  # else it would be read in vain
                await _drop(receive, int(declared))
            raise _TooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Gone
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(chunk)
            if size > cap:
                if more:
                    await _drop(receive, cap * DRAIN_FACTOR - size)
                raise _TooLarge
            chunks.append(chunk)
            if not more:
                break
        body: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return body
            return await receive()

        return replay

    def _too_large(self) -> Response:
        """``413`` with a JSON-RPC error the client passes on as the call's answer (its
        ``id`` is null: the request was not read)."""
        hint = body_too_large(self.limits)
        count_mcp_error(hint.type)
        data = {"type": hint.type, "message": hint.message, "details": hint.details}
        error = {"code": INVALID_REQUEST, "message": hint.text, "data": data}
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}, ensure_ascii=False)
        return Response(body, 413, headers={"Connection": "close"}, media_type="application/json")

    async def _admit(self, scope: Scope) -> Principal:
        query = scope.get("query_string", b"").decode("latin-1")
        if {name.lower() for name, _ in parse_qsl(query, keep_blank_values=True)} & _QUERY_TOKENS:
            raise Unauthorized(
                "tokens are not accepted in the query string; send 'Authorization: Bearer <token>'"
            )
        headers = Headers(scope=scope)
        authorization = headers.get("authorization")
        if authorization is None and self.auth.dev:
            return dev_principal(self.auth, headers.get("x-agent"))
        token_id, secret = parse_bearer(authorization)
        principal, _ = await authenticate(self.store, token_id, secret)
        return principal


async def _drop(receive: Receive, budget: int) -> None:
    """Read and drop the rest of a body, at most ``budget`` more bytes."""
    while budget > 0:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class _Gone(Exception):
    """The client disconnected while sending its body: nobody to answer."""


class _TooLarge(Exception):
    """The body is over the cap (declared or counted)."""


class _Ahead:
    """Sends HTTP requests for exactly ``path`` to ``endpoint``, the rest to ``app``."""

    def __init__(self, app: ASGIApp, *, path: str, endpoint: ASGIApp) -> None:
        self.app, self.path, self.endpoint = app, path, endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == self.path:
            await self.endpoint(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def mount_mcp(app: Starlette, mcp_http: McpHttp, path: str = "/mcp") -> None:
    """Serve ``mcp_http`` at ``path`` of an existing app (e.g. the HTTP API's
    :func:`~agentrooms.server.create_app`), running its lifespan inside the app's own.
    Call it before the app starts.

    Requests for ``path`` are routed ahead of the app's middleware (the API's gate):
    ``mcp_http`` admits the caller and applies the limits itself, answering them in
    JSON-RPC, where the gate would answer in the API's envelope, which an MCP client
    cannot pass on to its model. They still pass the app's :class:`~..observe.Observe`
    where there is one (request id, log line, metrics under the template ``path``)."""
    ahead = Middleware(_Ahead, path=path, endpoint=mcp_http)
    observed = [i for i, m in enumerate(app.user_middleware) if cast(object, m.cls) is Observe]
    if app.middleware_stack is not None:
        raise RuntimeError("mount MCP before the app starts")
    if observed:
        app.state.templates.add(path)
        app.user_middleware.insert(observed[0] + 1, ahead)  # just inside it
    else:
        app.user_middleware.insert(0, ahead)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(parent: Any) -> AsyncIterator[Any]:
        async with mcp_http.lifespan(), inner(parent) as state:
            yield state

    app.router.lifespan_context = lifespan


def create_mcp_app(
    store: Store,
    *,
    auth: AuthConfig,
    limits: HttpLimits | None = None,
    path: str = "/mcp",
    json_response: bool = False,
    host: str = "127.0.0.1",
    allowed_hosts: Sequence[str] | None = None,
    profile: str = "full",
) -> Starlette:
    """A standalone app serving MCP at ``path`` (with its own lifespan); ``profile`` is
    the tool set of a request that does not ask for one (``?profile=``)."""
    security = None
    if allowed_hosts is not None:
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=list(allowed_hosts)
        )
    mcp_http = McpHttp(
        store,
        auth=auth,
        limits=limits,
        json_response=json_response,
        host=host,
        transport_security=security,
        profile=profile,
    )
    routes = [Route(path, endpoint=mcp_http)]
    return Starlette(routes=routes, lifespan=lambda _: mcp_http.lifespan())


def serve_mcp_http(
    store_url: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    auth: AuthConfig | None = None,
    limits: HttpLimits | None = None,
    *,
    path: str = "/mcp",
    json_response: bool = False,
    store_limits: Limits | None = None,
    log_level: str = "warning",
    profile: str = "full",
) -> None:
    """Open the store and serve MCP at ``http://host:port{path}`` until interrupted."""
    config = auth if auth is not None else AuthConfig()
    check_bind(host, config)
    check_profile(profile)
    asyncio.run(
        _serve(
            store_url,
            host,
            port,
            config,
            limits,
            path,
            json_response,
            store_limits,
            log_level,
            profile,
        )
    )


async def _serve(
    store_url: str,
    host: str,
    port: int,
    auth: AuthConfig,
    limits: HttpLimits | None,
    path: str,
    json_response: bool,
    store_limits: Limits | None,
    log_level: str,
    profile: str,
) -> None:
    import uvicorn

    store = await open_store(store_url, limits=store_limits)
    try:
        app = create_mcp_app(
            store,
            auth=auth,
            limits=limits,
            path=path,
            json_response=json_response,
            host=host.strip("[]"),
            profile=profile,
        )
        config = uvicorn.Config(
            app,
            host=host.strip("[]"),
            port=port,
            log_level=log_level,
            proxy_headers=False,
            timeout_graceful_shutdown=5,  # listen streams stay open until their client leaves
        )
        await uvicorn.Server(config).serve()
    finally:
        await store.close()
