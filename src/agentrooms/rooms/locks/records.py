"""What a lock's records hold, and the writes that change them.

A grant is ``lock/<name>`` (holder: owner, grant token, fencing token, TTL, and the
grant's and last extend's times where its write cannot give them), the newest fencing
token in ``lockfence/<name>``, and ``lockgrant/<name>/<grant token>``, which expires with
the holder record and proves the grant by its secret token. ``lockline/<name>`` is the
mark that a grant of the free lock and every join of its line rewrite. Pure functions
and values: nothing here reads or writes the store.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrooms.errors import BadRequest
from agentrooms.rooms import keys
from agentrooms.store.types import FenceAtMost, Put, Write

DEFAULT_TTL = 30.0
READ = 64  # records a grant may come with (``read=``)


@dataclass(frozen=True, slots=True)
class Lock:
    room: str
    name: str
    owner: str
    token: str  # random, unique to this grant
    fence: int
    expires_at: float  # store clock
    ttl: float
    # what ``read=`` asked for: each record's value as of the grant (absent: left out)
    values: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # store clock: the grant, and its last extend (None: never); see grant_times
    granted_at: float | None = None
    renewed_at: float | None = None

    def guard(self) -> FenceAtMost:
        """A compare that lets a write commit only while this grant is the newest."""
        return FenceAtMost(keys.lock_fence(self.name), self.fence)


@dataclass(frozen=True, slots=True)
class LockInfo:
    """The lock's current holder, as of a read (an expired grant is no holder: the
    lock is free). Times by the store's clock, to the millisecond."""

    name: str
    owner: str
    fence: int
    expires_at: float | None
    granted_at: float | None = None  # the write that granted it (a handoff's, for one)
    renewed_at: float | None = None  # its last extend (None: never extended)


@dataclass(frozen=True, slots=True)
class WaiterInfo:
    """One agent in a lock's line: ``joined_at`` is the store time of the write that put
    it in line (a waiter that dropped out and joined again: of that join), ``ticket``
    its place (lower goes first)."""

    waiter: str
    owner: str
    ticket: int
    joined_at: float | None
    expires_at: float | None  # its entry lapses then unless the waiter refreshes it


def grant_times(value: Mapping[str, Any], expires_at: float | None) -> tuple[float | None, ...]:
    """``(granted_at, renewed_at)`` of a holder record, by the store's clock.

    A grant made without a read (a take of a lock believed free, a handoff) cannot know
    its own store time, but it sets the record's expiry to that time plus the TTL it
    holds, so its grant time is ``expires_at - ttl`` (to the millisecond). A grant or an
    extend made through the commit loop writes the store time of the read it decided on
    (at most one round trip before its write) as ``granted_at`` / ``renewed_at``, so
    that a replay of its command answers the same grant."""
    renewed = value.get("renewed_at")
    if "granted_at" in value:
        return float(value["granted_at"]), renewed
    written = None if expires_at is None else expires_at - float(value["ttl"])
    return written, renewed


@dataclass(frozen=True, slots=True)
class Claim:
    """A request for a lock: who, for how long, and the token its grant will carry."""

    name: str
    owner: str
    ttl: float
    token: str

    def holder(self, fence: int, granted_at: float | None = None) -> dict[str, Any]:
        return holder_value(self.owner, self.token, fence, self.ttl, granted_at)


def new_claim(name: str, owner: str, ttl: object) -> Claim:
    keys.check_name(name, "lock name")
    keys.check_name(owner, "owner")
    return Claim(name, owner, check_ttl(ttl), uuid.uuid4().hex)


def check_ttl(ttl: object, what: str = "a lock ttl") -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86_400:
        raise BadRequest(f"{what} must be between 0 and 86400 seconds, got {ttl!r}")
    return float(ttl)


def check_read(read: object) -> tuple[str, ...]:
    if isinstance(read, str | bytes) or not isinstance(read, Sequence):
        raise BadRequest(f"read must be a list of record keys, got {read!r}")
    wanted = tuple(dict.fromkeys(read))
    if len(wanted) > READ or not all(isinstance(k, str) and k for k in wanted):
        raise BadRequest(f"read must name at most {READ} record keys (non-empty strings)")
    return wanted


def holder_value(
    owner: str,
    token: str,
    fence: int,
    ttl: float,
    granted_at: float | None = None,
    renewed_at: float | None = None,
) -> dict[str, Any]:
    """A holder record's value; the times only where :func:`grant_times` needs them."""
    value: dict[str, Any] = {"owner": owner, "token": token, "fence": fence, "ttl": ttl}
    if granted_at is not None:
        value["granted_at"] = granted_at
    if renewed_at is not None:
        value["renewed_at"] = renewed_at
    return value


def grant_writes(name: str, holder: dict[str, Any]) -> list[Write]:
    """The writes that make ``holder`` (with its new fencing token) the lock's holder:
    its holder record and grant record (:func:`grant_record`), and the newest token."""
    return [
        Put(keys.lock(name), holder, ttl=holder["ttl"]),
        grant_record(name, holder),
        Put(keys.lock_fence(name), {"fence": holder["fence"]}),
    ]


def grant_record(name: str, holder: Mapping[str, Any]) -> Put:
    """The grant's record, named by its secret token and expiring with the holder record:
    a release compares it (``FenceAtMost``), so only the grant's holder, who knows the
    token, can release or hand on the lock, whatever fencing token a caller names."""
    return Put(
        keys.lock_grant(name, holder["token"]), {"fence": holder["fence"]}, ttl=holder["ttl"]
    )


def owns(lock: Lock) -> list[FenceAtMost]:
    """The compares that hold while ``lock`` is the current grant: the holder record's
    fencing token is at most the grant's (a newer grant fails it, with the newer token in
    the ``StaleFence``) and the grant's own record is there (its token is the holder's)."""
    return [
        FenceAtMost(keys.lock(lock.name), lock.fence),
        FenceAtMost(keys.lock_grant(lock.name, lock.token), lock.fence),
    ]


def mark(name: str) -> Put:
    """The write that tells a release that someone took the lock free or joined its line
    since (its value does not matter, its new version does)."""
    return Put(keys.lock_line(name), 0)


def acquiring(name: str, owner: str, ttl: float) -> dict[str, Any]:
    """What a command id of an acquisition stands for (a repeat with another is refused)."""
    return {"op": "lock.acquire", "lock": name, "owner": owner, "ttl": ttl}


def handed(writes: Sequence[Write], wanted: object) -> dict[str, Any]:
    """What a handoff passes on: of the releaser's writes, the puts without expiry of the
    records the new holder asked for (their values as of the grant), copied."""
    if not wanted:
        return {}
    asked = set(wanted) if isinstance(wanted, list) else set()
    return copy.deepcopy(
        {w.key: w.value for w in writes if isinstance(w, Put) and w.ttl is None and w.key in asked}
    )


def local_time(expires_at: float | None, store_now: float) -> float | None:
    """The local monotonic time of a store-clock expiry (``None``: it never expires)."""
    return None if expires_at is None else time.monotonic() + max(0.0, expires_at - store_now)
