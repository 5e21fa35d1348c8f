"""The HTTP surface: a stateless FastAPI app over one store, and ``serve`` to run it.

::

    from agentrooms.server import AuthConfig, HttpLimits, create_app, serve

    serve("sqlite:///agentrooms.db", "127.0.0.1", 8080, AuthConfig(dev=True))

Tokens are minted, revoked and listed with :func:`mint`, :func:`revoke` and
:func:`list_tokens` (the CLI wraps them); these, :class:`AuthConfig` and
:class:`HttpLimits` work without the ``server`` extra. :func:`create_app`,
:class:`Perimeter` and :func:`serve` need it (FastAPI, uvicorn, the MCP SDK) and raise
:class:`~agentrooms.extras.MissingExtra` naming it when it is not installed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrooms.extras import require
from agentrooms.server.auth import (
    SCOPES,
    AuthConfig,
    MintedToken,
    Principal,
    TokenInfo,
    list_tokens,
    mint,
    revoke,
)
from agentrooms.server.limits import HttpLimits
from agentrooms.store import Limits, open_store

if TYPE_CHECKING:
    from agentrooms.server.app import create_app
    from agentrooms.server.perimeter import Perimeter

__all__ = [
    "LOOPBACK",
    "SCOPES",
    "AuthConfig",
    "HttpLimits",
    "MintedToken",
    "Perimeter",
    "Principal",
    "TokenInfo",
    "check_bind",
    "create_app",
    "list_tokens",
    "mint",
    "revoke",
    "serve",
]

LOOPBACK = frozenset({"127.0.0.1", "::1"})


def __getattr__(name: str) -> object:
    """``create_app`` and ``Perimeter``, imported on first use (they need the extra)."""
    if name == "create_app":
        require("server", "agentrooms.server.create_app")
        from agentrooms.server.app import create_app

        return create_app
    if name == "Perimeter":
        require("server", "agentrooms.server.Perimeter")
        from agentrooms.server.perimeter import Perimeter

        return Perimeter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_bind(host: str, auth: AuthConfig) -> None:
    """Dev mode (no tokens) serves only the loopback interface: ``ValueError`` otherwise."""
    if auth.dev and host.strip("[]") not in LOOPBACK:
        raise ValueError(
            f"refusing to serve without tokens on {host!r}: dev mode binds only "
            "127.0.0.1 or ::1 (mint tokens to serve other interfaces)"
        )


def serve(
    store_url: str,
    host: str = "127.0.0.1",
    port: int = 8080,
    auth: AuthConfig | None = None,
    limits: HttpLimits | None = None,
    *,
    store_limits: Limits | None = None,
    log_level: str = "info",
    log_format: str = "text",
    mcp: bool = True,
) -> None:
    """Open the store at ``store_url`` and serve the API on ``host:port`` with uvicorn
    (and, with ``mcp``, the MCP server's streamable HTTP at ``/mcp``) until interrupted;
    the store is closed on the way out.

    Connections run :mod:`agentrooms.server.protocol` (header size and deadline,
    lingering closes) under ``limits``; at most ``limits.max_connections`` requests are
    served at once (``503`` past it); every request, ``/mcp`` included, passes the
    :class:`Perimeter` (in dev mode only loopback ``Host`` and ``Origin`` names). The
    access log never shows a token's secret.

    ``log_format``: ``text`` (uvicorn's lines) or ``json`` (every logger's lines as one
    JSON object each on stderr, with one line per request carrying its request id, agent,
    room and error type: :mod:`agentrooms.server.observe`); ``ValueError`` otherwise."""
    config = auth if auth is not None else AuthConfig()
    check_bind(host, config)
    if log_format not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', not {log_format!r}")
    require("server", "agentrooms serve")
    settings = _Logs(log_level, log_format)
    asyncio.run(
        _serve(store_url, host, port, config, limits or HttpLimits(), store_limits, settings, mcp)
    )


@dataclass(frozen=True, slots=True)
class _Logs:
    level: str
    format: str


async def _serve(
    store_url: str,
    host: str,
    port: int,
    auth: AuthConfig,
    limits: HttpLimits,
    store_limits: Limits | None,
    logs: _Logs,
    mcp: bool,
) -> None:
    import uvicorn

    from agentrooms.server.app import create_app
    from agentrooms.server.mcp.http import McpHttp, mount_mcp
    from agentrooms.server.perimeter import LOOPBACK_HOSTS, Perimeter
    from agentrooms.server.protocol import protocol_for

    store = await open_store(store_url, limits=store_limits)
    try:
        app = create_app(store, auth=auth, limits=limits)
        if mcp:
            mount_mcp(app, McpHttp(store, auth=auth, limits=limits, host=host.strip("[]")), "/mcp")
        hosts = LOOPBACK_HOSTS if auth.dev else None
        guarded = Perimeter(app, store=store, auth=auth, limits=limits, hosts=hosts)
        config = uvicorn.Config(
            guarded,
            host=host.strip("[]"),
            port=port,
            log_level=logs.level,
            **_uvicorn_logging(logs),
            proxy_headers=False,
            http=protocol_for(limits),
            ws="none",
            h11_max_incomplete_event_size=limits.max_header_bytes,
            limit_concurrency=limits.max_connections,
            timeout_graceful_shutdown=5,  # streams stay open until their client leaves
        )
        logging.getLogger("uvicorn.access").addFilter(_redact)
        try:
            await uvicorn.Server(config).serve()
        finally:
            logging.getLogger("uvicorn.access").removeFilter(_redact)
    finally:
        await store.close()


def _uvicorn_logging(logs: _Logs) -> dict[str, Any]:
    """uvicorn's logging settings: its own in text mode (the request line is its access
    log, so ours is dropped); in JSON mode none of its own: its loggers propagate to the
    JSON handler, and the request line is ours (it knows the request id and agent)."""
    access = logging.getLogger("agentrooms.access")
    if logs.format == "json":
        from agentrooms.server.observe import configure_json_logging

        configure_json_logging()
        access.propagate = True
        return {"log_config": None, "access_log": False}
    access.propagate = False
    access.addHandler(logging.NullHandler())
    return {}


def _redact(record: logging.LogRecord) -> bool:
    """An access-log filter: no token secret is ever written (the perimeter also
    replaces a query string that carries one)."""
    from agentrooms.server.perimeter import redact_tokens

    if isinstance(record.args, tuple):
        record.args = tuple(redact_tokens(a) if isinstance(a, str) else a for a in record.args)
    return True
