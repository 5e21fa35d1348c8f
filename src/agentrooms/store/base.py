"""The store contract: one atomic primitive that every backend implements natively.

Everything above this module (commit loop, plans, leases, locks, cursors, effects) talks
to a :class:`Store` and never to Redis or SQL directly.

A store holds, per **room**, a set of **records** ``key -> (value, version, expires_at)``
and an append-only **event log** numbered by a gapless per-room sequence.

Invariants every backend keeps (and the conformance suite checks):

* A record's ``version`` strictly increases on every write and is never reused, not even
  after a delete and re-create (versions come from a store-wide or room-wide counter).
* Expiry is judged by the store's own clock. An expired record is absent to ``read``,
  ``scan`` and every compare.
* ``transact`` is all-or-nothing: on any failed compare nothing is written and nothing is
  appended.
* Event sequence numbers are assigned by the store: per room, starting at 1, gapless and
  strictly increasing in commit order.

Public methods validate and encode their input here, once, before the backend sees it:
bad input raises :class:`~agentrooms.errors.BadRequest` (or ``PayloadTooLarge``) and
nothing is written. Backends implement the underscored methods.
"""

from __future__ import annotations

import abc
import asyncio
import json
import math
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TypeAlias

from agentrooms.errors import BadRequest, PayloadTooLarge, StaleFence, VersionConflict

JSON: TypeAlias = Any
"""Any value ``json.dumps`` accepts without ``default=`` (NaN and infinities excluded)."""

MAX_TTL = 10 * 365 * 86_400.0
"""The longest TTL a record may have (ten years), within every backend's clock range."""

PURGE_LIMIT = 32
"""Expired records a write deletes from its room, at most, oldest first (SQLite and memory;
PostgreSQL's ``transact()`` has the same number in its SQL; Redis expires keys itself)."""

FENCE_FIELD = "fence"
"""The top-level field of a record's JSON object that holds its fencing token."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Record:
    """One record as read: value and version always from the same instant."""

    key: str
    value: JSON
    version: int
    expires_at: float | None = None  # store-clock seconds since the epoch

    @property
    def fence(self) -> int:
        """The record's fencing token (the value's ``fence`` field), 0 when it has none."""
        return fence_of(self.value)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The records asked for that exist, read together, with the store's clock."""

    records: Mapping[str, Record]
    now: float  # store-clock seconds since the epoch

    def get(self, key: str) -> Record | None:
        return self.records.get(key)

    def exists(self, key: str) -> bool:
        return key in self.records

    def version(self, key: str) -> int | None:
        record = self.records.get(key)
        return None if record is None else record.version

    def value(self, key: str, default: JSON = None) -> JSON:
        record = self.records.get(key)
        return default if record is None else record.value


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a room's log."""

    seq: int
    type: str
    data: JSON
    time: float  # store-clock seconds when it was appended


@dataclass(frozen=True, slots=True)
class ScanPage:
    """Records in key order; pass ``next_after`` back as ``after`` for the next page."""

    records: list[Record]
    next_after: str | None
    now: float


@dataclass(frozen=True, slots=True)
class TransactResult:
    """What a successful ``transact`` did: new version per put key, the sequence number of
    each appended event (in order), and the store's clock at commit."""

    versions: dict[str, int]
    seqs: list[int]
    now: float


# ---------------------------------------------------------------- compares and writes


@dataclass(frozen=True, slots=True)
class VersionIs:
    """The record exists (unexpired) and its version equals ``version``."""

    key: str
    version: int


@dataclass(frozen=True, slots=True)
class Absent:
    """The record does not exist (or has expired)."""

    key: str


@dataclass(frozen=True, slots=True)
class Present:
    """The record exists and has not expired."""

    key: str


@dataclass(frozen=True, slots=True)
class FenceAtMost:
    """The record exists and its fencing token is at most ``fence``.

    A failure raises :class:`~agentrooms.errors.StaleFence` (the caller's token is
    older than the holder's), which takes precedence over version conflicts.
    """

    key: str
    fence: int


