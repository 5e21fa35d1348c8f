"""One request to the HTTP API: the bearer token, retries of unknown outcomes, and the
error envelope turned back into the library's own error.

Retries. A call is retried (``retries`` times, with a growing pause) when its outcome
is unknown or the server says nothing was done: the connection failed or was reset, the
response timed out, ``503 store_unavailable`` (the server's ``Retry-After``), or
``429 rate_limited`` (its ``Retry-After``, when that fits the retry budget). A retry is
only sent when it is safe:

* ``keyed`` commands carry an ``Idempotency-Key`` made once per call, and every retry
  sends the same one, so the server applies the command once and answers a retry with
  the first delivery's outcome (docs/idempotency.md);
* ``idempotent`` requests (reads, heartbeats, an ack, a lock extend) are the same
  request again;
* anything else is retried only when it never left this process (the connection could
  not be made), and otherwise raises ``StoreUnavailable`` saying its outcome is unknown.

Errors. The envelope ``{"error": {"type", "message", "details"}}`` is raised as the
:mod:`agentrooms.errors` class whose ``code`` is ``type``, with its fields set from
``details`` (``VersionConflict.conflicts``, ``StaleFence.fence``, ``Held.holder``...) and
the server's message. A code the library does not define is a :class:`RemoteError`
(a ``RequestError`` for a 4xx status, else a plain ``AgentroomsError``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx

from agentrooms import errors
from agentrooms.errors import AgentroomsError, RateLimited, RequestError, StoreUnavailable

__all__ = ["Http", "RemoteError", "error_from"]

Safety = Literal["keyed", "idempotent", "once"]
RETRIES = 4
BACKOFF = 0.05  # seconds before the first retry; doubled for each one after
MAX_PAUSE = 2.0  # longest pause between two tries (a Retry-After above it is not waited)


class RemoteError(AgentroomsError):
    """An error the server answered with a code the library has no class for
    (``remote_code``, e.g. ``precondition_required``), with its HTTP ``status``."""

    def __init__(self, remote_code: str, status: int, message: str) -> None:
        self.remote_code, self.status = remote_code, status
        super().__init__(message)


class RemoteRequestError(RemoteError, RequestError):
    """A 4xx :class:`RemoteError`: the call itself is wrong."""


def _classes() -> dict[str, type[AgentroomsError]]:
    found: dict[str, type[AgentroomsError]] = {}
    pending: list[type[AgentroomsError]] = [AgentroomsError]
    while pending:
        kind = pending.pop()
        if kind.__module__ == errors.__name__:
            found.setdefault(kind.code, kind)
        pending += kind.__subclasses__()
    return found


# the attributes each error class carries, from the envelope's details
_FIELDS: dict[str, tuple[tuple[str, str, Any], ...]] = {
    "version_conflict": (("conflicts", "conflicts", {}),),
    "stale_fence": (("key", "key", ""), ("fence", "fence", 0), ("current", "current", None)),
    "contention_exhausted": (
        ("attempts", "attempts", 0),
        ("elapsed", "elapsed", 0.0),
        ("keys", "keys", []),
    ),
    "held": (("name", "name", ""), ("holder", "holder", None)),
    "lease_held": (("name", "name", ""), ("holder", "holder", None)),
    "lock_held": (("name", "name", ""), ("holder", "holder", None)),
    "rate_limited": (("retry_after", "retry_after", 1.0),),
    "clock_skew": (("offset", "clock_offset", 0.0), ("tolerance", "clock_tolerance", 0.0)),
    "cursor_compacted": (
        ("room", "room", ""),
        ("after", "after", 0),
        ("first_available", "first_available", 0),
    ),
}


def error_from(status: int, body: Any, room: str | None = None) -> AgentroomsError:
    """The library error an error response stands for (see the module's docstring)."""
    error = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(error, Mapping) or not isinstance(error.get("type"), str):
        text = f"HTTP {status} without an error envelope"
        if status >= 500:
            return StoreUnavailable(text)
        return RemoteRequestError(f"http_{status}", status, text)
    code: str = error["type"]
    message = str(error.get("message", ""))
    details = error.get("details")
    details = details if isinstance(details, Mapping) else {}
    kind = _classes().get(code)
    if kind is None:
        if 400 <= status < 500:
            return RemoteRequestError(code, status, message)
        return RemoteError(code, status, message)
    exc = kind.__new__(kind)
    Exception.__init__(exc, message)
    for attribute, field, default in _FIELDS.get(code, ()):
        setattr(exc, attribute, details.get(field, default))
    if code == "cursor_compacted" and not details.get("room"):
        exc.room = room or ""  # type: ignore[attr-defined]
    return exc


def _pause(attempt: int) -> float:
    return float(min(BACKOFF * 2**attempt, MAX_PAUSE))


class Http:
    """The HTTP API at ``base_url`` (``http://host:port``; ``/v1`` is added) with a
    bearer ``token`` (``None``: a server in dev mode). One connection pool; close it with
    :meth:`close`."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        retries: int = RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.timeout = timeout
        self._client = httpx.AsyncClient(
            base_url=f"{self.base_url}/v1",
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            transport=transport,
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def call(
        self,
        method: str,
        path: str,
        *,
        safety: Safety,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> httpx.Response:
        """Send the request (retried as the module says) and return a 2xx or 304
        response; an error response raises its library error."""
        sent = dict(headers or {})
        if safety == "keyed":
            sent["Idempotency-Key"] = uuid.uuid4().hex  # one per call, reused by its retries
        query = {k: v for k, v in (params or {}).items() if v is not None}
        content = None if body is None else json.dumps(body, allow_nan=False).encode()
        if content is not None:
            sent["Content-Type"] = "application/json"
        timeout = None
        if read_timeout is not None:
            timeout = httpx.Timeout(self.timeout, read=read_timeout, connect=10.0)
        attempt = 0
        while True:
            try:
                response = await self._client.request(
                    method,
                    path,
                    content=content,
                    params=query,
                    headers=sent,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError as exc:
                never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if attempt < self.retries and (safety != "once" or never_sent):
                    await asyncio.sleep(_pause(attempt))
                    attempt += 1
                    continue
                raise StoreUnavailable(
                    f"{method} {path}: {type(exc).__name__}: {exc or 'no answer'}"
                    + ("" if never_sent else "; the outcome is unknown")
                ) from exc
            if response.status_code < 400 or response.status_code == 304:
                return response
            error = error_from(response.status_code, _json(response))
            wait = _retry_wait(error, attempt, safety)
            if wait is not None and attempt < self.retries:
                await asyncio.sleep(wait)
                attempt += 1
                continue
            raise error

    async def json(
        self,
        method: str,
        path: str,
        *,
        safety: Safety,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> Any:
        """:meth:`call`, and the response's JSON body (``None`` for an empty one)."""
        response = await self.call(
            method,
            path,
            safety=safety,
            body=body,
            params=params,
            headers=headers,
            read_timeout=read_timeout,
        )
        return _json(response)

    @asynccontextmanager
    async def stream(
        self, path: str, params: Mapping[str, Any], headers: Mapping[str, str], read: float
    ) -> AsyncIterator[httpx.Response]:
        """A streaming GET (Server-Sent Events); an error response raises its error.
        Not retried: a stream's reader resumes with ``Last-Event-ID`` itself."""
        query = {k: v for k, v in params.items() if v is not None}
        timeout = httpx.Timeout(self.timeout, read=read, connect=10.0)
        try:
            async with self._client.stream(
                "GET", path, params=query, headers=dict(headers), timeout=timeout
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_from(response.status_code, _json(response))
                yield response
        except httpx.TransportError as exc:
            raise StoreUnavailable(f"GET {path}: {type(exc).__name__}: {exc}") from exc


def _json(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _retry_wait(error: AgentroomsError, attempt: int, safety: Safety) -> float | None:
    """Seconds to wait before retrying after ``error``, ``None`` if it is not retried.
    A rate limit did nothing, so any call retries; a store failure may have left a write
    done, so only a keyed or idempotent call retries."""
    if isinstance(error, errors.ClockSkew):
        return None  # retrying does not fix a clock
    if isinstance(error, StoreUnavailable):
        return None if safety == "once" else _pause(attempt)
    if isinstance(error, RateLimited) and error.retry_after <= MAX_PAUSE:
        return max(error.retry_after, _pause(attempt))
    return None
