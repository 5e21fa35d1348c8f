"""The optional parts of agentrooms and the error that names the one missing.

The library itself (rooms, the store, ``commit``, the CLI's store commands) needs none of
them; ``agentrooms[mcp]`` adds the MCP server on stdio (the MCP SDK);
``agentrooms[server]`` that and the HTTP API (FastAPI) under uvicorn, MCP over
streamable HTTP included; ``agentrooms[redis]`` and ``agentrooms[postgres]`` add the shared
stores' drivers; ``agentrooms[langgraph]`` the LangGraph checkpointer's base
(:mod:`agentrooms.integrations.langgraph`); ``agentrooms[client]`` the HTTP client
(httpx, :mod:`agentrooms.client`); ``agentrooms[all]`` is all of these.
``agentrooms[bench]`` (not in ``all``) is the peer libraries the benchmarks measure.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "MissingExtra", "require"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "uvicorn", "mcp"),
    "mcp": ("mcp",),
    "langgraph": ("langchain_core", "langgraph.checkpoint"),
    "client": ("httpx",),
}


class MissingExtra(ModuleNotFoundError):
    """A feature needs an extra that is not installed; the message names the extra and
    how to install it, ``name`` is the first module found missing."""


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtra` naming ``feature`` and the extra if a module of
    ``extra`` (:data:`EXTRAS`) is not installed. Only looks the modules up: importing them
    is left to the code that uses them."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise MissingExtra(
                f"{feature} needs the {extra} extra ({module} is not installed): "
                f"pip install 'agentrooms[{extra}]'",
                name=module,
            )
