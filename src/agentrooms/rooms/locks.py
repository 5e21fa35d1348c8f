"""Named locks: TTL, owner-checked release and extend, a fencing token on every grant.

The holder record ``lock/<name>`` expires with the lock's TTL (by the store's clock); its
fencing counter lives apart in ``lockfence/<name>``, which never expires, so tokens keep
increasing across expiries and releases. A grant's fencing token names it: no two grants
of a lock share one. ``release`` acts only while the holder record still carries the
caller's grant (compared in the write itself), and ``extend`` only while it carries the
caller's token, so a holder whose lock expired and was taken by someone else cannot
touch the new holder's lock.

Two ways to wait for a held lock:

* ``acquire`` retries with growing sleeps (5 tries, 150 ms steps), then
  raises ``LockHeld``. Simple, but under contention the lock sits idle while every
  waiter sleeps, and an unlucky waiter can starve.
* ``wait_acquire`` queues: the waiter registers ``lockq/<name>/<waiter>`` and waits on
  the room's log; ``release`` hands the lock straight to the longest waiting live agent
  in the same atomic write (FIFO, no idle gap, no thundering herd of writers), and says
  so in its ``lock.handoff`` event, naming the waiter. The waiters of one process share
  one reader of the log (:mod:`.follow`), and only the waiter named by the handoff, or
  every waiter of a ``lock.released``, wakes up: a handoff costs one read, not one per
  waiter (none when the waiter is in the releasing process: the release tells it, and
  the reader does not read back what was told, except on Redis, where the wait for new
  events is that read). A waiter that dies stops refreshing its entry and drops out; a
  holder that dies lets its lock expire, and the waiters take it then.
* ``requeue`` is ``release`` then ``wait_acquire`` for an agent that takes the lock turn
  after turn: when someone waits, the write that hands the lock over also puts the
  releaser at the back of the line, so a turn costs one write, not two, and the new
  holder's look at the line behind it (below) finds the releaser there already, where a
  releaser queueing after its release can come too late to be seen.

A grant can come with the values of records the new holder names (``read=``). A waiter
puts those keys in its queue entry; a release that hands it the lock and writes some of
them passes their values on in the handoff event (they are the records' values as of
the grant: they commit in the write that grants). The rest are read once the lock is
held. So an agent that reads a record under the lock and writes it back with its release
costs one write per turn, and no read.

Round trips. The commit loop's read-then-write costs two; the common paths here cost
one write each, and fall back to the commit loop when a guess was wrong:

* this process remembers what it last learned of each lock (:class:`_Seen`: held or
  free, the newest fencing token, when the holder's lease runs out). Taking a lock it
  believes free is one write that compares the lock absent and the fencing counter at
  the token it knows; joining the line of a lock it believes held is one write that
  compares the lock present. A wrong belief fails that compare and costs one write more;
  it never grants anything;
* a release is one write, which compares the holder record's fencing token with the
  caller's (fails: the grant is gone, ``False``) and the head of the line present
  (fails: it left, try the next). A grant of a free lock rewrites ``lockline/<name>``,
  as every join of the line does: its release compares that record still at the version
  its grant wrote, and so knows without reading that nobody joined (fails: someone did,
  read the line). A waiter that joined before such a grant (its holder's lease ran out,
  and another agent took the lock free) rewrites the record when it finds the lock held
  again after a release or an expiry, so that the holder's next release reads the line
  and hands it the lock. An uncontended take and release are two writes. Finding the
  head of a line costs a scan of it, but not once per handoff: a handoff event names the
  waiters behind the new holder, in order (up to :data:`LINE` of them), and the new
  holder reads just the first of those that is still there, while it holds the lock; if
  that waiter waits in this process, the holder knows its entry without reading it
  (:data:`_waiting`). A line of n waiters costs one scan per :data:`LINE` handoffs
  instead of one per handoff, and decodes at most two entries per handoff instead of n.

Why a named waiter is still the head when the release finds it present: the names come
from a scan sorted by ticket (the version a waiter's entry got when it joined), and
anyone who joined after that scan has a later ticket than every waiter it saw. So the
waiters a handoff names, less the ones that left, are always the front of the line.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentrooms.commit import Change, View
from agentrooms.errors import BadRequest, LockHeld, StaleFence, VersionConflict
from agentrooms.rooms import keys
from agentrooms.rooms.follow import Subscription, follow, following, route, tell
from agentrooms.rooms.scope import Scope
from agentrooms.store.base import Store, seen
from agentrooms.store.types import (
    Absent,
    Append,
    Compare,
    Delete,
    Event,
    FenceAtMost,
    Present,
    Put,
    Record,
    TransactResult,
    VersionIs,
    Write,
)

DEFAULT_TTL = 30.0
WAITER_TTL = 15.0  # a queued waiter refreshes its entry every WAITER_TTL / 3
EXPIRY_SLACK = 0.01  # seconds past a holder's expiry before a waiter looks again
SEEN = 4096  # locks per store handle whose state this process remembers
LINE = 16  # waiters behind the new holder that a handoff event names, in order
NAMED_READ = 2  # named waiters read at once while looking for the first still in line
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

    def guard(self) -> FenceAtMost:
        """A compare that lets a write commit only while this grant is the newest."""
        return FenceAtMost(keys.lock_fence(self.name), self.fence)


@dataclass(frozen=True, slots=True)
class LockInfo:
    name: str
    owner: str
    fence: int
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class _Line:
    """The front of a lock's line: the entry of the longest waiting live agent (``None``:
    nobody waits), and the public ids of the waiters behind it, in order (a prefix of
    the line; they may have left since)."""

    head: Record | None
    behind: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Seen:
    """What this process last learned of a lock: a guess that picks which one-write path
    to try first. A stale guess fails that write's compare; it never grants anything."""

    held: bool
    fence: int  # the newest fencing token seen
    until: float | None = None  # local monotonic time the holder's lease runs out, if known
    # for a grant of ours that came from the line: the front of the line, looked up while
    # we hold the lock, so that our release is one write (the write compares it present)
    line: asyncio.Task[_Line] | None = None
    # for a grant of ours of a free lock: the version it gave ``lockline/<name>``; while
    # that record is unchanged, nobody has joined the line since
    mark: int | None = None


