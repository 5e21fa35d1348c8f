"""The fault proxy's stop ends every connection's pumps, forwarding and blackholed alike:
none is left pending for the loop to destroy."""

from __future__ import annotations

import asyncio

import pytest

from agentrooms.reliability.proxy import Blackhole, TcpProxy


async def test_stop_ends_every_pump_of_live_and_blackholed_connections() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = TcpProxy(("127.0.0.1", port))
    proxy.start()
    opened: list[asyncio.StreamWriter] = []
    try:
        reader, writer = await asyncio.open_connection(*proxy.address)
        opened.append(writer)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        proxy.blackholing = True
        _, held = await asyncio.open_connection(*proxy.address)
        opened.append(held)
        held.write(b"into the hole")
        for _ in range(100):  # until the proxy has accepted it and pumps it nowhere
            if proxy.accepted == 2 and len(proxy._pumps) == 3:
                break
            await asyncio.sleep(0.01)
        pumps = list(proxy._pumps)
        assert len(pumps) == 3, pumps  # two for the live link, one for the blackholed
    finally:
        await asyncio.to_thread(proxy.stop)
        for w in opened:
            w.close()
        server.close()
        await server.wait_closed()
    assert all(task.done() for task in pumps)
    assert not proxy._pumps


async def test_a_connection_that_lost_bytes_to_a_drop_never_forwards_again() -> None:
    """A drop cuts a hole in the client's stream: the rest must not reach the server as
    if it followed on (a server would answer out of step), and the heal resets it."""
    received = bytearray()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            received.extend(data)

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    proxy = TcpProxy(("127.0.0.1", server.sockets[0].getsockname()[1]))
    proxy.start()
    try:
        reader, writer = await asyncio.open_connection(*proxy.address)
        writer.write(b"one ")
        await writer.drain()
        for _ in range(100):
            if received:
                break
            await asyncio.sleep(0.01)
        proxy.dropping = True
        writer.write(b"lost ")
        await writer.drain()
        for _ in range(100):
            if proxy.dropped:
                break
            await asyncio.sleep(0.01)
        proxy.dropping = False
        writer.write(b"after the hole")
        await writer.drain()
        await asyncio.sleep(0.2)
        assert bytes(received) == b"one "
        await proxy.run(_heal_drop(proxy))
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(10), 5)
    finally:
        writer.close()
        await asyncio.to_thread(proxy.stop)
        server.close()
        await server.wait_closed()


async def _heal_drop(proxy: TcpProxy) -> None:
    from agentrooms.reliability.proxy import Drop

    await Drop(proxy)._set(False)


async def test_a_blackhole_holds_an_open_connections_bytes_and_delivers_them_in_order() -> None:
    """A partition loses packets but TCP resends them: an open connection's bytes wait
    through the blackhole and arrive, in order and whole, at the heal. Discarding them
    and forwarding again would cut a hole in the stream (a Redis client then reads each
    reply as the next command's)."""
    received = bytearray()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            received.extend(data)
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = TcpProxy(("127.0.0.1", server.sockets[0].getsockname()[1]))
    proxy.start()
    hole = Blackhole(proxy)
    try:
        reader, writer = await asyncio.open_connection(*proxy.address)
        writer.write(b"one ")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"one "
        await hole.inject()
        writer.write(b"held ")
        await writer.drain()
        with pytest.raises(TimeoutError):  # nothing crosses while the hole lasts
            await asyncio.wait_for(reader.readexactly(5), 0.3)
        assert bytes(received) == b"one "
        await hole.heal()
        writer.write(b"after")
        assert await asyncio.wait_for(reader.readexactly(10), 5) == b"held after"
        assert bytes(received) == b"one held after" and proxy.dropped == 0
    finally:
        writer.close()
        await asyncio.to_thread(proxy.stop)
        server.close()
        await server.wait_closed()
