"""Every error agentrooms raises, named after what the caller does next.

The tree::

    AgentroomsError                      root; ``code`` and ``http_status`` on every kind
     ├── VersionConflict                 another valid write won: re-read, recompute, retry
     ├── StaleFence                      your fencing token is old: discard the work
     │    └── PathsLost                  your path reservation lapsed or was released
     ├── InvalidTransition               the event is not valid for the state: stop, report
     ├── ContentionExhausted             retries hit their bound: give up or requeue
     ├── IdempotencyMismatch             a command id was reused with another payload
     ├── Held                            someone else holds it: wait or pick other work
     │    ├── LeaseHeld
     │    ├── LockHeld
     │    └── PathsReserved              another reservation overlaps the paths asked for
     ├── RateLimited                     a limit declined the call: wait ``retry_after``
     ├── StoreUnavailable                transport/store failure, outcome may be unknown:
     │    │                              retry the *same* idempotent command
     │    └── ClockSkew                  this process's clock disagrees with the store's:
     │                                   fix the clock (nothing was done)
     ├── CursorCompacted                 the log was trimmed past the cursor: resync
     └── RequestError                    the call itself is wrong: fix it
          ├── BadRequest
          │    └── PayloadTooLarge
          ├── NotFound
          ├── Unauthorized
          └── Forbidden

Driver exceptions (redis-py, asyncpg, sqlite3) are translated into these at one seam per
backend, with the original chained as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "AgentroomsError",
    "BadRequest",
    "ClockSkew",
    "ContentionExhausted",
    "CursorCompacted",
    "Forbidden",
    "Held",
    "IdempotencyMismatch",
    "InvalidTransition",
    "LeaseHeld",
    "LockHeld",
    "NotFound",
    "PathsLost",
    "PathsReserved",
    "PayloadTooLarge",
    "RateLimited",
    "RequestError",
    "StaleFence",
    "StoreUnavailable",
    "Unauthorized",
    "VersionConflict",
]


class AgentroomsError(Exception):
    """Root of every agentrooms error.

    ``code`` is a stable machine-readable name (used in HTTP and MCP error bodies);
    ``http_status`` is the status the HTTP surface answers with.
    """

    code: ClassVar[str] = "error"
    http_status: ClassVar[int] = 500

    def details(self) -> dict[str, Any]:
        """Structured fields for error envelopes (JSON-serialisable)."""
        return {}


class VersionConflict(AgentroomsError):
    """A compare failed: another write won. ``conflicts`` maps each failing key to its
    current version (``None`` when the record is absent)."""

    code = "version_conflict"
    http_status = 412

    def __init__(self, conflicts: Mapping[str, int | None], message: str | None = None) -> None:
        self.conflicts: dict[str, int | None] = dict(conflicts)
        super().__init__(message or f"version conflict on {sorted(self.conflicts)!r}")

    def details(self) -> dict[str, Any]:
        return {"conflicts": self.conflicts}


class StaleFence(AgentroomsError):
    """A write carried a fencing token older than the current holder's."""

    code = "stale_fence"
    http_status = 409

    def __init__(self, key: str, fence: int, current: int | None) -> None:
        self.key, self.fence, self.current = key, fence, current
        super().__init__(f"fence {fence} on {key!r} is stale (current: {current})")

    def details(self) -> dict[str, Any]:
        return {"key": self.key, "fence": self.fence, "current": self.current}


class PathsLost(StaleFence):
    """A path reservation is no longer held (it lapsed, or was released or reclaimed):
    what was done under it is unprotected. Reserve again and check your work."""

    code = "paths_lost"

    def __init__(self, reservation: str, fence: int, message: str) -> None:
        self.reservation = reservation
        AgentroomsError.__init__(self, message)
        self.key, self.fence, self.current = f"paths/{reservation}", fence, None

    def details(self) -> dict[str, Any]:
        return {**super().details(), "reservation": self.reservation}


class InvalidTransition(AgentroomsError):
    """The event is not valid for the current state; retrying will not help."""

    code = "invalid_transition"
    http_status = 409


