"""The HTTP/1.1 connection :func:`agentrooms.server.serve` runs: uvicorn's h11 protocol
with the limits a hostile client would otherwise exhaust a process through.

* the request line and headers over ``max_header_bytes``: ``431`` (the error envelope),
  and the connection closed; a request h11 cannot parse: ``400``;
* the request line and headers not complete within ``header_timeout`` seconds of the
  connection opening, or of the previous response: ``408``, and the connection closed
  (also when the client is still sending the body of a request answered early, e.g. a
  ``401``);
* a connection closed while its client may still be sending (a ``413`` or ``408``
  answered before the body was read, a ``431``) lingers: the server ends its side after
  the answer and reads and discards what still arrives, for at most
  :data:`LINGER_SECONDS` and :data:`LINGER_BYTES`, so the client reads its answer
  instead of a connection reset. Other closes are immediate.

The body deadline and the body size are the gate's (:mod:`.gate`), which hold under any
ASGI server; only what happens before a request exists, and after it is answered, is
here.
"""

from __future__ import annotations

import asyncio
import http
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from agentrooms.server.envelope import envelope
from agentrooms.server.limits import HttpLimits

__all__ = ["LINGER_BYTES", "LINGER_SECONDS", "protocol_for"]

LINGER_SECONDS = 2.0
LINGER_BYTES = 16 * 1024 * 1024
_UNFINISHED = (h11.SEND_BODY, h11.ERROR)  # their states in which they may still be sending


class _Connection(h11.Connection):
    """An h11 connection that remembers the last error it raised on incoming data."""

    error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.error = exc
            raise


class _Transport(asyncio.Transport):
    """The real transport, except that ``close`` asks the protocol (which may linger)."""

    def __init__(self, inner: asyncio.Transport, protocol: GuardedH11) -> None:
        super().__init__()
        self.inner, self.protocol = inner, protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self.inner.is_closing() or self.protocol.lingering

    def close(self) -> None:
        self.protocol.close()

    def write(self, data: bytes | bytearray | memoryview[Any]) -> None:
        self.inner.write(data)

    def write_eof(self) -> None:
        self.inner.write_eof()

    def can_write_eof(self) -> bool:
        return self.inner.can_write_eof()

    def abort(self) -> None:
        self.inner.abort()

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    def is_reading(self) -> bool:
        return self.inner.is_reading()

    def get_write_buffer_size(self) -> int:
        return self.inner.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.inner.set_write_buffer_limits(high, low)


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a header deadline, a header-size answer in the error
    envelope, and lingering closes (see the module). ``limits`` is set by
    :func:`protocol_for`."""

    limits = HttpLimits()

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.conn = self.guarded = _Connection(
            h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes
        )
        self.lingering = False
        self._lost = False
        self._raw: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._armed_for: object = None  # the request cycle current when the deadline was set
        self._discarded = 0

    # -- connection ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._raw = transport
        super().connection_made(_Transport(transport, self))
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self._discarded += len(data)
            if self._discarded > LINGER_BYTES and self._raw is not None:
                self._raw.close()
            return
        super().data_received(data)
        if self.cycle is not self._armed_for:
            self._disarm()  # a new request's line and headers are in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's headers have their own deadline

    # -- closing ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection, lingering if the client may still be sending."""
        raw = self._raw
        if raw is None or self.lingering:
            return
        self._disarm()
        if self._lost or self.conn.their_state not in _UNFINISHED or not raw.can_write_eof():
            raw.close()
            return
        self.lingering = True
        raw.write_eof()  # the answer, then our FIN; the client may go on sending
        raw.resume_reading()
        self.loop.call_later(LINGER_SECONDS, raw.close)

    def send_400_response(self, msg: str) -> None:
        error = self.guarded.error
        if error is not None and error.error_status_hint == 431:
            response = envelope(
                431,
                "headers_too_large",
                f"the request line and headers are over the {self.limits.max_header_bytes}-"
                "byte limit",
            )
        else:
            detail = f": {error}" if error is not None else ""
            response = envelope(400, "bad_request", f"invalid HTTP request{detail}")
        headers = [*response.raw_headers, (b"connection", b"close")]
        status = response.status_code
        try:
            for event in (
                h11.Response(status_code=status, headers=headers, reason=_phrase(status)),
                h11.Data(data=bytes(response.body)),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event) or b"")
        except h11.LocalProtocolError:
            pass  # a response was already under way: nothing more can be said
        self.transport.close()

    # -- the header deadline ---------------------------------------------------------

    def _arm(self) -> None:
        self._disarm()
        self._armed_for = self.cycle
        self._deadline = self.loop.call_later(self.limits.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self._raw is None or self.lingering:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is still being sent (pipelined bytes wait for it)
        if self.conn.their_state is not h11.IDLE:
            # answered early, but the client is still sending that request's body
            self._raw.close()
            return
        response = envelope(
            408,
            "request_timeout",
            f"the request line and headers did not arrive within {self.limits.header_timeout:g}s",
        )
        head = [b"HTTP/1.1 408 " + _phrase(408)]
        head += [name + b": " + value for name, value in response.raw_headers]
        head += [b"connection: close", b"", b""]
        self._raw.write(b"\r\n".join(head) + bytes(response.body))
        self._raw.close()


def _phrase(status: int) -> bytes:
    return http.HTTPStatus(status).phrase.encode()


def protocol_for(limits: HttpLimits) -> type[GuardedH11]:
    """The protocol class for uvicorn's ``http`` setting, enforcing ``limits``."""
    return type("GuardedH11", (GuardedH11,), {"limits": limits})
