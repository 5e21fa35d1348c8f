"""Serve the MCP server on stdin/stdout for one agent."""

from __future__ import annotations

import anyio

from agentrooms.server.mcp.server import build_mcp, check_profile
from agentrooms.store import Limits, open_store

__all__ = ["run_stdio", "run_stdio_async"]


async def run_stdio_async(
    store_url: str,
    agent: str,
    *,
    rooms: list[str] | None = None,
    store_limits: Limits | None = None,
    profile: str = "full",
    role: str | None = None,
) -> None:
    """Open the store, serve MCP on stdio as ``agent`` (with ``role``, if given) until
    stdin closes, close it. ``profile``: the tool set offered (``BadRequest`` for an
    unknown one)."""
    check_profile(profile)
    store = await open_store(store_url, limits=store_limits)
    try:
        server = build_mcp(store, agent=agent, rooms=rooms, profile=profile, role=role)
        await server.run_stdio_async()
    finally:
        await store.close()


def run_stdio(
    store_url: str,
    agent: str,
    *,
    rooms: list[str] | None = None,
    store_limits: Limits | None = None,
    profile: str = "full",
    role: str | None = None,
) -> None:
    """:func:`run_stdio_async` in a fresh event loop (blocks until stdin closes)."""

    async def main() -> None:
        await run_stdio_async(
            store_url, agent, rooms=rooms, store_limits=store_limits, profile=profile, role=role
        )

    anyio.run(main)