Compare: TypeAlias = VersionIs | Absent | Present | FenceAtMost


@dataclass(frozen=True, slots=True)
class Put:
    """Write ``value`` (replacing any previous one); ``ttl`` in seconds, ``None`` = no expiry."""

    key: str
    value: JSON
    ttl: float | None = None


@dataclass(frozen=True, slots=True)
class PutOutcome(Put):
    """A :class:`Put` of a JSON object to which the store adds, atomically with the rest
    of the transact, what the transact did: the field ``outcome`` holds
    ``{"versions": {key: new version, ...}, "seqs": [seq, ...]}``, the versions of the
    transact's other puts and the sequence numbers of its appends, as its
    :class:`TransactResult` reports them. A recorded command outcome uses it, so that a
    replay can answer with the versions and sequence numbers the store assigned. At most
    one per transact; ``value`` must be an object with no ``outcome`` field."""


OUTCOME_FIELD = "outcome"
"""The field of a :class:`PutOutcome` value that the store fills in."""


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove the record; deleting an absent record is not an error."""

    key: str


@dataclass(frozen=True, slots=True)
class SetAdd:
    """Add ``member`` to the room's set ``name`` (no-op if present). Sets are
    commutative indexes (e.g. a plan's ready tasks): they carry no version and take no
    part in compares, so concurrent adds and removes never conflict."""

    name: str
    member: str


@dataclass(frozen=True, slots=True)
class SetRemove:
    """Remove ``member`` from the room's set ``name`` (no-op if absent)."""

    name: str
    member: str


Write: TypeAlias = Put | Delete | SetAdd | SetRemove


@dataclass(frozen=True, slots=True)
class Append:
    """Append an event to the room's log; the store gives it its sequence number."""

    type: str
    data: JSON = None


# ------------------------------------------------------------- prepared (backend) forms


@dataclass(frozen=True, slots=True)
class PreparedWrite:
    """A validated write as backends receive it: ``value_json`` is ``None`` for a delete."""

    key: str
    value_json: str | None
    ttl_ms: int | None = None
    outcome: bool = False  # a PutOutcome: the store adds the transact's outcome to it


@dataclass(frozen=True, slots=True)
class PreparedSetOp:
    name: str
    member: str
    add: bool


@dataclass(frozen=True, slots=True)
class PreparedAppend:
    type: str
    data_json: str


@dataclass(frozen=True, slots=True)
class Limits:
    """Input limits checked before anything reaches a backend."""

    max_room_bytes: int = 200
    max_key_bytes: int = 1024
    max_value_bytes: int = 4 * 1024 * 1024
    max_event_type_bytes: int = 200
    max_ops: int = 5000  # compares + writes + appends in one transact
    max_page: int = 10_000


@dataclass(frozen=True, slots=True)
class StoreInfo:
    """What ``doctor`` reports: the backend, its durability, and what is unsafe."""

    backend: str
    url: str
    durability: str
    warnings: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------ validation


def fence_of(value: JSON) -> int:
    """The fencing token held in a record's value: its integer ``fence`` field, else 0."""
    if isinstance(value, dict):
        fence = value.get(FENCE_FIELD)
        if isinstance(fence, int) and not isinstance(fence, bool):
            return fence
    return 0


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def encode_json(value: JSON, what: str, limit: int) -> str:
    """Canonical JSON text of ``value``; ``BadRequest`` if it is not JSON,
    ``PayloadTooLarge`` if its UTF-8 encoding is over ``limit`` bytes."""
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"{what} is not JSON-serialisable: {exc}") from exc
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:  # a lone surrogate: no backend can store it
        raise BadRequest(f"{what} is not valid Unicode: {exc}") from exc
    if size > limit:
        raise PayloadTooLarge(f"{what} is {size} bytes, over the {limit} limit")
    return text


