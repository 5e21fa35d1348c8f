"""Limits the HTTP surface enforces before a request reaches the store.

* body size: ``413`` from the ``Content-Length`` header before a byte is read, and by
  counting the bytes of a chunked (or lying) body, stopping at the first byte over;
* JSON shape: nesting depth, the size of every string (keys included) and the number of
  items in every array or object; NaN, infinities and lone surrogates are refused: ``400``;
* tasks per batch: ``400``;
* a token bucket per agent: ``429`` with ``Retry-After`` (counted as ``rate_limited``);
* open event streams (SSE) and MCP listen streams per agent: ``429`` past the cap;
* open operator change streams (the ``/ui`` dashboard's, ``ops:read``) per agent: a pool
  of their own (``max_dashboard_streams``), so dashboards never take the slots of the
  agent's own streams; ``429`` past it, for the stream and for its ticket;
* waits the server does for a caller (lock queue, event stream) are clamped.

All of it is plain code over plain values (the gate in :mod:`.gate` applies it). The
limits against a hostile client (``max_header_bytes``, ``header_timeout``,
``body_timeout``, ``max_connections``, ``auth_failures`` / ``auth_failure_rate``) are
applied by what :func:`agentrooms.server.serve` adds: its HTTP protocol (:mod:`.protocol`)
and the perimeter (:mod:`.perimeter`).
"""

from __future__ import annotations

import collections
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrooms.errors import BadRequest

__all__ = ["HttpLimits", "RateLimiter", "StreamSlots", "parse_json"]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Per-request limits and the per-agent rate (``rate=None`` turns rate limiting off,
    ``auth_failures=None`` the per-address limit of failed authentications)."""

    max_body_bytes: int = 1024 * 1024
    max_json_depth: int = 32
    max_string_bytes: int = 256 * 1024
    max_items: int = 10_000  # items of one JSON array or members of one object
    max_batch: int = 1000  # tasks added in one request
    max_result_bytes: int = 64 * 1024  # JSON of one MCP tool result: lists shorten, values cut
    rate: float | None = 50.0  # requests per second per agent, refilled continuously
    burst: int = 100  # bucket size: requests an idle agent may send at once
    max_stream_seconds: float = 300.0  # an event stream ends after this; clients resume
    keepalive_seconds: float = 15.0  # comment line on an idle event stream
    max_lock_wait: float = 30.0  # longest queue wait of one lock acquire request
    max_wait: float = 30.0  # longest wait of one claim or read of new events (at most 30)
    max_header_bytes: int = 32 * 1024  # request line and headers together: 431 past it
    header_timeout: float = 10.0  # seconds to send the request line and headers: 408
    body_timeout: float = 30.0  # seconds to send the body once the headers are in: 408
    max_connections: int | None = 1000  # open connections of the process: 503 past it
    max_streams_per_agent: int = 8  # open SSE streams, and MCP listen streams, per agent
    max_dashboard_streams: int = 16  # open operator change streams (/ui) per agent, apart
    auth_failures: int | None = 20  # failed authentications of an address at once (None: off)
    auth_failure_rate: float = 1.0  # per second, refilling that address's allowance

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_json_depth",
            "max_string_bytes",
            "max_items",
            "max_header_bytes",
            "max_streams_per_agent",
            "max_dashboard_streams",
            "max_result_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.rate is not None and (self.rate <= 0 or self.burst < 1):
            raise ValueError("rate must be positive and burst at least 1")
        for name in ("header_timeout", "body_timeout", "auth_failure_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        for name in ("max_connections", "auth_failures"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (or None)")


class RateLimiter:
    """Token buckets keyed by agent: ``burst`` requests at once, ``rate`` per second
    after that. Holds at most ``max_agents`` buckets (least recently used dropped: a
    dropped bucket comes back full, which only ever favours an idle agent)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_agents: int = 100_000,
    ) -> None:
        self.rate, self.burst, self._clock, self._max = rate, float(burst), clock, max_agents
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def take(self, agent: str) -> float:
        """Spend one token of ``agent``'s bucket: 0.0 if there was one, else the seconds
        until there will be (nothing is spent then)."""
        now = self._clock()
        tokens, last = self._buckets.pop(agent, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[agent] = (tokens, now)
        if len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return wait

    def peek(self, agent: str) -> float:
        """The seconds until ``agent``'s bucket holds a token (0.0: it does); spends
        nothing."""
        stored = self._buckets.get(agent)
        if stored is None:
            return 0.0
        tokens, last = stored
        tokens = min(self.burst, tokens + (self._clock() - last) * self.rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate


class StreamSlots:
    """Counts the open streams of each agent against a cap. :meth:`take` claims a slot
    (``False`` when the agent already holds ``cap``), :meth:`give` returns it; one event
    loop, so no lock is needed."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._open: collections.Counter[str] = collections.Counter()

    def take(self, agent: str) -> bool:
        if self._open[agent] >= self.cap:
            return False
        self._open[agent] += 1
        return True

    def give(self, agent: str) -> None:
        self._open[agent] -= 1
        if self._open[agent] <= 0:
            del self._open[agent]

    def held(self, agent: str) -> int:
        return self._open[agent]


def _no_constant(name: str) -> Any:
    raise BadRequest(f"JSON does not allow {name}")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequest(f"number {text[:40]} is out of range")
    return value


def parse_json(body: bytes, limits: HttpLimits) -> Any:
    """Parse a request body and check its shape; ``BadRequest`` naming the first
    violation."""
    try:
        value = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError as exc:
        raise BadRequest(f"JSON nested deeper than {limits.max_json_depth} levels") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digits limit
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc
    _check_shape(value, limits)
    return value


def _check_string(text: str, limits: HttpLimits) -> None:
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        raise BadRequest("a JSON string holds a lone surrogate (not valid Unicode)") from exc
    if size > limits.max_string_bytes:
        raise BadRequest(f"a JSON string of {size} bytes is over {limits.max_string_bytes}")


def _check_shape(value: Any, limits: HttpLimits) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_string(item, limits)
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 2**63:
            raise BadRequest("a JSON integer is out of the 64-bit range")
        elif isinstance(item, list | dict):
            if depth > limits.max_json_depth:
                raise BadRequest(f"JSON nested deeper than {limits.max_json_depth} levels")
            if len(item) > limits.max_items:
                raise BadRequest(f"a JSON array or object has over {limits.max_items} items")
            if isinstance(item, dict):
                for key in item:
                    _check_string(key, limits)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