class ContentionExhausted(AgentroomsError):
    """The commit loop hit its attempt bound or latency budget."""

    code = "contention_exhausted"
    http_status = 409

    def __init__(self, attempts: int, elapsed: float, keys: list[str]) -> None:
        self.attempts, self.elapsed, self.keys = attempts, elapsed, keys
        super().__init__(
            f"gave up after {attempts} attempts in {elapsed:.3f}s; last conflict on {keys!r}"
        )

    def details(self) -> dict[str, Any]:
        return {"attempts": self.attempts, "elapsed": self.elapsed, "keys": self.keys}


class IdempotencyMismatch(AgentroomsError):
    """A command id was reused with a different payload."""

    code = "idempotency_mismatch"
    http_status = 422


class Held(AgentroomsError):
    """Another agent holds the lease or lock."""

    code = "held"
    http_status = 409

    def __init__(self, name: str, holder: str | None, message: str | None = None) -> None:
        self.name, self.holder = name, holder
        super().__init__(message or f"{name!r} is held by {holder!r}")

    def details(self) -> dict[str, Any]:
        return {"name": self.name, "holder": self.holder}


class LeaseHeld(Held):
    code = "lease_held"


class LockHeld(Held):
    code = "lock_held"


class PathsReserved(Held):
    """A reservation of other paths overlaps one asked for: ``name`` is the pattern asked
    for, ``holder`` the other reservation's owner, ``pattern`` its overlapping pattern,
    ``reservation`` its id and ``mode`` its mode."""

    code = "paths_reserved"

    def __init__(self, name: str, holder: str, pattern: str, reservation: str, mode: str) -> None:
        self.pattern, self.reservation, self.mode = pattern, reservation, mode
        super().__init__(
            name, holder, f"{name!r} overlaps {pattern!r}, reserved {mode} by {holder!r}"
        )

    def details(self) -> dict[str, Any]:
        return {
            **super().details(),
            "pattern": self.pattern,
            "reservation": self.reservation,
            "mode": self.mode,
        }


class RateLimited(AgentroomsError):
    """A limit declined the call. Wait ``retry_after`` seconds; do not re-read."""

    code = "rate_limited"
    http_status = 429

    def __init__(self, retry_after: float, message: str | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message or f"rate limited; retry after {retry_after:.3f}s")

    def details(self) -> dict[str, Any]:
        return {"retry_after": self.retry_after}


class StoreUnavailable(AgentroomsError):
    """The store could not be reached or failed; the outcome of a write may be unknown."""

    code = "store_unavailable"
    http_status = 503


class ClockSkew(StoreUnavailable):
    """This process's clock differs from the one clock the store judges expiry by by
    more than the stated tolerance, so the store refuses the call (it did nothing): a
    wrong clock would take live leases and locks, or write ones already expired.
    ``offset`` is seconds ahead (negative: behind); ``tolerance`` the bound."""

    code = "clock_skew"

    def __init__(self, message: str, offset: float, tolerance: float) -> None:
        self.offset, self.tolerance = offset, tolerance
        super().__init__(message)

    def details(self) -> dict[str, Any]:
        return {"clock_offset": self.offset, "clock_tolerance": self.tolerance}


class CursorCompacted(AgentroomsError):
    """The log was trimmed past the requested position; resync from a snapshot."""

    code = "cursor_compacted"
    http_status = 410

    def __init__(self, room: str, after: int, first_available: int) -> None:
        self.room, self.after, self.first_available = room, after, first_available
        super().__init__(
            f"log of room {room!r} was trimmed: asked for events after {after}, "
            f"the first kept event is {first_available}"
        )

    def details(self) -> dict[str, Any]:
        return {"after": self.after, "first_available": self.first_available}


class RequestError(AgentroomsError):
    """The call itself is wrong; fix it rather than retry."""

    code = "request_error"
    http_status = 400


class BadRequest(RequestError):
    code = "bad_request"
    http_status = 400


class PayloadTooLarge(BadRequest):
    code = "payload_too_large"
    http_status = 413


class NotFound(RequestError):
    code = "not_found"
    http_status = 404


class Unauthorized(RequestError):
    code = "unauthorized"
    http_status = 401


class Forbidden(RequestError):
    code = "forbidden"
    http_status = 403