def _check_name(name: object, what: str, limit: int) -> str:
    if not isinstance(name, str):
        raise BadRequest(f"{what} must be a string, not {type(name).__name__}")
    if not name:
        raise BadRequest(f"{what} must not be empty")
    try:
        size = len(name.encode())
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{what} is not valid Unicode: {exc}") from exc
    if size > limit:
        raise BadRequest(f"{what} is {size} bytes, over the {limit}-byte limit")
    if _CONTROL.search(name):
        raise BadRequest(f"{what} {name!r} contains a control character")
    return name


def check_room(room: object, limits: Limits) -> str:
    """Room names: non-empty, no control characters, no braces (they delimit the Redis
    hash tag), at most ``max_room_bytes``."""
    name = _check_name(room, "room name", limits.max_room_bytes)
    if "{" in name or "}" in name:
        raise BadRequest(f"room name {name!r} must not contain braces")
    return name


def check_key(key: object, limits: Limits) -> str:
    return _check_name(key, "key", limits.max_key_bytes)


def check_int(value: object, what: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{what} must be an integer, not {type(value).__name__}")
    if value < minimum:
        raise BadRequest(f"{what} must be at least {minimum}, got {value}")
    return value


def check_timeout(timeout: object) -> float:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 <= timeout <= 3600
    ):
        raise BadRequest("timeout must be a number of seconds between 0 and 3600")
    return float(timeout)


def check_limit(limit: object, limits: Limits) -> int:
    value = check_int(limit, "limit", 1)
    if value > limits.max_page:
        raise BadRequest(f"limit {value} is over the maximum page of {limits.max_page}")
    return value


def ttl_to_ms(ttl: object) -> int | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise BadRequest(f"ttl must be a number of seconds, not {type(ttl).__name__}")
    if not math.isfinite(ttl) or not 0 < ttl <= MAX_TTL:
        raise BadRequest(f"ttl must be a positive number of seconds up to {MAX_TTL:.0f}, got {ttl}")
    return max(1, math.ceil(ttl * 1000))


@dataclass(frozen=True, slots=True)
class Prepared:
    """One transact's operations, validated and encoded."""

    compares: list[Compare]
    writes: list[PreparedWrite]
    appends: list[PreparedAppend]
    set_ops: list[PreparedSetOp]


def prepare_transact(
    compares: Iterable[Compare],
    writes: Iterable[Write],
    appends: Iterable[Append],
    limits: Limits,
) -> Prepared:
    """Validate and encode one transact's operations (raising before any IO)."""
    cmp_list, write_list, append_list = list(compares), list(writes), list(appends)
    if len(cmp_list) + len(write_list) + len(append_list) > limits.max_ops:
        raise BadRequest(f"a transact holds at most {limits.max_ops} operations")
    for c in cmp_list:
        if not isinstance(c, VersionIs | Absent | Present | FenceAtMost):
            raise BadRequest(f"not a compare: {c!r}")
        check_key(c.key, limits)
        if isinstance(c, VersionIs):
            check_int(c.version, "compared version", 0)
        elif isinstance(c, FenceAtMost):
            check_int(c.fence, "fence", 0)
    prepared: list[PreparedWrite] = []
    set_ops: list[PreparedSetOp] = []
    seen: set[str] = set()
    outcome = False
    for w in write_list:
        if isinstance(w, SetAdd | SetRemove):
            name = check_key(w.name, limits)
            member = _check_name(w.member, "set member", limits.max_key_bytes)
            set_ops.append(PreparedSetOp(name, member, isinstance(w, SetAdd)))
            continue
        if not isinstance(w, Put | Delete):
            raise BadRequest(f"not a write: {w!r}")
        key = check_key(w.key, limits)
        if key in seen:
            raise BadRequest(f"key {key!r} is written twice in one transact")
        seen.add(key)
        if isinstance(w, PutOutcome):
            if outcome:
                raise BadRequest("a transact holds at most one PutOutcome")
            if not isinstance(w.value, dict) or OUTCOME_FIELD in w.value:
                raise BadRequest(f"a PutOutcome value is an object without {OUTCOME_FIELD!r}")
            outcome = True
        if isinstance(w, Put):
            text = encode_json(w.value, f"value of {key!r}", limits.max_value_bytes)
            flag = isinstance(w, PutOutcome)
            prepared.append(PreparedWrite(key, text, ttl_to_ms(w.ttl), flag))
        else:
            prepared.append(PreparedWrite(key, None))
    events: list[PreparedAppend] = []
    for a in append_list:
        if not isinstance(a, Append):
            raise BadRequest(f"not an append: {a!r}")
        kind = _check_name(a.type, "event type", limits.max_event_type_bytes)
        events.append(
            PreparedAppend(kind, encode_json(a.data, "event data", limits.max_value_bytes))
        )
    return Prepared(cmp_list, prepared, events, set_ops)


