"""One agent's client of the MCP endpoints of several ``agentrooms serve`` servers
(streamable HTTP, the official SDK's ``Client``), as the recording surfaces and the
property workers use it: :class:`McpSession`. A session lives on the server it opened
on; a lost connection (a killed server) or a call past its read timeout (a stopped
server) is an unknown outcome, and the next call opens a session on another server."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent

from agentrooms.reliability.outcomes import UnknownOutcome

__all__ = ["CONNECTION_CLOSED", "REQUEST_TIMEOUT", "McpSession", "only"]

CONNECTION_CLOSED = -32000  # the SDK's MCPError code when the server's connection closed
REQUEST_TIMEOUT = -32001  # the SDK's MCPError code when a call's read timeout passed


def only(exc: BaseException) -> BaseException:
    """The one exception a group of one (of a group of one...) holds; else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class McpSession:
    """A client of the MCP endpoints (``/mcp``) of ``bases``, as agent ``agent``. Its
    session opens on ``bases[0]``; when the server loses it (the connection closed: a
    killed server) or a call is not answered within ``timeout`` seconds (a stopped
    server: the SDK's read timeout of the call), the call in flight is an unknown
    outcome and the next call opens a new session on another server. The SDK's session
    is held by a task of its own; :meth:`close` ends it (a session left behind is
    closed in the background, since a stopped server answers nothing).

    What a tool's answer means: its body when it succeeded; ``{"error": {...}}`` for a
    typed failure of :attr:`TYPED` (the caller reads it); ``rate_limited`` is waited
    out and called again; ``store_unavailable`` or a lost connection is
    :class:`UnknownOutcome`; any other failure is a bug (``RuntimeError``). Each is
    counted in :attr:`reports` by how the caller saw it."""

    TYPED: frozenset[str] = frozenset()
    """The error types a caller reads as an outcome."""

    def __init__(
        self, bases: Sequence[str], agent: str, *, seed: int = 0, timeout: float = 10.0
    ) -> None:
        self.bases, self.agent, self.timeout = list(bases), agent, timeout
        self.base = self.bases[0]
        self.rng = random.Random(seed)
        self.reports: Counter[str] = Counter()
        self.sessions = 0  # sessions opened
        self.answered = 0  # tool calls answered
        self._holder: tuple[asyncio.Task[None], asyncio.Event] | None = None
        self._leaving: set[asyncio.Task[None]] = set()  # sessions left behind, closing
        self._client: Client | None = None

    @asynccontextmanager
    async def _session(self, agent: str) -> AsyncIterator[Client]:
        timeout = httpx2.Timeout(self.timeout)
        async with (
            httpx2.AsyncClient(headers={"X-Agent": agent}, timeout=timeout) as http,
            Client(streamable_http_client(f"{self.base}/mcp", http_client=http)) as client,
        ):
            yield client

    async def open(self) -> Self:
        """Open a session on :attr:`base`, held by a task of its own (the SDK's
        sessions must be closed by the task that opened them, and each recorded call
        runs in a task of its own). ``UnknownOutcome`` if it cannot be opened (the
        server is gone; the next try goes to another): how it failed is counted in
        :attr:`reports`."""
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        done = asyncio.Event()

        async def hold() -> None:
            try:
                async with self._session(self.agent) as client:
                    ready.set_result(client)
                    await done.wait()
            except Exception as exc:
                if not ready.done():
                    ready.set_exception(exc)
                else:  # a session whose server is gone ends with its error
                    self.reports[f"closing a lost session: {type(exc).__name__}"] += 1

        holder = asyncio.create_task(hold())
        try:
            self._client = await ready
        except Exception as exc:
            await holder
            seen = f"opening a session: {type(exc).__name__}"
            self.reports[seen] += 1
            self._move()
            raise UnknownOutcome(f"no MCP session on {self.base}", seen) from exc
        self._holder, self.sessions = (holder, done), self.sessions + 1
        return self

    def _move(self) -> None:
        """The next session opens on another server."""
        others = [b for b in self.bases if b != self.base]
        self.base = self.rng.choice(others or self.bases)

    async def _close(self) -> None:
        holder, self._holder, self._client = self._holder, None, None
        if holder is not None:
            task, done = holder
            done.set()
            await task

    def _lost(self) -> None:
        """The server lost the session, or does not answer: close it in the background
        (its server may be stopped); the next call opens one elsewhere."""
        holder, self._holder, self._client = self._holder, None, None
        if holder is not None:
            task, done = holder
            done.set()
            self._leaving.add(task)
            task.add_done_callback(self._leaving.discard)
        self._move()

    async def _call(self, tool: str, client: Client | None = None, **args: Any) -> dict[str, Any]:
        """The tool's body, or ``{"error": {...}}`` for a typed failure."""
        if client is None and self._client is None:
            await self.open()
        session = client or self._client
        assert session is not None
        while True:
            try:
                result: CallToolResult = await session.call_tool(
                    tool, args, read_timeout_seconds=self.timeout
                )
            except (httpx2.TransportError, MCPError) as exc:
                if isinstance(exc, MCPError) and exc.code not in (
                    CONNECTION_CLOSED,
                    REQUEST_TIMEOUT,
                ):
                    raise
                if isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT:
                    shown = "MCPError timed out"  # the message names the request's id
                elif isinstance(exc, MCPError):
                    shown = f"MCPError {exc.message!r}"
                else:
                    shown = ""
                seen = f"{shown or type(exc).__name__}: unknown outcome"
                self.reports[seen] += 1
                if client is None:
                    self._lost()
                raise UnknownOutcome(f"{tool}: {shown or type(exc).__name__}", seen) from exc
            self.answered += 1
            block = result.content[0]
            assert isinstance(block, TextContent)
            if not result.is_error:
                body: dict[str, Any] = json.loads(block.text)
                return body
            assert result.structured_content is not None
            error: dict[str, Any] = result.structured_content["error"]
            if error["type"] == "rate_limited":
                self.reports["rate_limited: waited, called again"] += 1
                await asyncio.sleep(0.2)
                continue
            if error["type"] == "store_unavailable":
                seen = "store_unavailable: unknown outcome"
                self.reports[seen] += 1
                raise UnknownOutcome(f"{tool}: store_unavailable", seen)
            if error["type"] in self.TYPED:
                return {"error": error}
            raise RuntimeError(f"{tool}{args}: {block.text}")

    async def close(self) -> None:
        """Close the session, and wait for those left behind to close."""
        await self._close()
        if self._leaving:  # a stopped server's session waits for its transport's timeouts
            _, late = await asyncio.wait(set(self._leaving), timeout=3 * self.timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
