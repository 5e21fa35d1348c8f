"""The hot path's connection to Redis: commands written as they come, replies parsed by
hiredis and handed back in order.

Why not redis-py's asyncio connection: docs/why.md ("The Redis client of the hot path").

A :class:`Wire` is one connection (TCP, or TLS over TCP) that carries any number of
commands at once. :meth:`Wire.call` writes its command at once, without waiting for the
replies to earlier ones (Redis answers one connection's commands in the order they came),
and returns a future that :meth:`Wire.data_received` settles with the reply when its turn
comes. So concurrent callers pipeline without a pool: one connection, and one read per
burst of replies. A command sent while others are in flight waits for the end of the
event loop's turn, and goes in one write with every other command sent in that turn. A
command sent alone is written at once.

* An error reply settles only its own caller's future, with ``ResponseError``
  (``NoScriptError`` for an unknown script), as redis-py's would.
* A caller that stops waiting (it was cancelled) leaves its future cancelled; the reply
  is still read when it comes, and dropped, so the connection stays in step.
* If the connection fails or is closed, every future still waiting fails with
  ``ConnectionError``: those commands' outcomes are unknown. A wire never reconnects;
  its owner dials a new one (:func:`dial`).
* A wire given a ``deadline`` closes itself (as above) when a reply is that many seconds
  late: a connection that stopped answering is dropped rather than waited on (one timer
  per wire, re-armed from the oldest command still waiting).

The connection is set up from the same URL options as redis-py's (host and port, TLS from
``rediss://`` and its ``ssl_*`` parameters, username and password, database number,
client name), by reading them off a redis-py connection object that is built but never
connected. It speaks RESP2.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis
from redis.asyncio.connection import AbstractConnection, SSLConnection
from redis.exceptions import NoScriptError, ResponseError

from agentrooms.errors import BadRequest, StoreUnavailable
from agentrooms.store.base import settle

__all__ = ["Arg", "Wire", "dial", "pack_command", "pack_evalsha"]

Arg = str | int | bytes


# hiredis's packer; its stub types the tuple as holding one argument, not any number
_pack = cast("Callable[[tuple[Arg, ...]], bytes]", hiredis.pack_command)


def pack_evalsha(sha: str, keys: Sequence[Arg], args: Sequence[Arg]) -> list[bytes]:
    """``EVALSHA sha numkeys *keys *args`` as a RESP array of bulk strings: the bytes
    redis-py's ``pack_command`` makes, made by hiredis's packer."""
    return [_pack(("EVALSHA", sha, len(keys), *keys, *args))]


def pack_command(*args: Arg) -> list[bytes]:
    """Any command as a RESP array of bulk strings (as :func:`pack_evalsha`)."""
    return [_pack(args)]


class Wire(asyncio.Protocol):
    """One pipelined connection (see the module's docstring)."""

    def __init__(self, deadline: float | None = None) -> None:
        self._parser = hiredis.Reader(replyError=ResponseError)
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self.deadline = deadline  # seconds a reply may take (None: as long as it takes)
        self._sent: deque[float] = deque()  # loop time each waiting command was sent
        self._watchdog: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.error: ConnectionError | None = None  # why the connection ended, once it has
        self._outbox: list[bytes] = []  # commands to write at the end of this turn
        self.writes = 0  # writes to the socket so far

    @property
    def usable(self) -> bool:
        """Connected, and neither failed nor closing: a command sent now is written."""
        return self.error is None and self._transport is not None

    @property
    def pending(self) -> int:
        """Commands written whose replies have not come yet (cancelled callers' too)."""
        return len(self._waiting)

    def call(self, command: Sequence[bytes]) -> asyncio.Future[Any]:
        """Write ``command`` (its RESP parts) now; the future gets its reply."""
        return self.send(command, 1)[0]

    def send(self, commands: Sequence[bytes], replies: int) -> list[asyncio.Future[Any]]:
        """Write ``commands`` (the RESP parts of ``replies`` commands, in order) in one
        write now; the futures get their replies, in the same order."""
        if self.error is not None:
            raise self.error
        if self._transport is None:
            raise ConnectionError("redis: the connection is not open yet")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(replies)]
        self._waiting.extend(futures)
        if self.deadline is not None:
            now = loop.time()
            self._sent.extend([now] * replies)
            if self._watchdog is None:
                self._watchdog = loop.call_at(now + self.deadline, self._watch)
        if self._outbox:  # a flush is due this turn: go with it, in order
            self._outbox += commands
        elif len(self._waiting) == replies:  # nothing else in flight: no reason to wait
            self._write(b"".join(commands))
        else:
            self._outbox += commands
            loop.call_soon(self._flush)
        return futures

    def _watch(self) -> None:
        """The deadline timer: close the wire if its oldest waiting reply is late, else
        look again when that one's deadline comes (or stop: nothing waits)."""
        self._watchdog = None
        if not self._sent or self.deadline is None:
            return
        loop = asyncio.get_running_loop()
        due = self._sent[0] + self.deadline
        if loop.time() >= due:
            self.close(
                f"gave no reply within {self.deadline:g} s (the URL's timeout): the "
                "outcome of each command still waiting is unknown"
            )
        else:
            self._watchdog = loop.call_at(due, self._watch)

    def _flush(self) -> None:
        data = b"".join(self._outbox)
        self._outbox.clear()
        if self.error is None:  # else every future waiting has failed already
            self._write(data)

    def _write(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)
        self.writes += 1

    def close(self, why: str = "closed by its owner") -> None:
        """Close the connection; the commands still waiting fail (outcome unknown)."""
        self._end(ConnectionError(f"redis: connection {why}"))
        if self._transport is not None:
            self._transport.abort()  # nothing buffered is worth sending to a closed wire

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        while self._waiting:
            try:
                reply = self._parser.gets()
            except hiredis.ProtocolError as exc:
                self.close(f"failed: the server's reply is not RESP ({exc})")
                return
            if reply is False:  # the rest of a reply is still to come
                return
            if isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT"):
                reply = NoScriptError(str(reply))
            # a caller that gave up has its reply dropped: the wire stays in step
            settle(self._waiting.popleft(), reply)
            if self._sent:
                self._sent.popleft()
        if self._parser.has_data():  # RESP2 never sends unasked
            self.close("failed: the server sent a reply nobody asked for")

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(ConnectionError(f"redis: connection lost: {exc or 'closed by the server'}"))
        self._transport = None
        if not self._closed.done():
            self._closed.set_result(None)

    def _end(self, error: ConnectionError) -> None:
        if self.error is None:
            self.error = error
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._sent.clear()
        while self._waiting:
            settle(self._waiting.popleft(), self.error)