def check_compares(
    compares: Iterable[Compare], current: Callable[[str], tuple[int, JSON] | None]
) -> None:
    """Evaluate compares against ``current(key) -> (version, value) | None`` (``None``:
    absent or expired). Raises ``StaleFence`` for the first stale fence, else
    ``VersionConflict`` naming every failing key; returns when all hold.

    Backends that evaluate compares in Python (memory, SQLite, PostgreSQL) call this
    with the rows they have locked, so the rule is written once.
    """
    conflicts: dict[str, int | None] = {}
    for c in compares:
        found = current(c.key)
        version = None if found is None else found[0]
        if isinstance(c, FenceAtMost):
            held = None if found is None else fence_of(found[1])
            if held is None or held > c.fence:
                raise StaleFence(c.key, c.fence, held)
            continue
        ok = (
            (isinstance(c, VersionIs) and version == c.version)
            or (isinstance(c, Absent) and version is None)
            or (isinstance(c, Present) and version is not None)
        )
        if not ok:
            conflicts[c.key] = version
    if conflicts:
        raise VersionConflict(conflicts)


def with_outcome(value_json: str, versions: Mapping[str, int], seqs: Sequence[int]) -> str:
    """The JSON text of a :class:`PutOutcome` value (``value_json``, an object) with the
    transact's outcome added: the versions of its puts other than the outcome record's
    own, and the sequence numbers of its appends."""
    done = json.dumps({"versions": dict(versions), "seqs": list(seqs)}, ensure_ascii=False)
    rest = "}" if value_json == "{}" else "," + value_json[1:]
    return f'{{"{OUTCOME_FIELD}":{done}{rest}'


