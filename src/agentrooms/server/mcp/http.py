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

Push: a 2026-07-28 client may hold a ``subscriptions/listen`` stream (SSE mode, the
default): it is fed by the store (see :mod:`.push`), so it works from any instance. In
JSON-response mode, and for clients of earlier revisions, there is no push: the agent
polls ``read_new_events``, which returns each event once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl

from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentrooms.errors import AgentroomsError, Unauthorized
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
from agentrooms.server.mcp.server import AgentroomsMCP, build_mcp
from agentrooms.store import Limits, open_store
from agentrooms.store.base import Store

__all__ = ["McpHttp", "create_mcp_app", "mount_mcp", "serve_mcp_http"]

_QUERY_TOKENS = frozenset({"token", "access_token"})


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
    ) -> None:
        self.store = store
        self.auth = auth
        self.server: AgentroomsMCP = build_mcp(
            store, agent=None, auth=auth, limits=limits or HttpLimits()
        )
        self._inner = self.server.streamable_http_app(
            streamable_http_path="/",
            stateless_http=True,
            json_response=json_response,
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
        except AgentroomsError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self.session_manager.handle_request(scope, receive, send)

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


def mount_mcp(app: Starlette, mcp_http: McpHttp, path: str = "/mcp") -> None:
    """Serve ``mcp_http`` at ``path`` of an existing app (e.g. the HTTP API's
    :func:`~agentrooms.server.create_app`), running its lifespan inside the app's own.
    Call it before the app starts."""
    app.router.routes.append(Route(path, endpoint=mcp_http))
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
) -> Starlette:
    """A standalone app serving MCP at ``path`` (with its own lifespan)."""
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
) -> None:
    """Open the store and serve MCP at ``http://host:port{path}`` until interrupted."""
    config = auth if auth is not None else AuthConfig()
    check_bind(host, config)
    asyncio.run(
        _serve(store_url, host, port, config, limits, path, json_response, store_limits, log_level)
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
