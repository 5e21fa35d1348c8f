"""A TCP proxy between a client and its store, and the network faults it injects.

:class:`TcpProxy` listens on a free 127.0.0.1 port and forwards every connection to a
target ``(host, port)``. It runs its own event loop in a thread of its own, so it keeps
forwarding (and its faults keep acting) while the client's loop is busy or blocked.
Each mode is a :class:`~agentrooms.reliability.faults.Fault` built on the proxy:

* :class:`Delay` (``delay``): every chunk, either way, waits ``seconds`` before it is
  forwarded (chunks keep their order, so a burst is delayed once per chunk).
* :class:`Drop` (``drop``): bytes from the client are read and discarded; the server's
  bytes still pass; connections stay open, and forward again after the heal.
* :class:`Reset` (``reset``): every open connection is closed with a TCP RST (``SO_LINGER``
  0) on both sides at once, and while injected every new connection is reset as soon as
  it is accepted.
* :class:`Blackhole` (``blackhole``): nothing is forwarded either way, as in a network
  partition; new connections are accepted and never connected to the target. An open
  connection's bytes wait, in order, and are delivered at the heal, as TCP delivers what
  it resends once the path is back (unless an end gave up and closed meanwhile). The
  heal resets (RST) every connection accepted during the blackhole.
* :class:`ResetInFlight` (``reset in flight``): aimed at a request in flight rather than
  timed. While injected, every chunk the client sends is forwarded to the target and
  marks its connection; the first bytes the target sends back on a marked connection
  are never forwarded: the connection is reset (RST) on both sides instead. The request
  reached the store and may have taken effect; its reply is lost. A connection marked
  before the heal is still cut at its next reply.

A proxy may listen on more ports than its own (:meth:`TcpProxy.listen`), each with a
tag, so that a run gives each of its server processes a port of its own and knows whose
a connection is. :meth:`TcpProxy.kill_in_flight` arms the proxy for one request of a
tagged connection: the request is forwarded, and its reply is held while a callback
(the run's ``kill -9`` of the tagged server) runs; if the callback killed the server,
the connection is reset (RST) instead of passing the reply, else the reply passes and
the proxy stays armed.

A fault changes only the proxy's state; the target is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from agentrooms.reliability.servers import free_port

__all__ = ["Blackhole", "Delay", "Drop", "Reset", "ResetInFlight", "TcpProxy"]

CHUNK = 65536
CONNECT_TIMEOUT = 5.0
T = TypeVar("T")


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's side and (unless blackholed) the target's."""

    client: asyncio.StreamWriter
    target: asyncio.StreamWriter | None = None
    blackholed: bool = False
    lost: bool = False  # some of the client's bytes were dropped: it never forwards again
    cut: bool = False  # a request went through in flight: its reply resets the link
    tag: int | None = None  # which listener accepted it (None: the proxy's own port)
    doomed: bool = False  # a request went through armed: its reply waits for the killer