def settle(future: asyncio.Future[Any], outcome: object) -> None:
    """Hand a queued call's caller its outcome, a result or an exception to raise, unless
    it gave up waiting (for backends that send queued calls together)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def seen(future: asyncio.Future[Any]) -> None:
    """Mark a future's or task's failure as seen, for one that nobody may await (every
    caller of a shared task gave up; a reply failed behind another's): asyncio would log
    "exception was never retrieved" otherwise. Usable as a done callback."""
    if future.done() and not future.cancelled():
        future.exception()


def decode_json(text: str | bytes) -> JSON:
    return json.loads(text)


def ms_to_s(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000.0


# ---------------------------------------------------------------------------- contract


class Store(abc.ABC):
    """The atomic store primitive. One instance is safe to share between coroutines.

    Open one with :func:`agentrooms.open_store` and close it with ``await store.close()``
    or ``async with``.
    """

    backend: str = "abstract"
    shared_by_url: bool = False  # handles opened with equal URLs reach the same data

    def __init__(self, url: str, limits: Limits | None = None) -> None:
        self.url = url
        self.limits = limits or Limits()

    @classmethod
    async def open(cls, url: str, limits: Limits | None = None) -> Self:
        """Connect to the store named by ``url``, creating or migrating its schema."""
        return cls(url, limits)

    @property
    def identity(self) -> Hashable:
        """The data this handle reaches: two handles of equal identity read and write
        the same rooms, so one process may serve both with one reader of a room's log
        (:mod:`agentrooms.rooms.follow`). A handle is only equal to itself, unless its
        backend is a server that every handle opened with the same URL reaches
        (:attr:`shared_by_url`)."""
        return (self.backend, self.url) if self.shared_by_url else self

    @property
    def follow_returns_events(self) -> bool:
        """Whether :meth:`follow_log` gets the new events in the round trip that waits
        for them (Redis: ``XREAD BLOCK``). If not, it is :meth:`watch`, then
        :meth:`read_log`, and a reader that already holds every new event (this process
        appended them) can stop after the watch."""
        return False

    # -- public, validated -------------------------------------------------------

    async def read(self, room: str, keys: Sequence[str]) -> Snapshot:
        """Read ``keys`` of ``room`` as one snapshot.

        Atomic: every returned record's value and version are from the same instant,
        and ``now`` is the store's clock at that instant. Absent or expired keys are
        simply missing from ``records``.
        """
        room = check_room(room, self.limits)
        if isinstance(keys, str):
            raise BadRequest("keys must be a sequence of strings, not one string")
        key_list = [check_key(k, self.limits) for k in keys]
        if len(key_list) > self.limits.max_ops:
            raise BadRequest(f"read at most {self.limits.max_ops} keys at once")
        return await self._read(room, list(dict.fromkeys(key_list)))

    async def transact(
        self,
        room: str,
        compares: Iterable[Compare] = (),
        writes: Iterable[Write] = (),
        appends: Iterable[Append] = (),
    ) -> TransactResult:
        """Check every compare, then apply every write and append, all or nothing.

        Returns the new version of each put key, the sequence numbers given to the
        appended events (in order) and the store time of the commit.

        Raises :class:`~agentrooms.errors.StaleFence` if a ``FenceAtMost`` fails, else
        :class:`~agentrooms.errors.VersionConflict` naming *every* failing key with its
        current version (``None`` if absent). In both cases nothing changed.
        """
        room = check_room(room, self.limits)
        return await self._transact(room, prepare_transact(compares, writes, appends, self.limits))

    async def scan(
        self, room: str, prefix: str = "", after: str | None = None, limit: int = 100
    ) -> ScanPage:
        """Records whose key starts with ``prefix`` and sorts after ``after``, in key
        order (Unicode code point order), at most ``limit`` of them.

        ``next_after`` is ``None`` when the listing is complete, otherwise the key to
        pass as ``after`` for the next page. Each page is one snapshot.
        """
        room = check_room(room, self.limits)
        if not isinstance(prefix, str):
            raise BadRequest("prefix must be a string")
        if after is not None:
            check_key(after, self.limits)
        return await self._scan(room, prefix, after, check_limit(limit, self.limits))

    async def read_log(self, room: str, after: int = 0, limit: int = 100) -> list[Event]:
        """Events with ``seq > after`` in order, at most ``limit``.

        Raises :class:`~agentrooms.errors.CursorCompacted` if any event after ``after``
        has been trimmed, never returning a silent gap.
        """
        room = check_room(room, self.limits)
        return await self._read_log(
            room, check_int(after, "after", 0), check_limit(limit, self.limits)
        )

    async def trim_log(self, room: str, before: int) -> int:
        """Drop events with ``seq < before`` (never past the newest event: ``before`` is
        capped at ``last_seq + 1``). Returns the first sequence number still readable,
        which never decreases. Idempotent."""
        room = check_room(room, self.limits)
        return await self._trim_log(room, check_int(before, "before", 0))

    async def last_seq(self, room: str) -> int:
        """The sequence number of the room's newest event (0 if none was ever appended)."""
        return await self._last_seq(check_room(room, self.limits))

    async def set_pick(self, room: str, name: str, count: int = 1) -> list[str]:
        """Up to ``count`` members of set ``name``, least recently picked first (members
        never picked before come first, in member order), and mark them picked now.

        Atomic: concurrent callers are handed different members while the set has enough,
        so agents claiming work from one set do not all race for its head. Picking does
        not remove: the caller removes a member (``SetRemove``) in the transact that
        claims it, so a caller that dies after picking loses nothing. Cost does not grow
        with the size of the set.
        """
        room = check_room(room, self.limits)
        name = check_key(name, self.limits)
        return await self._set_pick(room, name, check_limit(count, self.limits))

    async def set_size(self, room: str, name: str) -> int:
        """How many members set ``name`` has."""
        room = check_room(room, self.limits)
        return await self._set_size(room, check_key(name, self.limits))

    async def watch(self, room: str, after: int, timeout: float) -> int:
        """Wait until the room's log holds an event with ``seq > after`` or ``timeout``
        seconds pass; return the newest sequence number then (``<= after`` on timeout).

        Woken by the store (Redis blocking read, PostgreSQL LISTEN/NOTIFY, in-process
        notification with a slow poll fallback for other processes), not by polling in a
        hot loop.
        """
        room = check_room(room, self.limits)
        after = check_int(after, "after", 0)
        return await self._watch(room, after, check_timeout(timeout))

    async def follow_log(
        self, room: str, after: int, timeout: float, limit: int = 100
    ) -> list[Event]:
        """``watch``, then ``read_log``, as one call: wait until the room's log holds an
        event with ``seq > after`` or ``timeout`` seconds pass, and return the events
        after ``after`` (at most ``limit``, in order; ``[]`` on timeout). Raises
        ``CursorCompacted`` like ``read_log``.

        For a reader that follows a log for many waiters (:mod:`agentrooms.rooms.follow`):
        a backend whose blocking read already returns the entries answers in one round
        trip (Redis: ``XREAD BLOCK``); the others watch, then read.
        """
        room = check_room(room, self.limits)
        after, timeout = check_int(after, "after", 0), check_timeout(timeout)
        return await self._follow_log(room, after, timeout, check_limit(limit, self.limits))

    async def delete_room(self, room: str) -> None:
        """Delete every record, set and event of ``room``, atomically.

        Counters survive: versions are never reused, and the log's sequence continues
        from where it was with everything before it trimmed, so a cursor kept from before
        the delete gets ``CursorCompacted`` instead of silently reading new events.
        """
        await self._delete_room(check_room(room, self.limits))

    async def info(self) -> StoreInfo:
        """Backend, durability settings and warnings about unsafe settings."""
        return await self._info()

    async def close(self) -> None:
        await self._close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- backend seam ------------------------------------------------------------

    @abc.abstractmethod
    async def _read(self, room: str, keys: list[str]) -> Snapshot: ...

    @abc.abstractmethod
    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        """Apply ``ops`` (compares, then writes, set ops and appends) atomically."""

    @abc.abstractmethod
    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage: ...

    @abc.abstractmethod
    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]: ...

    @abc.abstractmethod
    async def _trim_log(self, room: str, before: int) -> int: ...

    @abc.abstractmethod
    async def _last_seq(self, room: str) -> int: ...

    @abc.abstractmethod
    async def _set_pick(self, room: str, name: str, count: int) -> list[str]: ...

    @abc.abstractmethod
    async def _set_size(self, room: str, name: str) -> int: ...

    @abc.abstractmethod
    async def _watch(self, room: str, after: int, timeout: float) -> int: ...

    async def _follow_log(self, room: str, after: int, timeout: float, limit: int) -> list[Event]:
        """Default: ``_watch``, then ``_read_log`` if something came."""
        if await self._watch(room, after, timeout) <= after:
            return []
        return await self._read_log(room, after, limit)

    @abc.abstractmethod
    async def _delete_room(self, room: str) -> None: ...

    @abc.abstractmethod
    async def _info(self) -> StoreInfo: ...

    @abc.abstractmethod
    async def _close(self) -> None: ...