_Rejoin = tuple[dict[str, Any], str]
"""A releaser getting back in line in its handoff: its queue entry, and the entry's key."""

_seen: weakref.WeakKeyDictionary[Store, dict[tuple[str, str], _Seen]] = weakref.WeakKeyDictionary()

_waiting: dict[tuple[Hashable, str, str, str], dict[str, Any]] = {}
"""The queue entries of this process's waiters, by (store identity, room, lock, waiter
id), while they are in line: a holder of this process that finds one of them next in
line hands the lock over without reading the entry (the release still compares it
present in the store, so an entry that left since costs a retry, never a wrong grant)."""


def _check_ttl(ttl: object, what: str = "a lock ttl") -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86_400:
        raise BadRequest(f"{what} must be between 0 and 86400 seconds, got {ttl!r}")
    return float(ttl)


def _check_read(read: object) -> tuple[str, ...]:
    if isinstance(read, str | bytes) or not isinstance(read, Sequence):
        raise BadRequest(f"read must be a list of record keys, got {read!r}")
    wanted = tuple(dict.fromkeys(read))
    if len(wanted) > READ or not all(isinstance(k, str) and k for k in wanted):
        raise BadRequest(f"read must name at most {READ} record keys (non-empty strings)")
    return wanted


def _handed(writes: Sequence[Write], wanted: object) -> dict[str, Any]:
    """The values a handoff passes on with the grant: of the releaser's writes, the puts
    (without expiry) of records the new holder asked for. As of the grant, they are those
    records' values: they commit in the write that grants."""
    if not wanted:
        return {}
    asked = set(wanted) if isinstance(wanted, list) else set()
    handed = {
        w.key: w.value for w in writes if isinstance(w, Put) and w.ttl is None and w.key in asked
    }
    # As they are now, and the grant's own: a waiter of this process is told the event
    # without it being encoded (one read from the log decodes its own).
    return copy.deepcopy(handed)


def _acquiring(name: str, owner: str, ttl: float) -> dict[str, Any]:
    """What a command id of an acquisition stands for (a repeat with another is refused)."""
    return {"op": "lock.acquire", "lock": name, "owner": owner, "ttl": ttl}


def _holder(owner: str, token: str, fence: int, ttl: float) -> dict[str, Any]:
    return {"owner": owner, "token": token, "fence": fence, "ttl": ttl}


def _grant(name: str, holder: dict[str, Any]) -> list[Write]:
    """The writes that make ``holder`` (with its new fencing token) the lock's holder."""
    return [
        Put(keys.lock(name), holder, ttl=holder["ttl"]),
        Put(keys.lock_fence(name), {"fence": holder["fence"]}),
    ]


def _mark(name: str) -> Put:
    """The write that tells a release of the lock that someone took it free or joined its
    line since (its value does not matter, its new version does)."""
    return Put(keys.lock_line(name), 0)