def _rst(writer: asyncio.StreamWriter | None) -> None:
    """Close with a TCP RST: ``SO_LINGER`` on, 0 s, then abort."""
    if writer is None or writer.transport.is_closing():
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class TcpProxy:
    """A proxy on ``127.0.0.1:port`` to ``target``. :meth:`start` before use,
    :meth:`stop` after (idempotent). Counters: ``accepted`` connections, ``resets``
    sent, ``dropped`` bytes, ``cut`` replies (connections reset with a request in
    flight), ``killed`` (replies held while the killer killed their server)."""

    def __init__(self, target: tuple[str, int], port: int | None = None) -> None:
        self.target = target
        self.port = port or free_port()
        self.delay = 0.0
        self.dropping = False
        self.resetting = False
        self.blackholing = False
        self.cutting = False
        self._healed = asyncio.Event()  # set while no blackhole holds the bytes back
        self._healed.set()
        self.accepted = self.resets = self.dropped = self.cut = self.killed = 0
        self.killer: Callable[[int], Awaitable[bool]] | None = None
        self._listeners: list[asyncio.Server] = []
        self._links: set[_Link] = set()
        self._pumps: set[asyncio.Task[None]] = set()  # every pump running, for stop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def start(self) -> None:
        """Start the proxy's thread and wait until it listens (``OSError`` if it cannot)."""
        assert self._thread is None, "already started"
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._accept, "127.0.0.1", self.port)
                )
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = self._loop = None
            raise failure[0]

    def stop(self) -> None:
        """Close the listener and every connection (RST), end the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for listener in self._listeners:
            listener.close()
        self._reset_all(lambda link: True)
        pumps = list(self._pumps)
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the proxy's loop and await its result from the caller's."""
        assert self._loop is not None, "not started"
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def listen(self, tag: int) -> int:
        """Listen on one more free port too, whose connections are tagged ``tag``
        (forwarded to the same target, under the same faults); the port."""
        port = free_port()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._accept(reader, writer, tag)

        async def start() -> None:
            self._listeners.append(await asyncio.start_server(accept, "127.0.0.1", port))

        await self.run(start())
        return port

    async def kill_in_flight(self, killer: Callable[[int], Awaitable[bool]] | None) -> None:
        """Arm (``killer``) or disarm (``None``). Armed, each request of a tagged
        connection is forwarded and marks it; its reply waits for ``killer(tag)``, an
        awaitable on the proxy's loop (the caller's ``kill -9`` of that server, which
        says whether it killed). Killed: the connection is reset (RST) instead of
        passing the reply, and the proxy disarms; not killed: the reply passes."""

        async def arm() -> None:
            self.killer = killer
            if killer is None:
                for link in self._links:
                    link.doomed = False

        await self.run(arm())

    # ------------------------------------------------------------ on the proxy's loop

    def _reset_all(self, which: Any) -> int:
        count = 0
        for link in list(self._links):
            if which(link):
                _rst(link.client)
                _rst(link.target)
                self._links.discard(link)
                count += 1
        self.resets += count
        return count

    async def _accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tag: int | None = None
    ) -> None:
        self.accepted += 1
        if self.resetting:
            self.resets += 1
            _rst(writer)
            return
        link = _Link(writer, tag=tag)
        self._links.add(link)
        if self.blackholing:
            link.blackholed = True
            await self._start(self._pump(reader, None, link, upstream=True))
            return
        try:
            target_reader, target = await asyncio.wait_for(
                asyncio.open_connection(*self.target), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            self._links.discard(link)
            _rst(writer)
            return
        link.target = target
        if link not in self._links:  # reset while it connected
            _rst(target)
            return
        self._start(self._pump(reader, target, link, upstream=True))
        self._start(self._pump(target_reader, writer, link, upstream=False))

    def _start(self, pump: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``pump`` as a task that :meth:`stop` cancels if it is still running."""
        task = asyncio.get_running_loop().create_task(pump)
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)
        return task

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter | None,
        link: _Link,
        *,
        upstream: bool,
    ) -> None:
        try:
            while data := await source.read(CHUNK):
                if upstream and (self.dropping or link.lost):
                    link.lost = True  # what follows a hole in the stream must not arrive
                if sink is None or link.lost:
                    self.dropped += len(data)
                    continue
                # a partition holds the stream back, never cuts a hole in it: a stream
                # that went on past lost bytes would read replies as other commands'
                await self._healed.wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
                if upstream and self.cutting:
                    link.cut = True  # marked before the request leaves: its reply is cut
                elif not upstream and link.cut:
                    self.cut += 1
                    self._reset_all(lambda other: other is link)
                    return
                if upstream and self.killer is not None and link.tag is not None:
                    link.doomed = True
                elif not upstream and link.doomed:
                    link.doomed = False
                    if await self._kill(link):
                        return
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if link in self._links:  # one side ended: end the other (a plain close)
                self._links.discard(link)
                for w in (link.client, link.target):
                    if w is not None and not w.transport.is_closing():
                        w.close()

    async def _kill(self, link: _Link) -> bool:
        """The killer's verdict on ``link``'s server (its reply held meanwhile); if it
        killed, the link is reset and the proxy disarmed."""
        killer = self.killer
        if killer is None or link.tag is None or not await killer(link.tag):
            return False
        self.killer = None
        self.killed += 1
        self._reset_all(lambda other: other is link)
        return True


class _ProxyFault:
    """A mode of a :class:`TcpProxy` as a fault; ``faults`` logs each inject and heal."""

    name = "proxy"

    def __init__(self, proxy: TcpProxy, log: list[tuple[int, str]] | None = None) -> None:
        self.proxy = proxy
        self.faults: list[tuple[int, str]] = [] if log is None else log
        self.injected = False

    def _note(self, what: str) -> None:
        self.faults.append((time.monotonic_ns(), f"{self.name} {what}"))

    async def inject(self) -> None:
        await self.proxy.run(self._set(True))
        self.injected = True
        self._note("inject")

    async def heal(self) -> None:
        await self.proxy.run(self._set(False))
        self.injected = False
        self._note("heal")

    async def _set(self, on: bool) -> None:
        raise NotImplementedError


class Delay(_ProxyFault):
    """Every chunk waits ``seconds`` more, both ways."""

    def __init__(
        self, proxy: TcpProxy, seconds: float, log: list[tuple[int, str]] | None = None
    ) -> None:
        super().__init__(proxy, log)
        self.seconds = seconds
        self.name = f"proxy delay {seconds:g}s"

    async def _set(self, on: bool) -> None:
        self.proxy.delay = self.seconds if on else 0.0


class Drop(_ProxyFault):
    """The client's bytes are discarded; connections stay open. A connection that lost
    bytes forwards nothing more, and the heal resets it: a TCP stream cannot go on past
    a hole (it would deliver the rest as if nothing were missing, and a server would
    read the next command as the end of the cut one, answering out of step)."""

    name = "proxy drop"

    async def _set(self, on: bool) -> None:
        self.proxy.dropping = on
        if not on:
            self.proxy._reset_all(lambda link: link.lost)


class Reset(_ProxyFault):
    """Every connection reset (RST) now, and every new one while injected."""

    name = "proxy reset"

    async def _set(self, on: bool) -> None:
        self.proxy.resetting = on
        if on:
            self.proxy._reset_all(lambda link: True)


class Blackhole(_ProxyFault):
    """Nothing forwarded; open connections' bytes held until the heal, new connections
    accepted and never answered. The heal resets the connections accepted meanwhile."""

    name = "proxy blackhole"

    async def _set(self, on: bool) -> None:
        self.proxy.blackholing = on
        if on:
            self.proxy._healed.clear()
        else:
            self.proxy._reset_all(lambda link: link.blackholed)
            self.proxy._healed.set()


class ResetInFlight(_ProxyFault):
    """A request in flight: each request sent while injected reaches the target, and its
    connection is reset (RST) instead of forwarding the reply, so the caller cannot know
    whether it took effect (``TcpProxy.cut`` counts them)."""

    name = "proxy reset in flight"

    async def _set(self, on: bool) -> None:
        self.proxy.cutting = on
