"""The store's data types: what a backend is given and returns, and the input limits.

Records, snapshots, events and pages as read; the compares, writes and appends a
transact takes, and the prepared (validated, encoded) forms backends receive from
:mod:`agentrooms.store.validation`. Plain frozen dataclasses: no IO, no validation
(the addressees' stored form excepted: one JSON text, encoded and decoded here).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

JSON: TypeAlias = Any
"""Any value ``json.dumps`` accepts without ``default=`` (NaN and infinities excluded)."""

MAX_TTL = 10 * 365 * 86_400.0
"""The longest TTL a record may have (ten years), within every backend's clock range."""

PURGE_LIMIT = 32
"""Expired records a write deletes from its room, at most, oldest first (SQLite and memory;
PostgreSQL's ``transact()`` has the same number in its SQL; Redis expires keys itself)."""

FENCE_FIELD = "fence"
"""The top-level field of a record's JSON object that holds its fencing token."""


def fence_of(value: JSON) -> int:
    """The fencing token held in a record's value: its integer ``fence`` field, else 0."""
    if isinstance(value, dict):
        fence = value.get(FENCE_FIELD)
        if isinstance(fence, int) and not isinstance(fence, bool):
            return fence
    return 0


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
    """One entry of a room's log: ``author`` is the agent that appended it, as the
    append named it (``None``: it named none); ``to`` and ``to_roles`` the agents and
    roles it is addressed to (both empty: addressed to nobody in particular)."""

    seq: int
    type: str
    data: JSON
    time: float  # store-clock seconds when it was appended
    author: str | None = None
    to: tuple[str, ...] = ()
    to_roles: tuple[str, ...] = ()

    def addressed_to(self, agent: str, roles: Iterable[str] = ()) -> bool:
        """Whether ``agent`` (holding ``roles``) is among the event's addressees."""
        return agent in self.to or any(role in self.to_roles for role in roles)


@dataclass(frozen=True, slots=True)
class Glance:
    """One room as :meth:`~agentrooms.store.base.Store.glance` reads it, in one snapshot:
    the records asked for that exist, the newest event's sequence number (0 if none) and
    the size of each set asked for."""

    room: str
    snapshot: Snapshot
    last_seq: int
    set_sizes: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class ScanPage:
    """Records in key order; pass ``next_after`` back as ``after`` for the next page."""

    records: list[Record]
    next_after: str | None
    now: float


@dataclass(frozen=True, slots=True)
class KeyPage:
    """The keys of a :class:`ScanPage` without their records: what reads an index."""

    keys: list[str]
    next_after: str | None


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
    """Append an event to the room's log; the store gives it its sequence number.
    ``author`` (an agent name, or ``None``) is stored with it and read back as
    :attr:`Event.author`; so are the addressees ``to`` (agent names) and ``to_roles``
    (role names), read back as :attr:`Event.to` and :attr:`Event.to_roles`."""

    type: str
    data: JSON = None
    author: str | None = None
    to: Sequence[str] = ()
    to_roles: Sequence[str] = ()


# ------------------------------------------------------------- prepared (backend) forms
#
# PreparedWrite and Prepared are built on every transact, so they are not frozen: a
# frozen dataclass's __init__ sets each field through object.__setattr__, a large part
# of the hot path's own cost (docs/why.md). Backends treat them as read-only.


@dataclass(slots=True)
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
    author: str | None = None
    # the addressees as stored (see encode_recipients); None: addressed to nobody
    to_json: str | None = None


def encode_recipients(to: Sequence[str], roles: Sequence[str]) -> str | None:
    """The stored form of an event's addressees, one JSON text for every backend:
    ``{"to": [agents], "roles": [roles]}``, or ``None`` when there are none."""
    if not to and not roles:
        return None
    return json.dumps({"to": list(to), "roles": list(roles)}, separators=(",", ":"))


def decode_recipients(text: str | bytes | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(to, to_roles)`` of a stored :func:`encode_recipients` text (``None``: none)."""
    if not text:
        return (), ()
    value = json.loads(text)
    return tuple(value["to"]), tuple(value["roles"])


def stored_event(
    seq: int, type: str, data: JSON, time: float, author: str | None, to_json: str | bytes | None
) -> Event:
    """An :class:`Event` from a backend's stored fields (addressees in their stored form)."""
    to, roles = decode_recipients(to_json)
    return Event(seq, type, data, time, author, to, roles)


def appended(seqs: Sequence[int], appends: Sequence[Append], now: float) -> list[Event]:
    """The events a transact appended: ``appends`` numbered by its ``seqs`` (in order),
    at the store time ``now``, as a read of the log returns them."""
    return [
        Event(seq, a.type, a.data, now, a.author, tuple(a.to), tuple(a.to_roles))
        for seq, a in zip(seqs, appends, strict=True)
    ]


@dataclass(slots=True)
class Prepared:
    """One transact's operations, validated and encoded."""

    compares: list[Compare]
    writes: list[PreparedWrite]
    appends: list[PreparedAppend]
    set_ops: list[PreparedSetOp]


@dataclass(frozen=True, slots=True)
class Limits:
    """Input limits checked before anything reaches a backend."""

    max_room_bytes: int = 200
    max_key_bytes: int = 1024
    max_value_bytes: int = 4 * 1024 * 1024
    max_event_type_bytes: int = 200
    max_author_bytes: int = 200
    max_recipients: int = 100  # agents + roles one event is addressed to
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
