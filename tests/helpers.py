"""Test-only store wrappers: real backends underneath, with hooks around ``transact``."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

from agentrooms.store.base import Store
from agentrooms.store.types import Compare, Prepared, ScanPage, Snapshot, TransactResult
from agentrooms.store.wrap import Forwarding

Hook = Callable[[int, list[Compare]], Awaitable[None]]


class Interposed(Forwarding):
    """Forwards to ``inner``, counting reads (noting their keys) and transacts;
    ``before(n, compares)`` runs before the n-th transact (e.g. an interfering writer) and
    ``after(n, result)`` after it commits (e.g. to lose the response by raising)."""

    def __init__(
        self,
        inner: Store,
        before: Hook | None = None,
        after: Callable[[int, TransactResult], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(inner)
        self.before, self.after = before, after
        self.calls = 0
        self.reads = 0
        self.scans = 0
        self.sent: list[list[Compare]] = []
        self.read_keys: list[list[str]] = []  # the keys of each read, in order

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        self.reads += 1
        self.read_keys.append(list(keys))
        return await self.inner._read(room, keys)

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        self.scans += 1
        return await self.inner._scan(room, prefix, after, limit)

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        self.calls += 1
        self.sent.append(list(ops.compares))
        if self.before is not None:
            await self.before(self.calls, ops.compares)
        result = await self.inner._transact(room, ops)
        if self.after is not None:
            await self.after(self.calls, result)
        return result


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a server a test
    starts itself."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def in_line(store: Store, room: str, n: int) -> None:
    """Wait until ``n`` waiters are in the line of ``room``'s locks."""
    while len((await store.scan(room, "lockq/")).records) < n:  # noqa: ASYNC110
        await asyncio.sleep(0.01)


MCP_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
"""An MCP ``initialize`` request, for a test that POSTs one to a server's ``/mcp``."""