async def dial(options: AbstractConnection, deadline: float | None = None) -> Wire:
    """A connected :class:`Wire` to where ``options`` (a redis-py connection object,
    built from the URL but never connected) points, authenticated, on its database,
    having answered a ``PING``; its replies due within ``deadline`` seconds. Bound this
    call by a deadline too: dialling does no timing of its own."""
    loop = asyncio.get_running_loop()
    ssl = options.ssl_context.get() if isinstance(options, SSLConnection) else None
    host: str = getattr(options, "host", "localhost")
    port: int = getattr(options, "port", 6379)
    _, wire = await loop.create_connection(lambda: Wire(deadline), host, port, ssl=ssl)
    try:
        setup: list[list[bytes]] = []
        if options.password is not None:
            if options.username:
                setup.append(pack_command("AUTH", options.username, options.password))
            else:
                setup.append(pack_command("AUTH", options.password))
        if options.db:
            setup.append(pack_command("SELECT", options.db))
        if options.client_name:
            setup.append(pack_command("CLIENT", "SETNAME", options.client_name))
        setup.append(pack_command("PING"))  # connected means answering, not just accepted
        replies = await asyncio.gather(
            *(wire.call(command) for command in setup), return_exceptions=True
        )
        for reply in replies:
            if isinstance(reply, BaseException):  # a wrong password, a bad database
                raise reply
    except BaseException:
        wire.close("failed while being set up")
        raise
    return wire


def unavailable(exc: BaseException) -> StoreUnavailable | BadRequest:
    """A redis-py or connection error as the store reports it: ``BadRequest`` for a
    Redis Cluster redirection (the URL names a cluster node), else ``StoreUnavailable``."""
    if isinstance(exc, ResponseError) and str(exc).startswith(("MOVED ", "ASK ")):
        return BadRequest(
            f"redis: this server is a Redis Cluster node ({exc}): open the store with a "
            "redis+cluster://host:port,host:port/ URL (cluster mode); nothing was done"
        )
    return StoreUnavailable(f"redis: {type(exc).__name__}: {exc}")
