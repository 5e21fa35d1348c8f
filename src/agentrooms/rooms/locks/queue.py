"""The queue on top of the lock core: FIFO waiting, handoff, ``requeue`` and ``hold``.

A waiter puts its entry ``lockq/<name>/<waiter>`` (refreshed every :data:`WAITER_TTL` / 3,
so a dead waiter drops out; it keeps the store time it joined the line) and waits on the
room's log. A release hands the lock to the
head of the line in the same atomic write and appends a ``lock.handoff`` event naming the
waiter, which wakes only that waiter; a ``lock.released`` or a lease that ran out wakes
every waiter of the lock to read it. ``requeue`` releases and puts the releaser back in
line in one write.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentrooms.commit import Change, View
from agentrooms.errors import LockHeld, StaleFence, VersionConflict
from agentrooms.metrics import operator_metrics
from agentrooms.rooms import keys
from agentrooms.rooms.follow import Subscription, follow, following, route
from agentrooms.rooms.locks import line as lines
from agentrooms.rooms.locks.core import LockCore
from agentrooms.rooms.locks.records import (
    DEFAULT_TTL,
    Claim,
    Lock,
    WaiterInfo,
    acquiring,
    check_read,
    check_ttl,
    holder_value,
    local_time,
    mark,
    new_claim,
)
from agentrooms.store.types import Delete, Event, Present, Put, Record, Write

WAITER_TTL = 15.0  # a queued waiter refreshes its entry every WAITER_TTL / 3
EXPIRY_SLACK = 0.01  # seconds past a holder's expiry before a waiter looks again


@dataclass(slots=True)
class _Waiter:
    """One agent in line: its claim, its entry (with its ticket, once in line) and key."""

    claim: Claim
    id: str  # its public name, in its entry's key and in handoff events (not its token)
    entry: dict[str, Any]

    @property
    def key(self) -> str:
        return keys.lock_waiter(self.claim.name, self.id)

    def put(self) -> Put:
        return Put(self.key, self.entry, ttl=WAITER_TTL)


_Join = Callable[[_Waiter], Awaitable[Lock | int]]
"""Gets a waiter in line: the lock (taken free, or handed back), or the waiter's ticket
(having set the entry's ``joined_at``)."""


def _waiter_info(queue: str, record: Record) -> WaiterInfo:
    """A line entry as read. Before its first refresh an entry may lack ``joined_at``
    (the write that put it in line could not know its own store time): that write set
    its expiry to its store time plus :data:`WAITER_TTL`, which gives it."""
    value = record.value
    joined = value.get("joined_at")
    if joined is None and record.expires_at is not None:
        joined = record.expires_at - WAITER_TTL
    return WaiterInfo(
        record.key[len(queue) :],
        value["owner"],
        int(value.get("ticket", record.version)),
        joined,
        record.expires_at,
    )


class Locks(LockCore):
    """The locks of one room: the core's grants, and waiting for them in line."""

    async def waiters(self, name: str, limit: int = 1000) -> list[WaiterInfo]:
        """The agents in the lock's line, first in line first, at most ``limit`` (one
        scan; entries of waiters that stopped refreshing have lapsed and are not there)."""
        keys.check_name(name, "lock name")
        queue = keys.lock_queue(name)
        await self._scope.read([])
        page = await self._scope.store.scan(self._scope.room, queue, None, limit)
        found = [_waiter_info(queue, r) for r in page.records]
        return sorted(found, key=lambda w: (w.ticket, w.waiter))

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

        ``read``: record keys (at most :data:`~.core.READ`) whose values the grant comes
        with, in ``lock.values`` (an absent record is left out), as of the grant. A record
        that the previous holder wrote in the release that handed the lock over
        (``release(lock, writes=...)`` or ``requeue``: a put without expiry) comes in
        that write's handoff, with no read; the others are read once the lock is ours.
        Values only: a write under the lock is fenced by the grant (:meth:`Lock.guard`),
        not by the records' versions. The handed values are in the room's log, readable
        by anyone who may read its events: ask only for records you would put there."""
        claim = new_claim(name, owner, ttl)
        deadline = time.monotonic() + check_ttl(timeout, "a wait timeout")
        wanted = check_read(read)
        if command_id is not None:
            with contextlib.suppress(LockHeld):  # the first call's grant, or one now
                lock = await self._take_read(claim, command_id=command_id)
                return await self._with_values(lock, wanted)
        elif not self._known.believes_held(self._scope.room, name):
            with contextlib.suppress(LockHeld):
                return await self._with_values(await self._take(claim), wanted)
        lock = await self._queue(claim, deadline, self._join, wanted=wanted)
        if command_id is not None:
            lock = await self._record_grant(lock, command_id)
        return await self._with_values(lock, wanted)

    async def _record_grant(self, lock: Lock, command_id: str) -> Lock:
        """Record a grant handed over after a wait as ``command_id``'s outcome (or, if a
        repeat recorded one first, return that one's)."""
        granted = {
            "holder": holder_value(lock.owner, lock.token, lock.fence, lock.ttl),
            "now": lock.expires_at - lock.ttl,
        }

        def record(view: View, _: object) -> Change:
            return Change(result=granted)

        event = acquiring(lock.name, lock.owner, lock.ttl)
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
        takes it again, most likely at once. A ``lock`` taken while free is no exception:
        if someone joined the line since, the releasing write hands it over and puts the
        caller behind them, so no agent that was waiting is overtaken.

        If ``lock`` had expired or changed hands: ``StaleFence`` with ``writes``
        (nothing is written, the caller is not in line), else the caller queues as
        ``wait_acquire`` would. ``read``: records the next grant comes with, as with
        ``wait_acquire``."""
        writes = list(writes)
        deadline = time.monotonic() + check_ttl(timeout, "a wait timeout")
        wanted = check_read(read)
        claim = Claim(lock.name, lock.owner, lock.ttl, uuid.uuid4().hex)

        async def join(waiter: _Waiter) -> Lock | int:
            try:
                waiter.entry.pop("joined_at", None)  # known once the write is in
                rejoined = await self._let_go(lock, writes, waiter.put())
            except StaleFence:
                if writes:
                    raise
            else:
                if rejoined is not None:
                    ticket, waiter.entry["joined_at"] = rejoined
                    return ticket
                with contextlib.suppress(LockHeld):
                    return await self._take(claim)
            return await self._join(waiter)

        # Nobody else in this process follows the room: subscribing would first start
        # the process's reader of the log (a read), and the lock would wait for it. So
        # this one hands over first and subscribes after, then reads the lock once for
        # what it may have missed in between.
        early = not following(self._scope.store, self._scope.room)
        mine = await self._queue(claim, deadline, join, early, wanted)
        return await self._with_values(mine, wanted)

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

    # ------------------------------------------------------------------- in line

    async def _queue(
        self,
        claim: Claim,
        deadline: float,
        join: _Join,
        early: bool = False,
        wanted: tuple[str, ...] = (),
    ) -> Lock:
        """Get in line by ``join``, then wait our turn. The subscription to the room's log
        comes first, so every release after the join wakes us; with ``early``, it comes
        after the join, and the lock is read once. ``wanted``: records we ask a handoff
        to pass on (the grant's ``values``)."""
        entry: dict[str, Any] = {"owner": claim.owner, "token": claim.token, "ttl": claim.ttl}
        waiter = _Waiter(claim, uuid.uuid4().hex, entry)
        entry["waiter"] = waiter.id
        if wanted:
            entry["read"] = list(wanted)
        joined = await join(waiter) if early else None
        if isinstance(joined, Lock):
            return joined
        # The handoffs that name us, and every release of the lock.
        routes = (("lock.handoff", claim.name, waiter.id), ("lock.released", claim.name))
        async with follow(self._scope.store, self._scope.room, routes=routes) as woken:
            if joined is None:
                joined = await join(waiter)
                if isinstance(joined, Lock):
                    return joined
            entry["ticket"] = joined  # place in line, kept across refreshes
            with (
                self._known.waiting(self._scope.room, claim.name, waiter.id, entry),
                operator_metrics().waiting(),
            ):
                return await self._wait(waiter, woken, deadline, early)

    async def _wait(
        self, waiter: _Waiter, woken: Subscription, deadline: float, look: bool
    ) -> Lock:
        """In line: wait for the handoff naming us, reading the lock when a release,
        an expiry or a lost track of the log leaves it in doubt (and first, if
        ``look``, or if the holder's lease is not known)."""
        name = waiter.claim.name
        refresh_at = time.monotonic() + WAITER_TTL / 3
        holder_until = self._known.holder_until(self._scope.room, name)
        look = look or holder_until is None
        lost = False  # the lock fell free (or its lease ran out) since we last looked
        while True:
            if look:
                looked = await self._look(waiter)
                if isinstance(looked, Lock):
                    return looked
                if lost:
                    # Another agent took it first, maybe free, and its release reads the
                    # line only if the mark changed since its grant: change it, so that
                    # release hands the lock to us (docs/why-locks.md).
                    await self._scope.transact(writes=[mark(name)])
                holder_until, look, lost = looked, False, False
            now = time.monotonic()
            if now >= deadline:
                return await self._give_up(waiter)
            if now >= refresh_at:
                mine = await self._refresh(waiter)
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
                if event.type == "lock.handoff":  # only the handoffs naming us are routed
                    return self._handed_to(waiter.claim, event)
            look = lost = True  # released, or the follower lost track: read the lock

    def _handed_to(self, claim: Claim, event: Event) -> Lock:
        """Our grant, from the handoff event that made it (in the write that appended
        the event, at its time by the store's clock: no need to read the lock back)."""
        lock = self._lock(claim.name, claim.holder(event.data["fence"]), event.time + claim.ttl)
        if passed := event.data.get("handed"):  # the handoff's own copy
            lock = replace(lock, values=passed)
        behind = lines.named(event.data.get("line"))
        self._known.handed(
            lock, lambda: lines.next_of(self._scope, self._known, claim.name, behind)
        )
        return lock

    async def _join(self, waiter: _Waiter) -> Lock | int:
        """Get in line for a held lock (one write that compares it present, and changes
        the mark), or take it if it is free: the lock, or our ticket (the entry's version)."""
        claim = waiter.claim
        waiter.entry.pop("ticket", None)  # a new place in line: the ticket is the version
        waiter.entry.pop("joined_at", None)  # and its time that of the write
        while True:
            try:
                joined = await self._scope.transact(
                    [Present(keys.lock(claim.name))], [waiter.put(), mark(claim.name)]
                )
            except VersionConflict as exc:
                if keys.lock(claim.name) not in exc.conflicts:
                    raise
                with contextlib.suppress(LockHeld):
                    return await self._take_read(claim)
                continue
            waiter.entry["joined_at"] = joined.now
            return joined.versions[waiter.key]

    async def _refresh(self, waiter: _Waiter) -> Lock | None:
        """Renew our entry's expiry: ``None``, still in line. The write compares the
        entry present, so that a refresh racing the handoff that deleted it cannot put it
        back (the new holder would find itself at the head of the line). If it is gone,
        we were handed the lock (returned), or dropped out of the line by stalling past
        ``WAITER_TTL``: then we get in line again, at the back."""
        try:
            await self._scope.transact([Present(waiter.key)], [waiter.put()])
        except VersionConflict:
            pass
        else:
            return None
        looked = await self._look(waiter)
        if isinstance(looked, Lock):
            return looked
        joined = await self._join(waiter)
        if isinstance(joined, Lock):
            return joined
        waiter.entry["ticket"] = joined
        return None

    async def _look(self, waiter: _Waiter) -> Lock | float | None:
        """Read the lock: ours (handed over), or free and now taken, or held by another
        until a local monotonic time (``None``: without expiry)."""
        claim = waiter.claim
        while True:
            snap = await self._scope.read([keys.lock(claim.name)])
            held = snap.get(keys.lock(claim.name))
            if held is not None and held.value["token"] == claim.token:
                return self._lock(claim.name, held.value, held.expires_at or snap.now + claim.ttl)
            if held is not None:
                return local_time(held.expires_at, snap.now)
            with contextlib.suppress(LockHeld):
                return await self._take_read(claim, waiter.key)

    async def _give_up(self, waiter: _Waiter) -> Lock:
        claim = waiter.claim
        await self._scope.transact(writes=[Delete(waiter.key)])
        snap = await self._scope.read([keys.lock(claim.name)])
        held = snap.get(keys.lock(claim.name))
        if held is not None and held.value["token"] == claim.token:
            # handed over while we were leaving the queue: it is ours after all
            return self._lock(claim.name, held.value, held.expires_at or snap.now)
        raise LockHeld(claim.name, None if held is None else held.value["owner"])


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
