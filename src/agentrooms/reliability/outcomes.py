"""What an answer means to a recording client of the HTTP API or of MCP: acknowledged,
unknown, or failed (the one place these rules are written; the recorder's surfaces and
the property workers both use them).

HTTP (:class:`HttpRequests`), each request to a random server of several: a request
that was never sent (connection refused or its connect timed out: a killed server) is
sent to another one until ``timeout``; a 429 is waited out (its ``Retry-After``, at
most a second) and sent again; a request sent whose answer never came (the connection
reset, a read timeout: a killed or stopped server) or a 503 is an *unknown outcome*
(:class:`UnknownOutcome`); any other 5xx is a bug (``RuntimeError``). Every answer
below 500 is returned for the caller to read: the acknowledged outcome, or a typed
failure. Each such event is counted in :attr:`HttpRequests.reports` by how the caller
saw it.

A typed failure of a holder's call (the HTTP error envelope or an MCP tool error, the
same ``{"type", "message", "details"}``) becomes the library's exception with
:func:`refusal`: ``stale_fence`` is ``StaleFence`` (with the current fence),
``invalid_transition`` is ``InvalidTransition``.

This module imports no MCP SDK (a second of start-up for every worker process that
does not need it).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx2

from agentrooms.errors import InvalidTransition, StaleFence
from agentrooms.rooms import keys

__all__ = ["HttpRequests", "UnknownOutcome", "refusal", "unexpected"]


class UnknownOutcome(ConnectionError):
    """The request was sent and its answer never came, or was a 503: it may or may not
    have taken effect. ``seen``: how the caller saw it (a key of the surface's
    ``reports``)."""

    def __init__(self, message: str, seen: str) -> None:
        super().__init__(message)
        self.seen = seen


class HttpRequests:
    """Requests to random servers of ``bases`` (drawn from ``seed``); ``timeout``:
    seconds before a sent request's outcome is unknown (and how long an unsent one is
    offered to other servers). :attr:`reports` counts how failures were seen,
    :attr:`answered` the answers of each server."""

    def __init__(self, bases: Sequence[str], *, seed: int, timeout: float) -> None:
        self.bases, self.timeout = list(bases), timeout
        self.rng = random.Random(seed)
        self.http = httpx2.AsyncClient(timeout=httpx2.Timeout(timeout))
        self.reports: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()

    async def send(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        body: Any = None,
    ) -> httpx2.Response:
        """Send ``method path`` (from the server's root) by the rules above; the answer
        (status below 500, not 429). ``UnknownOutcome`` or ``RuntimeError`` as above."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            base = self.rng.choice(self.bases)
            try:
                answer = await self.http.request(
                    method, f"{base}{path}", headers=headers, json=body
                )
            except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
                # never sent: another server may take it
                seen = f"{type(exc).__name__}: not sent, sent to another server"
                self.reports[seen] += 1
                if loop.time() > deadline:
                    raise UnknownOutcome(f"no server answered {method} {path}", seen) from exc
                await asyncio.sleep(0.02)
                continue
            except httpx2.TransportError as exc:
                seen = f"{type(exc).__name__}: unknown outcome"
                self.reports[seen] += 1
                raise UnknownOutcome(f"{method} {path}: {type(exc).__name__}", seen) from exc
            self.answered[base] += 1
            if answer.status_code == 429:
                self.reports["HTTP 429: waited, sent again"] += 1
                await asyncio.sleep(min(1.0, float(answer.headers.get("Retry-After", "1"))))
                continue
            if answer.status_code == 503:
                kind = _error_type(answer)
                seen = f"HTTP 503 {kind}: unknown outcome"
                self.reports[seen] += 1
                raise UnknownOutcome(f"{method} {path}: 503 {kind}", seen)
            if answer.status_code >= 500:
                raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text}")
            return answer

    async def close(self) -> None:
        await self.http.aclose()


def _error_type(answer: httpx2.Response) -> str:
    try:
        kind = answer.json().get("error", {}).get("type", "?")
    except ValueError:
        return "?"
    return str(kind)


def unexpected(answer: httpx2.Response) -> RuntimeError:
    """The error for an answer the caller has no rule for (a bug)."""
    request = answer.request
    return RuntimeError(
        f"{request.method} {request.url}: unexpected {answer.status_code} {answer.text}"
    )


def refusal(error: dict[str, Any], task_id: str, fence: int) -> Exception | None:
    """The library's exception for a typed failure of a call made with ``fence`` on
    task ``task_id``: ``StaleFence`` or ``InvalidTransition``; ``None`` for any other
    type (the caller decides)."""
    if error.get("type") == "stale_fence":
        current = (error.get("details") or {}).get("current")
        return StaleFence(keys.task(task_id), fence, current)
    if error.get("type") == "invalid_transition":
        return InvalidTransition(str(error.get("message", "")))
    return None