class Locks:
    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    # ------------------------------------------------------------------ what we saw

    def _seen_of(self, name: str) -> _Seen | None:
        return _seen.get(self._scope.store, {}).get((self._scope.room, name))

    def _saw(self, name: str, seen: _Seen) -> None:
        known = _seen.setdefault(self._scope.store, {})
        known.pop((self._scope.room, name), None)  # newest last
        known[(self._scope.room, name)] = seen
        while len(known) > SEEN:
            del known[next(iter(known))]  # the least recently learned: a guess less

    def _saw_grant(self, lock: Lock, store_now: float, mark: int | None = None) -> None:
        until = _local(lock.expires_at, store_now)
        self._saw(lock.name, _Seen(True, lock.fence, until, mark=mark))

    def _lock(self, name: str, value: dict[str, Any], expires_at: float) -> Lock:
        return Lock(
            self._scope.room,
            name,
            value["owner"],
            value["token"],
            value["fence"],
            expires_at,
            value["ttl"],
        )

    # ----------------------------------------------------------------------- taking

    async def try_acquire(
        self,
        name: str,
        owner: str,
        *,
        ttl: float = DEFAULT_TTL,
        read: Sequence[str] = (),
        command_id: str | None = None,
    ) -> Lock:
        """Take the lock now or raise ``LockHeld`` naming the holder. ``read``: records
        the grant comes with (:meth:`wait_acquire`). With ``command_id`` the grant is
        recorded atomically with it: a repeated call returns that grant (token, fence,
        expiry) as the first call got it, whoever holds the lock now, and takes nothing."""
        keys.check_name(name, "lock name")
        keys.check_name(owner, "owner")
        wanted = _check_read(read)
        ttl = _check_ttl(ttl)
        token = uuid.uuid4().hex
        if command_id is None:
            lock = await self._take(name, owner, ttl, token)
        else:
            lock = await self._take_read(name, owner, ttl, token, command_id=command_id)
        return await self._with_values(lock, wanted)

    async def _with_values(self, lock: Lock, wanted: tuple[str, ...]) -> Lock:
        """``lock`` with the values of the records ``wanted``: those its handoff passed
        on (``lock.values``), the rest read now, while we hold it. If that read fails,
        the lock is released (best effort) rather than left held by nobody who knows."""
        if not wanted:
            return lock  # (a handoff passes values on only to a waiter that asked)
        values = {k: lock.values[k] for k in wanted if k in lock.values}
        missing = [k for k in wanted if k not in values]
        if missing:
            try:
                snap = await self._scope.read(missing)
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.release(lock))
                raise
            values.update((r.key, r.value) for r in map(snap.get, missing) if r is not None)
        return replace(lock, values={k: values[k] for k in wanted if k in values})

    async def _take(self, name: str, owner: str, ttl: float, token: str) -> Lock:
        """Take the lock if it is free, else ``LockHeld``: one write when this process
        knows the lock free and its newest fencing token, the commit loop otherwise."""
        seen = self._seen_of(name)
        if seen is not None and not seen.held:
            holder = _holder(owner, token, seen.fence + 1, ttl)
            counter: Compare = (
                FenceAtMost(keys.lock_fence(name), seen.fence)
                if seen.fence
                else Absent(keys.lock_fence(name))
            )
            try:
                done = await self._scope.transact(
                    [Absent(keys.lock(name)), counter], [*_grant(name, holder), _mark(name)]
                )
            except (VersionConflict, StaleFence):
                pass  # taken since, or granted and released elsewhere: read it
            else:
                lock = self._lock(name, holder, done.now + ttl)
                self._saw_grant(lock, done.now, done.versions[keys.lock_line(name)])
                return lock
        return await self._take_read(name, owner, ttl, token)

    async def _take_read(
        self,
        name: str,
        owner: str,
        ttl: float,
        token: str,
        queued: str | None = None,
        command_id: str | None = None,
    ) -> Lock:
        """The commit loop's take: read the lock, grant it if free (removing our queue
        entry ``queued``, if given), raise ``LockHeld`` naming the holder if not. With
        ``command_id``, the grant is recorded with it, and a repeat returns it."""
        seen: list[_Seen] = []

        def take(view: View, _: object) -> Change:
            fence = int((view.get(keys.lock_fence(name)) or {}).get("fence", 0))
            held = view.record(keys.lock(name))
            if held is not None:
                seen[:] = [_Seen(True, fence, _local(held.expires_at, view.now))]
                raise LockHeld(name, held.value["owner"])
            holder = _holder(owner, token, fence + 1, ttl)
            writes = [*_grant(name, holder), _mark(name)]
            if queued is not None and view.exists(queued):
                writes.append(Delete(queued))
            return Change(writes=writes, result={"holder": holder, "now": view.now})

        record_keys = [keys.lock(name), keys.lock_fence(name), *([queued] if queued else [])]
        event = None if command_id is None else _acquiring(name, owner, ttl)
        try:
            done = await self._scope.commit(take, event, record_keys, command_id=command_id)
        except LockHeld:
            self._saw(name, seen[0])
            raise
        now = done.result["now"]
        lock = self._lock(name, done.result["holder"], now + ttl)
        if not done.replayed:  # a replayed grant says nothing of the lock now
            self._saw_grant(lock, now, done.versions[keys.lock_line(name)])
        return lock

    async def acquire(
        self,
        name: str,
        owner: str,
        *,
        ttl: float = DEFAULT_TTL,
        tries: int = 5,
        step: float = 0.15,
        read: Sequence[str] = (),
    ) -> Lock:
        """Try ``tries`` times, waiting ``step``, ``2*step``, ``3*step``... between
        tries (a bounded backoff), then raise ``LockHeld``. ``read``: records
        the grant comes with (:meth:`wait_acquire`)."""
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            raise BadRequest("tries must be a positive integer")
        _check_read(read)
        for attempt in range(1, tries + 1):
            try:
                return await self.try_acquire(name, owner, ttl=ttl, read=read)
            except LockHeld:
                if attempt == tries:
                    raise
                await asyncio.sleep(step * attempt)
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------------- queuing

    async def wait_acquire(
        self,
        name: str,
        owner: str,
        *,
        ttl: float = DEFAULT_TTL,
        timeout: float = 30.0,
        read: Sequence[str] = (),
        command_id: str | None = None,
    ) -> Lock:
        """Queue for the lock (FIFO) and wait up to ``timeout`` seconds for it to be
        handed over; ``LockHeld`` if it was not.

        With ``command_id`` a repeated call returns the grant the first call got (token,
        fence, expiry), whoever holds the lock now, and takes nothing. An immediate grant
        is recorded atomically with it; one handed over after a wait is recorded when
        the handoff reaches the waiter, so a repeat made while the first call still
        waits, or after it died between the handoff and that record, queues anew.

        ``read``: record keys (at most :data:`READ`) whose values the grant comes with,
        in ``lock.values`` (an absent record is left out), as of the grant. A record
        that the previous holder wrote in the release that handed the lock over
        (``release(lock, writes=...)`` or ``requeue``: a put without expiry) comes in
        that write's handoff, with no read; the others are read once the lock is ours.
        Values only: a write under the lock is fenced by the grant (:meth:`Lock.guard`),
        not by the records' versions. The handed values are in the room's log, readable
        by anyone who may read its events: ask only for records you would put there."""
        keys.check_name(name, "lock name")
        keys.check_name(owner, "owner")
        ttl = _check_ttl(ttl)
        deadline = time.monotonic() + _check_ttl(timeout, "a wait timeout")
        wanted = _check_read(read)
        token = uuid.uuid4().hex
        if command_id is not None:
            with contextlib.suppress(LockHeld):  # the first call's grant, or one now
                lock = await self._take_read(name, owner, ttl, token, command_id=command_id)
                return await self._with_values(lock, wanted)
        else:
            seen = self._seen_of(name)
            if seen is None or not seen.held:
                with contextlib.suppress(LockHeld):
                    lock = await self._take(name, owner, ttl, token)
                    return await self._with_values(lock, wanted)

        async def join(entry: dict[str, Any], queued: str) -> Lock | int:
            return await self._join(name, owner, ttl, token, entry, queued)

        lock = await self._queue(name, owner, ttl, token, deadline, join, wanted=wanted)
        if command_id is not None:
            lock = await self._record_grant(lock, command_id)
        return await self._with_values(lock, wanted)

    async def _record_grant(self, lock: Lock, command_id: str) -> Lock:
        """Record a grant handed over after a wait as ``command_id``'s outcome (or, if a
        repeat recorded one first, return that one's)."""
        granted = {
            "holder": _holder(lock.owner, lock.token, lock.fence, lock.ttl),
            "now": lock.expires_at - lock.ttl,
        }

        def record(view: View, _: object) -> Change:
            return Change(result=granted)

        event = _acquiring(lock.name, lock.owner, lock.ttl)
        done = await self._scope.commit(record, event, command_id=command_id)
        if done.result == granted:
            return lock
        return self._lock(lock.name, done.result["holder"], done.result["now"] + lock.ttl)

    async def requeue(
        self,
        lock: Lock,
        *,
        writes: Sequence[Write] = (),
        timeout: float = 30.0,
        read: Sequence[str] = (),
    ) -> Lock:
        """Release ``lock`` and get back in line for it: what ``release`` then
        ``wait_acquire`` do, for an agent that takes a lock turn after turn, but when
        someone is waiting, in one write instead of two: the write that hands the lock to
        the longest waiting agent also puts the caller at the back of the line (FIFO, as
        if it had queued just after its release). ``writes`` commit in the releasing
        write, fenced by ``lock``, as with ``release``. Returns the caller's next grant,
        within ``timeout`` seconds, or raises ``LockHeld``.

        With nobody waiting, it is ``release`` then ``wait_acquire``: the lock falls
        free (a ``lock.released`` event wakes anyone left in line unseen) and the caller
        takes it again, most likely at once. So is a ``lock`` taken while free (not
        handed over from the line), which most likely nobody waits for.

        If ``lock`` had expired or changed hands: ``StaleFence`` with ``writes``
        (nothing is written, the caller is not in line), else the caller queues as
        ``wait_acquire`` would. ``read``: records the next grant comes with, as with
        ``wait_acquire``."""
        writes = list(writes)
        deadline = time.monotonic() + _check_ttl(timeout, "a wait timeout")
        wanted = _check_read(read)
        name, owner, ttl = lock.name, lock.owner, lock.ttl
        seen = self._seen_of(name)
        if seen is not None and seen.fence == lock.fence and seen.mark is not None:
            # a grant of the free lock: most likely nobody waits, so no need to get
            # ready to wait (and if someone joined, the release hands the lock over)
            await self.release(lock, writes=writes)
            left = max(deadline - time.monotonic(), 0.001)
            return await self.wait_acquire(name, owner, ttl=ttl, timeout=left, read=wanted)
        token = uuid.uuid4().hex

        async def join(entry: dict[str, Any], queued: str) -> Lock | int:
            try:
                ticket = await self._let_go(lock, writes, (entry, queued))
            except StaleFence:
                if writes:
                    raise
            else:
                if ticket is not None:
                    return ticket
                with contextlib.suppress(LockHeld):
                    return await self._take(name, owner, ttl, token)
            return await self._join(name, owner, ttl, token, entry, queued)

        # Nobody else in this process follows the room: subscribing would first start
        # the process's reader of the log (a read), and the lock would wait for it. So
        # this one hands over first and subscribes after, then reads the lock once for
        # what it may have missed in between.
        early = not following(self._scope.store, self._scope.room)
        mine = await self._queue(name, owner, ttl, token, deadline, join, early, wanted)
        return await self._with_values(mine, wanted)

    async def _queue(
        self,
        name: str,
        owner: str,
        ttl: float,
        token: str,
        deadline: float,
        join: Callable[[dict[str, Any], str], Awaitable[Lock | int]],
        early: bool = False,
        wanted: tuple[str, ...] = (),
    ) -> Lock:
        """Get in line by ``join`` (the lock, or our ticket), then wait our turn. The
        subscription to the room's log comes first, so every release after the join
        wakes us; with ``early``, it comes after the join, and the lock is read once.
        ``wanted``: records we ask a handoff to pass on (the grant's ``values``)."""
        # The waiter's public name, in its entry's key and in handoff events: not its
        # token, which proves the grant.
        waiter = uuid.uuid4().hex
        entry: dict[str, Any] = {"owner": owner, "token": token, "ttl": ttl, "waiter": waiter}
        if wanted:
            entry["read"] = list(wanted)
        queued = keys.lock_waiter(name, waiter)
        joined = await join(entry, queued) if early else None
        if isinstance(joined, Lock):
            return joined
        # The handoffs that name us, and every release of the lock.
        routes = (("lock.handoff", name, waiter), ("lock.released", name))
        async with follow(self._scope.store, self._scope.room, routes=routes) as woken:
            if joined is None:
                joined = await join(entry, queued)
                if isinstance(joined, Lock):
                    return joined
            entry["ticket"] = joined  # place in line, kept across refreshes
            local = (self._scope.store.identity, self._scope.room, name, waiter)
            _waiting[local] = entry
            try:
                return await self._wait(
                    name, owner, ttl, token, entry, queued, woken, deadline, look=early
                )
            finally:
                if _waiting.get(local) is entry:
                    del _waiting[local]

    async def _wait(
        self,
        name: str,
        owner: str,
        ttl: float,
        token: str,
        entry: dict[str, Any],
        queued: str,
        woken: Subscription,
        deadline: float,
        look: bool = False,
    ) -> Lock:
        """In line: wait for the handoff naming us, reading the lock when a release,
        an expiry or a lost track of the log leaves it in doubt (and first, if
        ``look``)."""
        refresh_at = time.monotonic() + WAITER_TTL / 3
        seen = self._seen_of(name)
        holder_until = None if seen is None or not seen.held else seen.until
        look = look or holder_until is None  # unknown holder expiry: read the lock once
        lost = False  # the lock fell free (or its lease ran out) since we last looked
        while True:
            if look:
                looked = await self._look(name, owner, ttl, token, queued)
                if isinstance(looked, Lock):
                    return looked
                if lost:
                    # Another agent took it first, maybe free: a release of a grant of
                    # the free lock reads the line only if its mark changed since the
                    # grant (see the module's docstring), and we joined before. Changed,
                    # it reads the line and finds us, instead of freeing the lock for
                    # its holder to take again, turn after turn, while we wait.
                    await self._scope.transact(writes=[_mark(name)])
                holder_until, look, lost = looked, False, False
            now = time.monotonic()
            if now >= deadline:
                return await self._give_up(name, owner, token, queued)
            if now >= refresh_at:
                mine = await self._refresh(name, owner, ttl, token, entry, queued)
                if mine is not None:
                    return mine
                refresh_at = time.monotonic() + WAITER_TTL / 3
            wait = min(deadline, refresh_at) - now
            if holder_until is not None:  # a dead holder's lock expires silently
                wait = min(wait, max(0.0, holder_until - now) + EXPIRY_SLACK)
            if not await woken.wait(wait):
                # a deadline or refresh is handled above; a lease that ran out is read
                look = lost = holder_until is not None and time.monotonic() >= holder_until
                continue
            events, _ = woken.take()
            for event in events:
                if event.type == "lock.handoff":  # only ours pass concerns_me
                    # granted in the write that appended this event, at its time by
                    # the store's clock (no need to read the lock back)
                    holder = _holder(owner, token, event.data["fence"], ttl)
                    lock = self._lock(name, holder, event.time + ttl)
                    if handed := event.data.get("handed"):  # the handoff's own copy
                        lock = replace(lock, values=handed)
                    line = self._look_up_line(name, _named(event.data.get("line")))
                    self._saw(name, _Seen(True, lock.fence, time.monotonic() + ttl, line))
                    return lock
            look = lost = True  # released, or the follower lost track: read the lock

    async def _join(
        self, name: str, owner: str, ttl: float, token: str, entry: dict[str, Any], queued: str
    ) -> Lock | int:
        """Get in line for a held lock (one write that compares it present), or take
        it if it is free: the lock, or the ticket (the version our entry got)."""
        entry.pop("ticket", None)  # a new place in line: the ticket is the version
        while True:
            try:
                joined = await self._scope.transact(
                    [Present(keys.lock(name))], [Put(queued, entry, ttl=WAITER_TTL), _mark(name)]
                )
            except VersionConflict as exc:
                if keys.lock(name) not in exc.conflicts:
                    raise
                with contextlib.suppress(LockHeld):
                    return await self._take_read(name, owner, ttl, token)
                continue
            return joined.versions[queued]

    async def _refresh(
        self, name: str, owner: str, ttl: float, token: str, entry: dict[str, Any], queued: str
    ) -> Lock | None:
        """Renew our entry's expiry: ``None``, still in line. The write compares the
        entry present, so that a refresh racing the handoff that deleted it cannot put it
        back (the new holder would find itself at the head of the line). If it is gone,
        we were handed the lock (returned), or dropped out of the line by stalling past
        ``WAITER_TTL``: then we get in line again, at the back."""
        try:
            await self._scope.transact([Present(queued)], [Put(queued, entry, ttl=WAITER_TTL)])
        except VersionConflict:
            pass
        else:
            return None
        looked = await self._look(name, owner, ttl, token, queued)
        if isinstance(looked, Lock):
            return looked
        joined = await self._join(name, owner, ttl, token, entry, queued)
        if isinstance(joined, Lock):
            return joined
        entry["ticket"] = joined
        return None

    async def _look(
        self, name: str, owner: str, ttl: float, token: str, queued: str
    ) -> Lock | float | None:
        """Read the lock: ours (handed over), or free and now taken, or held by another
        until a local monotonic time (``None``: without expiry)."""
        while True:
            snap = await self._scope.read([keys.lock(name)])
            held = snap.get(keys.lock(name))
            if held is not None and held.value["token"] == token:
                return self._lock(name, held.value, held.expires_at or snap.now + ttl)
            if held is not None:
                return _local(held.expires_at, snap.now)
            with contextlib.suppress(LockHeld):
                return await self._take_read(name, owner, ttl, token, queued)

    async def _give_up(self, name: str, owner: str, token: str, queued: str) -> Lock:
        await self._scope.transact(writes=[Delete(queued)])
        snap = await self._scope.read([keys.lock(name)])
        held = snap.get(keys.lock(name))
        if held is not None and held.value["token"] == token:
            # handed over while we were leaving the queue: it is ours after all
            return self._lock(name, held.value, held.expires_at or snap.now)
        raise LockHeld(name, None if held is None else held.value["owner"])

    # -------------------------------------------------------------------- releasing

    async def release(self, lock: Lock, *, writes: Sequence[Write] = ()) -> bool:
        """Release if ``lock`` is still the current grant, handing it to the longest
        waiting queued agent; ``False`` if it had expired or changed hands (the new
        holder's lock is left untouched).

        ``writes`` (the holder's last writes) commit in the same atomic write as the
        release, fenced by this grant: one round trip instead of two, and they land only
        if the lock was still this grant's. If it was not, nothing is written and
        ``StaleFence`` is raised instead of returning ``False``."""
        writes = list(writes)
        try:
            await self._let_go(lock, writes)
        except StaleFence:
            if writes:
                raise
            return False
        return True

    async def _let_go(
        self, lock: Lock, writes: list[Write], rejoin: _Rejoin | None = None
    ) -> int | None:
        """Release ``lock`` (``StaleFence`` if it is no longer the current grant) with
        ``writes``, handing it to the head of the line. With ``rejoin``, a handoff also
        puts the releaser back in line: its ticket (``None``: nobody was in line, and the
        lock is free)."""
        seen = self._seen_of(lock.name)
        if seen is None or seen.fence != lock.fence:
            seen = None
        # Nobody joined since our grant of the free lock (if that record is unchanged):
        # release it without reading the line. Else the line's front, looked up.
        extra: list[Compare] = []
        if seen is not None and seen.mark is not None:
            line, extra = _Line(None), [VersionIs(keys.lock_line(lock.name), seen.mark)]
        else:
            line = await self._front(lock.name, None if seen is None else seen.line)
        while True:
            try:
                done = await self._release(lock, line, writes, extra, rejoin)
            except StaleFence:
                await self._scope.read([])  # NotFound if the room itself is gone
                raise
            except VersionConflict as exc:
                if extra and keys.lock_line(lock.name) in exc.conflicts:
                    line, extra = await self._front(lock.name), []  # someone joined
                    continue
                if line.head is None or line.head.key not in exc.conflicts:
                    raise
                # the head left between the lookup and the write: the next one named
                line = await self._next_of(lock.name, line.behind)
                continue
            if line.head is None:
                self._saw(lock.name, _Seen(False, lock.fence))
                return None
            ttl = line.head.value["ttl"]
            self._saw(lock.name, _Seen(True, lock.fence + 1, time.monotonic() + ttl))
            return None if rejoin is None else done.versions[rejoin[1]]

    async def _release(
        self,
        lock: Lock,
        line: _Line,
        writes: list[Write],
        compares: list[Compare],
        rejoin: _Rejoin | None = None,
    ) -> TransactResult:
        """One write: release ``lock`` (its holder record still carries its fencing
        token, or ``StaleFence``), handing it to the waiter at the head of ``line`` if it
        is still there (else ``VersionConflict`` naming it), with ``writes``, if
        ``compares`` hold (else ``VersionConflict``). With ``rejoin`` (the releaser's
        queue entry and its key), a handoff also puts the releaser's entry in line."""
        mine = FenceAtMost(keys.lock(lock.name), lock.fence)
        head = line.head
        if head is None:
            data: dict[str, Any] = {"lock": lock.name, "owner": lock.owner}
            done = await self._scope.transact(
                [mine, *compares],
                [*writes, Delete(keys.lock(lock.name))],
                [Append("lock.released", data)],
            )
            self._tell(Event(done.seqs[0], "lock.released", data, done.now))
            return done
        nxt = head.value
        # While ``mine`` holds, the counter is at our token: the next one is ours + 1.
        holder = _holder(nxt["owner"], nxt["token"], lock.fence + 1, nxt["ttl"])
        data = {
            "lock": lock.name,
            "from": lock.owner,
            "to": nxt["owner"],
            "fence": holder["fence"],
            "ticket": nxt.get("ticket", head.version),
            "waiter": nxt.get("waiter"),
            "line": list(line.behind[:LINE]),
        }
        if handed := _handed(writes, nxt.get("read")):
            data["handed"] = handed
        # Rejoining, the releaser's entry goes in last: its ticket (the version this
        # write gives it) is later than every waiter's in line.
        back = [] if rejoin is None else [Put(rejoin[1], rejoin[0], ttl=WAITER_TTL)]
        done = await self._scope.transact(
            [mine, Present(head.key), *compares],
            [*writes, *_grant(lock.name, holder), Delete(head.key), *back],
            [Append("lock.handoff", data)],
        )
        self._tell(Event(done.seqs[0], "lock.handoff", data, done.now))
        return done

    def _tell(self, event: Event) -> None:
        """The waiters of this process learn of ``event`` now, not when the reader of the
        log gets it."""
        tell(self._scope.store, self._scope.room, [event])

    def _look_up_line(self, name: str, named: tuple[str, ...]) -> asyncio.Task[_Line]:
        task = asyncio.get_running_loop().create_task(self._next_of(name, named))
        task.add_done_callback(seen)  # a failure costs the release one scan
        return task

    async def _front(self, name: str, ahead: asyncio.Task[_Line] | None = None) -> _Line:
        """The front of the line: ``ahead`` (the lookup started while the lock was held)
        if it found a head, else a scan of the line."""
        if ahead is not None and ahead.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(Exception):
                found = await ahead
                if found.head is not None:
                    return found
        return await self._scan_line(name)

    async def _next_of(self, name: str, named: tuple[str, ...]) -> _Line:
        """The front of the line, given ``named``: waiters known to be its front, in
        order (from a handoff event, or left over from a lookup). The first of them still
        in line is the head (see the module's docstring); when none is, scan."""
        identity, room = self._scope.store.identity, self._scope.room
        while named:
            local = _waiting.get((identity, room, name, named[0]), {})
            if "ticket" in local:  # in line in this process: no need to read its entry
                key = keys.lock_waiter(name, named[0])
                return _Line(Record(key, dict(local), local["ticket"]), named[1:])
            batch, named = named[:NAMED_READ], named[NAMED_READ:]
            entries = [keys.lock_waiter(name, waiter) for waiter in batch]
            snap = await self._scope.read(entries)
            for i, key in enumerate(entries):
                record = snap.get(key)
                if record is not None:
                    return _Line(record, (*batch[i + 1 :], *named))
        return await self._scan_line(name)

    async def _scan_line(self, name: str) -> _Line:
        """The whole line, read: its head is the entry of the longest waiting live agent
        (lowest ticket). Only the head is compared in the release's write, so other
        waiters refreshing their entries or joining meanwhile do not make it conflict; a
        waiter that joins after the scan has a later ticket anyway."""
        queue = keys.lock_queue(name)
        page = await self._scope.store.scan(self._scope.room, queue, None, 1000)
        if not page.records:
            return _Line(None)
        ordered = sorted(page.records, key=lambda r: (r.value.get("ticket", r.version), r.key))
        return _Line(ordered[0], tuple(r.key[len(queue) :] for r in ordered[1 : LINE + 1]))

    # ------------------------------------------------------------------- the rest

    async def extend(self, lock: Lock, ttl: float | None = None) -> Lock:
        """Extend a lock still held by this grant (its token is on the holder record);
        ``StaleFence`` if it expired or changed hands."""
        length = _check_ttl(ttl if ttl is not None else lock.ttl)
        holder = _holder(lock.owner, lock.token, lock.fence, length)

        def extend(view: View, _: None) -> Change:
            held = view.get(keys.lock(lock.name))
            if held is None or held["token"] != lock.token or held["fence"] != lock.fence:
                current = None if held is None else held["fence"]
                raise StaleFence(keys.lock(lock.name), lock.fence, current)
            return Change(
                writes=[Put(keys.lock(lock.name), holder, ttl=length)],
                result=view.now + length,
            )

        done = await self._scope.commit(extend, None, [keys.lock(lock.name)])
        extended = self._lock(lock.name, holder, done.result)
        until = time.monotonic() + length
        seen = self._seen_of(lock.name)
        if seen is not None and seen.fence == lock.fence:  # keep what the release will use
            self._saw(lock.name, replace(seen, held=True, until=until))
        else:
            self._saw(lock.name, _Seen(True, lock.fence, until))
        return extended

    async def holder(self, name: str) -> LockInfo | None:
        keys.check_name(name, "lock name")
        record = (await self._scope.read([keys.lock(name)])).get(keys.lock(name))
        if record is None:
            return None
        return LockInfo(name, record.value["owner"], record.value["fence"], record.expires_at)

    @contextlib.asynccontextmanager
    async def hold(
        self,
        name: str,
        owner: str,
        *,
        ttl: float = DEFAULT_TTL,
        tries: int = 5,
        step: float = 0.15,
        queue_timeout: float | None = None,
        read: Sequence[str] = (),
    ) -> AsyncIterator[Lock]:
        """``async with locks.hold("plan", me) as lock:`` — released even if the body
        raises. With ``queue_timeout`` it queues (``wait_acquire``) instead of polling.
        ``read``: records the grant comes with (:meth:`wait_acquire`)."""
        if queue_timeout is None:
            lock = await self.acquire(name, owner, ttl=ttl, tries=tries, step=step, read=read)
        else:
            lock = await self.wait_acquire(name, owner, ttl=ttl, timeout=queue_timeout, read=read)
        try:
            yield lock
        finally:
            await self.release(lock)


def _lock_route(event: Event) -> tuple[str, ...] | None:
    """A waiter's route (:func:`.follow.route`) of a lock event: its type and lock, and
    for a handoff the waiter it names (``None``: not a lock's event after all)."""
    data = event.data
    if not isinstance(data, dict) or not isinstance(lock := data.get("lock"), str):
        return None
    if event.type == "lock.released":
        return (event.type, lock)
    waiter = data.get("waiter")
    return (event.type, lock, waiter) if isinstance(waiter, str) else None


route("lock.handoff", _lock_route)
route("lock.released", _lock_route)


def _local(expires_at: float | None, store_now: float) -> float | None:
    """The local monotonic time of a store-clock expiry (``None``: it never expires)."""
    return None if expires_at is None else time.monotonic() + max(0.0, expires_at - store_now)


def _named(line: object) -> tuple[str, ...]:
    """The waiter ids a handoff event names (nothing, from a writer that named none)."""
    if not isinstance(line, list):
        return ()
    return tuple(waiter for waiter in line if isinstance(waiter, str))
