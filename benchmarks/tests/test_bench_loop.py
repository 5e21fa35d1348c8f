"""The benchmarks' event loop (agentrooms_bench.loop): epoll, waited for through select."""

from __future__ import annotations

import asyncio
import selectors
import socket
import time

import pytest

from agentrooms_bench import loop

pytestmark = pytest.mark.skipif(not hasattr(selectors, "EpollSelector"), reason="epoll is Linux's")


def test_the_selector_reports_ready_descriptors_and_waits_out_its_timeout() -> None:
    sel = loop.PreciseEpollSelector()
    a, b = socket.socketpair()
    try:
        key = sel.register(a, selectors.EVENT_READ, "a")
        t0 = time.perf_counter()
        assert sel.select(0.002) == []
        assert time.perf_counter() - t0 >= 0.002  # not cut short
        b.send(b"x")
        assert sel.select(5) == [(key, selectors.EVENT_READ)]  # at once, not after 5 s
        assert sel.select(0) == [(key, selectors.EVENT_READ)]  # level-triggered, as epoll
        a.recv(1)
        assert sel.select(0) == []
    finally:
        sel.close()
        a.close()
        b.close()


def test_run_runs_a_coroutine_on_the_precise_loop() -> None:
    async def main(server: tuple[str, int]) -> str:
        running = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection(*server)
        writer.write(b"ping\n")
        line = await reader.readline()
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.001)
        return f"{type(running._selector).__name__} {line.decode().strip()}"  # type: ignore[attr-defined]

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(await r.readline())
        await w.drain()
        w.close()

    async def with_server() -> str:
        srv = await asyncio.start_server(echo, "127.0.0.1", 0)
        async with srv:
            return await main(srv.sockets[0].getsockname()[:2])

    assert loop.run(with_server()) == "PreciseEpollSelector ping"
