"""Path reservations: a set of path patterns held exclusive or shared, with a TTL and a
fencing token, granted atomically for the whole set or refused naming the holder.

A grant is ``paths/<id>`` (owner, mode, patterns, fencing token, ``until``: the store time
it lapses) and one index record per pattern, ``pathx/<prefix>*<id>.<n>``, under the
pattern's literal prefix (:func:`~agentrooms.rooms.globs.literal_prefix`). Two patterns
overlap only if one's prefix starts the other's, so a grant reads the index at its
prefixes' ancestors and below its prefixes, never the whole room. Every grant rewrites
``pathfence`` (the fencing counter) comparing the version it read before its scans: of
two grants that read the same counter only one commits, and the other reads again and
sees it. Shared conflicts only with exclusive; an owner's own reservations count too.

A reservation lapses at ``until`` by the store's clock. Its records stay for
:data:`LINGER` more seconds, so a later overlapping grant reclaims it (deletes it and
appends ``paths.expired`` naming it, addressed to its holder's inbox) instead of it
vanishing unseen; ``renew`` of a lapsed, reclaimed or released reservation raises
``PathsLost``. Grants and releases
append ``paths.reserved`` / ``paths.released``.

Why it is built this way: docs/why-paths.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from agentrooms.errors import (
    BadRequest,
    ContentionExhausted,
    PathsLost,
    PathsReserved,
    StoreUnavailable,
    VersionConflict,
)
from agentrooms.rooms import globs, keys
from agentrooms.rooms.follow import tell
from agentrooms.rooms.locks.records import check_ttl
from agentrooms.rooms.scope import ROOM_POLICY, Scope
from agentrooms.store.types import (
    Absent,
    Append,
    Compare,
    Delete,
    Put,
    Record,
    VersionIs,
    Write,
    appended,
)

EXCLUSIVE, SHARED = "exclusive", "shared"
MODES = (EXCLUSIVE, SHARED)
DEFAULT_TTL = 300.0
LINGER = 3600.0  # seconds a lapsed reservation's records stay to be reclaimed and told
MAX_PATTERNS = 64  # patterns in one reservation, or paths in one check
RECLAIM = 64  # lapsed reservations one grant deletes, at most
_RNG = random.Random()
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Reservation:
    """A grant: ``expires_at`` (store clock) is when it lapses unless renewed."""

    room: str
    id: str
    owner: str
    mode: str
    patterns: tuple[str, ...]
    fence: int
    ttl: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class PathConflict:
    """``pattern`` (asked about) overlaps ``held``, a pattern of reservation
    ``reservation`` held in ``mode`` by ``holder`` until ``expires_at``."""

    pattern: str
    holder: str
    held: str
    reservation: str
    mode: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class _Claim:
    patterns: tuple[str, ...]
    prefixes: tuple[tuple[str, ...], ...]
    owner: str
    mode: str
    ttl: float


class _Retry(Exception):
    """What was read changed under the decision: read again."""


class Paths:
    """Reserve, renew, release, check and list the path reservations of one room."""

    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    # ------------------------------------------------------------------- granting

    async def reserve(
        self,
        patterns: Sequence[str],
        owner: str,
        *,
        mode: str = EXCLUSIVE,
        ttl: float = DEFAULT_TTL,
    ) -> Reservation:
        """Reserve every pattern of ``patterns`` for ``owner`` in ``mode``, all or none.

        ``PathsReserved`` naming the first live reservation found that overlaps one of
        them in a conflicting mode (exclusive against anything; shared against
        exclusive), nothing written. Lapsed overlapping reservations are reclaimed in
        the same write. ``BadRequest`` for a bad pattern, mode or TTL (0-86400 s)."""
        claim = _claim(patterns, owner, mode, ttl)
        return await self._retrying(lambda: self._grant(claim))

    async def renew(self, reservation: str, owner: str, ttl: float | None = None) -> Reservation:
        """Extend ``owner``'s reservation ``reservation`` to lapse ``ttl`` seconds (its own
        TTL if ``None``) from now. ``PathsLost`` if it has lapsed, was released or
        reclaimed, or is another owner's: nothing done under it is protected any more."""
        keys.check_name(owner, "owner")
        length = None if ttl is None else check_ttl(ttl, "a reservation ttl")
        return await self._retrying(lambda: self._renew(_id(reservation), owner, length))

    async def release(self, reservation: str, owner: str) -> bool:
        """Release ``owner``'s reservation ``reservation``: ``True`` if it was held;
        ``False`` (nothing released) if it had lapsed, was gone or is another owner's."""
        keys.check_name(owner, "owner")
        return await self._retrying(lambda: self._release(_id(reservation), owner))

    @contextlib.asynccontextmanager
    async def hold(
        self,
        patterns: Sequence[str],
        owner: str,
        *,
        mode: str = EXCLUSIVE,
        ttl: float = DEFAULT_TTL,
    ) -> AsyncIterator[Reservation]:
        """Reserve ``patterns`` (``PathsReserved`` as :meth:`reserve`), renew the
        reservation every ``ttl / 3`` seconds while the body runs, and release it after.

        If a renewal finds it lost (``PathsLost``), the body is cancelled at once and
        ``PathsLost`` is raised from this block: what it did is unprotected. A renewal
        that fails in transport or contention is tried again at the next turn."""
        held = await self.reserve(patterns, owner, mode=mode, ttl=ttl)
        body = asyncio.current_task()
        assert body is not None
        lost: list[PathsLost] = []

        async def renew_forever() -> None:
            while True:
                await asyncio.sleep(held.ttl / 3)
                try:
                    await self.renew(held.id, owner)
                except (StoreUnavailable, ContentionExhausted):
                    continue
                except PathsLost as exc:
                    lost.append(exc)
                    body.cancel()
                    return

        renewer = asyncio.create_task(renew_forever())
        failed = True
        try:
            yield held
            failed = False
        except asyncio.CancelledError:
            if lost and body.uncancel() == 0:
                raise lost[0] from None
            raise
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            if not lost and failed:
                with contextlib.suppress(Exception):  # (it lapses by itself otherwise)
                    await asyncio.shield(self.release(held.id, owner))
            elif not lost:
                await self.release(held.id, owner)

    async def check(
        self, patterns: Sequence[str], agent: str, *, mode: str = EXCLUSIVE
    ) -> list[PathConflict]:
        """What stands in the way of ``agent`` reserving ``patterns`` in ``mode``: every
        overlap with a live reservation of another agent, in index order. Literal paths
        are patterns that match only themselves, so a commit hook passes the staged
        paths (``mode`` exclusive: a commit writes them)."""
        claim = _claim(patterns, agent, mode, DEFAULT_TTL)
        await self._scope.read([])
        return [
            c
            for c, _ in _conflicts(claim, await self._entries(claim.prefixes))
            if c.holder != agent
        ]

    async def held(self, limit: int = 1000) -> list[Reservation]:
        """The room's live reservations by id, at most ``limit`` (one snapshot per page
        of the scan)."""
        prefix = keys.path_reservation("")
        records, _, _ = await self._scope.page(
            prefix, limit, None, lambda r, now: r.value["until"] > now
        )
        return [_reservation(self._scope.room, r.value) for r in records]

    # ------------------------------------------------------------------ internals

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` again after a conflict, with the room's backoff, within the
        policy's attempts and budget (``ContentionExhausted`` past them)."""
        policy = self._scope.policy or ROOM_POLICY
        started, delay = time.monotonic(), 0.0
        for tries in range(1, policy.max_attempts + 1):
            try:
                return await attempt()
            except (VersionConflict, _Retry):
                delay = policy.backoff.delay(tries, delay, _RNG)
                if time.monotonic() - started + delay > policy.budget:
                    break
                await asyncio.sleep(delay)
        elapsed = time.monotonic() - started
        raise ContentionExhausted(tries, elapsed, [keys.PATH_FENCE])

    async def _grant(self, claim: _Claim) -> Reservation:
        snap = await self._scope.read([keys.PATH_FENCE])
        counter = snap.get(keys.PATH_FENCE)
        entries = await self._entries(claim.prefixes)
        for conflict, _ in _conflicts(claim, entries):
            raise PathsReserved(
                conflict.pattern,
                conflict.holder,
                conflict.held,
                conflict.reservation,
                conflict.mode,
            )
        lapsed = [r for r, now in entries if r.value["until"] <= now and _clashes(claim, r)]
        compares, writes, appends = await self._reclaim(lapsed, claim.owner)
        fence = 0 if counter is None else int(counter.value["fence"])
        seen = None if counter is None else counter.version
        compares.append(
            Absent(keys.PATH_FENCE) if seen is None else VersionIs(keys.PATH_FENCE, seen)
        )
        value = {
            "id": uuid.uuid4().hex[:16],
            "owner": claim.owner,
            "mode": claim.mode,
            "patterns": list(claim.patterns),
            "fence": fence + 1,
            "ttl": claim.ttl,
            "until": snap.now + claim.ttl,  # (the read this grant decided on)
        }
        writes += [Put(keys.PATH_FENCE, {"fence": fence + 1}), *_puts(value)]
        data = {k: value[k] for k in ("id", "owner", "mode", "patterns", "fence", "ttl")}
        appends.append(Append("paths.reserved", data, claim.owner))
        await self._commit(compares, writes, appends)
        return _reservation(self._scope.room, value)

    async def _reclaim(
        self, lapsed: list[Record], by: str
    ) -> tuple[list[Compare], list[Write], list[Append]]:
        """The compares, deletes and ``paths.expired`` events that reclaim the lapsed
        reservations of index records ``lapsed`` (the first :data:`RECLAIM`; the index
        records of the others are compared, so a renewal of one since makes the grant
        read again)."""
        compares: list[Compare] = []
        deletes: dict[str, None] = {}
        appends: list[Append] = []
        ids = list(dict.fromkeys(r.value["id"] for r in lapsed))
        taken = set(ids[:RECLAIM])
        for record in lapsed:
            if record.value["id"] in taken:
                deletes[record.key] = None
            else:
                compares.append(VersionIs(record.key, record.version))
        if taken:
            snap = await self._scope.read([keys.path_reservation(i) for i in ids[:RECLAIM]])
            for rid in ids[:RECLAIM]:
                found = snap.get(keys.path_reservation(rid))
                if found is None:
                    continue  # released since: its index records were deleted with it
                if found.value["until"] > snap.now:
                    raise _Retry  # renewed since the scan
                compares.append(VersionIs(found.key, found.version))
                deletes.update(dict.fromkeys([found.key, *_index_keys(found.value)]))
                data = {k: found.value[k] for k in ("id", "owner", "mode", "patterns", "fence")}
                owner = (found.value["owner"],)  # in the holder's inbox: told at once
                appends.append(Append("paths.expired", {**data, "by": by}, by, owner))
        writes: list[Write] = [Delete(k) for k in deletes]
        return compares, writes, appends

    async def _renew(self, rid: str, owner: str, ttl: float | None) -> Reservation:
        snap = await self._scope.read([keys.path_reservation(rid)])
        record = _mine(snap.get(keys.path_reservation(rid)), rid, owner, snap.now)
        value = dict(record.value)
        value["ttl"] = value["ttl"] if ttl is None else ttl
        value["until"] = snap.now + value["ttl"]
        await self._commit([VersionIs(record.key, record.version)], _puts(value), [])
        return _reservation(self._scope.room, value)

    async def _release(self, rid: str, owner: str) -> bool:
        snap = await self._scope.read([keys.path_reservation(rid)])
        record = snap.get(keys.path_reservation(rid))
        if record is None or record.value["owner"] != owner:
            return False
        value = record.value
        live = bool(value["until"] > snap.now)
        data = {k: value[k] for k in ("id", "owner", "fence")}
        await self._commit(
            [VersionIs(record.key, record.version)],
            [Delete(k) for k in (record.key, *_index_keys(value))],
            [Append("paths.released", data, owner)] if live else [],
        )
        return live

    async def _commit(
        self, compares: list[Compare], writes: list[Write], appends: list[Append]
    ) -> None:
        done = await self._scope.transact(compares, writes, appends)
        if appends:
            tell(self._scope.store, self._scope.room, appended(done.seqs, appends, done.now))

    async def _entries(self, prefixes: Iterable[tuple[str, ...]]) -> list[tuple[Record, float]]:
        """Every index record that may overlap a pattern of literal prefix among
        ``prefixes``, with the store clock of the scan that read it: those indexed at a
        prefix's ancestors, at it, and below it (each region scanned once)."""
        pages = await asyncio.gather(*(self._scan(p) for p in _regions(prefixes)))
        return [entry for page in pages for entry in page]

    async def _scan(self, prefix: str) -> list[tuple[Record, float]]:
        store, room = self._scope.store, self._scope.room
        out: list[tuple[Record, float]] = []
        after: str | None = None
        while True:
            page = await store.scan(room, prefix, after, store.limits.max_page)
            out += [(r, page.now) for r in page.records]
            if page.next_after is None:
                return out
            after = page.next_after


# ------------------------------------------------------------------ pure helpers


def _claim(patterns: object, owner: object, mode: object, ttl: object) -> _Claim:
    if isinstance(patterns, str | bytes) or not isinstance(patterns, Sequence):
        raise BadRequest(f"paths must be a list of path patterns, got {patterns!r}")
    unique = tuple(dict.fromkeys(patterns))
    if not 1 <= len(unique) <= MAX_PATTERNS:
        raise BadRequest(f"paths must hold 1 to {MAX_PATTERNS} path patterns")
    parsed = [globs.parse(p) for p in unique]
    if mode not in MODES:
        raise BadRequest(f"mode must be 'exclusive' or 'shared', got {mode!r}")
    return _Claim(
        tuple(str(p) for p in unique),
        tuple(globs.literal_prefix(s) for s in parsed),
        keys.check_name(owner, "owner"),
        str(mode),
        check_ttl(ttl, "a reservation ttl"),
    )


def _id(reservation: object) -> str:
    return keys.check_name(reservation, "reservation id")


def _regions(prefixes: Iterable[tuple[str, ...]]) -> list[str]:
    """The key prefixes to scan for ``prefixes``: each prefix's subtree, and the records
    indexed exactly at each of its ancestors, less what a subtree scanned covers."""
    unique = set(prefixes)
    trees = {p for p in unique if not any(p[: len(q)] == q and p != q for q in unique)}
    ancestors = {p[:n] for p in trees for n in range(len(p))}
    covered = {a for a in ancestors if any(a[: len(t)] == t for t in trees)}
    return sorted(
        [keys.path_node(t) for t in trees] + [keys.path_node(a) + "*" for a in ancestors - covered]
    )


def _conflicts(
    claim: _Claim, entries: list[tuple[Record, float]]
) -> Iterable[tuple[PathConflict, Record]]:
    """Each live index record in ``entries`` that conflicts with a pattern of ``claim``."""
    for record, now in entries:
        held = record.value
        if held["until"] <= now or not _clashes(claim, record):
            continue
        for pattern in claim.patterns:
            if globs.overlap(pattern, held["pattern"]):
                yield (
                    PathConflict(
                        pattern,
                        held["owner"],
                        held["pattern"],
                        held["id"],
                        held["mode"],
                        held["until"],
                    ),
                    record,
                )


def _clashes(claim: _Claim, record: Record) -> bool:
    """Whether index record ``record`` would refuse ``claim`` while it is held."""
    held = record.value
    if claim.mode == SHARED and held["mode"] == SHARED:
        return False
    return any(globs.overlap(p, held["pattern"]) for p in claim.patterns)


def _mine(record: Record | None, rid: str, owner: str, now: float) -> Record:
    if record is None:
        raise PathsLost(rid, 0, f"reservation {rid!r} is not held: released, or lapsed")
    value = record.value
    if value["owner"] != owner:
        raise PathsLost(rid, value["fence"], f"reservation {rid!r} is not {owner!r}'s")
    if value["until"] <= now:
        raise PathsLost(
            rid, value["fence"], f"reservation {rid!r} lapsed {now - value['until']:.3f}s ago"
        )
    return record


def _index_keys(value: dict[str, Any]) -> list[str]:
    return [
        keys.path_index(globs.literal_prefix(globs.parse(p)), value["id"], n)
        for n, p in enumerate(value["patterns"])
    ]


def _puts(value: dict[str, Any]) -> list[Write]:
    """The reservation record and its index records, lasting :data:`LINGER` past its
    TTL."""
    ttl = value["ttl"] + LINGER
    entry = {k: value[k] for k in ("id", "owner", "mode", "fence", "until")}
    index = [
        Put(key, {**entry, "pattern": pattern}, ttl=ttl)
        for key, pattern in zip(_index_keys(value), value["patterns"], strict=True)
    ]
    return [Put(keys.path_reservation(value["id"]), value, ttl=ttl), *index]


def _reservation(room: str, value: dict[str, Any]) -> Reservation:
    return Reservation(
        room,
        value["id"],
        value["owner"],
        value["mode"],
        tuple(value["patterns"]),
        value["fence"],
        value["ttl"],
        value["until"],
    )
