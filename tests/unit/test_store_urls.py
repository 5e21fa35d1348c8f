"""Store URLs: strict parameters on every backend, and connect / per-call timeouts that
hold when the network freezes (a TCP proxy in the test stops forwarding, as a cut
cable or a stopped server host would: nothing is refused, nothing arrives)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from agentrooms import BadRequest, Put, StoreUnavailable, open_store
from agentrooms.store.base import Store
from tests.conftest import Backend


def _with(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


# ------------------------------------------------------------------- strict parameters


async def test_an_unknown_parameter_is_a_bad_request_at_open(backend: Backend) -> None:
    with pytest.raises(BadRequest) as refused:
        await open_store(_with(backend.url, "timout=5"))
    assert "'timout'" in str(refused.value)
    assert "accepted" in str(refused.value)


@pytest.mark.parametrize("name", ["timeout", "connect_timeout"])
async def test_a_mistyped_timeout_is_a_bad_request_at_open(backend: Backend, name: str) -> None:
    wrong = "accepted: none" if backend.name == "memory" else "a positive number of seconds"
    with pytest.raises(BadRequest, match=f"{name}.*{wrong}"):
        await open_store(_with(backend.url, f"{name}=5s"))


async def test_the_timeouts_are_set_by_the_url(backend: Backend) -> None:
    if backend.name == "memory":  # takes no parameters: no call of it waits
        with pytest.raises(BadRequest, match="accepted: none"):
            await open_store(_with(backend.url, "timeout=2.5"))
        return
    store = await open_store(_with(backend.url, "timeout=2.5&connect_timeout=1.5"))
    try:
        details = (await store.info()).details
        assert (details["timeout"], details["connect_timeout"]) == (2.5, 1.5)
    finally:
        await store.close()


async def test_the_sqlite_timeout_bounds_a_call_on_a_locked_database(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    url = f"sqlite:///{path}?timeout=0.3&busy_timeout_ms=50"
    await (await open_store(url)).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    store = await open_store(url)
    try:
        _, took = await _fails_within(0.3, store.transact("r", writes=[Put("k", 1)]))
        assert 0.25 < took < 0.9, took
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        await store.close()


async def test_redis_takes_one_name_for_each_timeout(redis_url: str) -> None:
    with pytest.raises(BadRequest, match="not both"):
        await open_store(_with(redis_url, "timeout=1&socket_timeout=2"))


# ---------------------------------------------------------------- a frozen network


class Blackhole:
    """A TCP proxy to ``upstream`` that, once :meth:`freeze` is called, forwards
    nothing more either way and answers nothing, keeping every connection open."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.frozen = False
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        self.frozen = True

    async def close(self) -> None:
        """Cut every connection (so the store's own close is quick) and stop."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        if self.frozen:
            return  # accepted, never answered
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._writers.append(up_writer)
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if self.frozen:
                continue  # swallowed: the other side waits for ever
            writer.write(data)
            await writer.drain()


@contextlib.asynccontextmanager
async def behind_blackhole(url: str) -> AsyncIterator[tuple[Blackhole, str]]:
    """A proxy to the server of ``url``, and ``url`` pointed at the proxy."""
    parts = urlsplit(url)
    proxy = Blackhole(parts.hostname or "127.0.0.1", parts.port or 0)
    await proxy.start()
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
    try:
        yield proxy, urlunsplit(parts._replace(netloc=netloc))
    finally:
        await proxy.close()


async def _fails_within(seconds: float, call: object) -> tuple[StoreUnavailable, float]:
    """The StoreUnavailable that ``call`` (an awaitable) raises, and how long it took;
    the test fails rather than hangs if it takes three times ``seconds``."""
    start = time.monotonic()
    with pytest.raises(StoreUnavailable) as failed:
        async with asyncio.timeout(3 * seconds):
            await call  # type: ignore[misc]
    return failed.value, time.monotonic() - start


@pytest.fixture(params=["redis", "postgres"])
def server_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


async def test_a_frozen_network_fails_reads_and_writes_within_the_timeout(
    server_url: str, room: str
) -> None:
    async with behind_blackhole(server_url) as (proxy, url):
        store: Store = await open_store(_with(url, "timeout=1&connect_timeout=1"))
        try:
            await store.transact(room, writes=[Put("k", 1)])
            proxy.freeze()
            start = time.monotonic()
            async with asyncio.timeout(6):  # fail rather than hang on a regression
                read, write = await asyncio.gather(
                    store.read(room, ["k"]),
                    store.transact(room, writes=[Put("k", 2)]),
                    return_exceptions=True,
                )
            assert 0.9 < time.monotonic() - start < 2.5
            assert isinstance(read, StoreUnavailable), read
            assert isinstance(write, StoreUnavailable), write
            assert "unknown" in str(write)  # sent: it may have been applied
            # the connection that stopped answering is dropped; a new one cannot be made
            _, took = await _fails_within(1.0, store.read(room, ["k"]))
            assert 0.9 < took < 2.0, took
        finally:
            await proxy.close()
            await store.close()


async def test_a_frozen_network_fails_open_within_the_connect_timeout(server_url: str) -> None:
    async with behind_blackhole(server_url) as (proxy, url):
        proxy.freeze()
        _, took = await _fails_within(1.0, open_store(_with(url, "connect_timeout=1")))
        assert 0.9 < took < 2.0, took
