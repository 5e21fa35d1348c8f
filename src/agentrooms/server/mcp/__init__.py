"""The MCP server: agentrooms as tools an LLM agent calls, over stdio or streamable HTTP.

::

    # stdio, for one agent (an MCP host launches it):
    python -m agentrooms.server.mcp stdio --store sqlite:///team.db --agent alice

    # streamable HTTP, stateless, bearer tokens of agentrooms.server.auth:
    python -m agentrooms.server.mcp http --store postgresql://... --host 0.0.0.0 --port 8765

In code: :func:`build_mcp` makes the server over an open store; :func:`run_stdio` serves
it on stdin/stdout; :class:`McpHttp` is the ASGI app for streamable HTTP, which
:func:`mount_mcp` adds to an existing app (e.g. the HTTP API at ``/mcp``),
:func:`create_mcp_app` is the standalone app and :func:`serve_mcp_http` runs that with
uvicorn.

Tools (each but ``list_rooms`` takes ``room``; state-changing ones an optional
``request_id``), in modules by area under :mod:`.tools`, listed in the table of
:mod:`.server`: ``tools/list`` shows a caller those of its profile (``full``, ``worker``)
that its token's scopes allow. Lists take ``limit``/``after`` and answer ``next``; a
result stays within ``HttpLimits.max_result_bytes`` (a large value comes in parts).
Arguments are strict, with the same size limits on every transport (:mod:`.arguments`).
Errors are tool errors whose text starts with the error type and says what to do next
(:mod:`.hints`); push is a ``subscriptions/listen`` stream on ``room://{room}/events``
(:mod:`.push`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrooms.server.mcp.http import (
        McpHttp,
        create_mcp_app,
        mount_mcp,
        serve_mcp_http,
    )
    from agentrooms.server.mcp.push import EVENTS_TEMPLATE, events_uri
    from agentrooms.server.mcp.server import INSTRUCTIONS, AgentroomsMCP, build_mcp
    from agentrooms.server.mcp.stdio import run_stdio, run_stdio_async

# Each name is imported from its module on first use, so that ``agentrooms mcp`` on
# stdio does not pay for the streamable-HTTP stack (Starlette, uvicorn) it never uses.
_HOME = {
    "McpHttp": "http",
    "create_mcp_app": "http",
    "mount_mcp": "http",
    "serve_mcp_http": "http",
    "EVENTS_TEMPLATE": "push",
    "events_uri": "push",
    "INSTRUCTIONS": "server",
    "AgentroomsMCP": "server",
    "build_mcp": "server",
    "run_stdio": "stdio",
    "run_stdio_async": "stdio",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "EVENTS_TEMPLATE",
    "INSTRUCTIONS",
    "AgentroomsMCP",
    "McpHttp",
    "build_mcp",
    "create_mcp_app",
    "events_uri",
    "mount_mcp",
    "run_stdio",
    "run_stdio_async",
    "serve_mcp_http",
]
