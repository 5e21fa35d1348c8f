"""Named locks: TTL, owner-checked release and extend, a fencing token on every grant.

The holder record ``lock/<name>`` expires with the lock's TTL (by the store's clock); its
fencing counter lives apart in ``lockfence/<name>``, which never expires, so tokens keep
increasing across expiries and releases. Every grant carries a random token; release and
extend act only while the holder record still carries the caller's token, so a holder
whose lock expired and was taken by someone else cannot touch the new holder's lock.

Two ways to wait for a held lock:

* ``acquire`` retries with growing sleeps (seed 000: 5 tries, 150 ms steps), then
  raises ``LockHeld``. Simple, but under contention the lock sits idle while every
  waiter sleeps, and an unlucky waiter can starve.
* ``wait_acquire`` queues: the waiter registers ``lockq/<name>/<token>`` and waits on
  the room's log; ``release`` hands the lock straight to the longest waiting live agent
  in the same atomic write (FIFO, no idle gap, no thundering herd of writers), and says
  so in its ``lock.handoff`` event, naming the waiter's place in line (its ticket). The
  waiters of one process share one reader of the log (:mod:`.follow`), and only the
  waiter named by the handoff, or every waiter of a ``lock.released``, wakes up: a
  handoff costs one read, not one per waiter. A waiter that dies stops refreshing its
  entry and drops out; a holder that dies lets its lock expire, and the waiters take it
  then.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from agentrooms.commit import Change, View
from agentrooms.errors import BadRequest, LockHeld, StaleFence
from agentrooms.rooms import keys
from agentrooms.rooms.follow import follow
from agentrooms.rooms.scope import Scope
from agentrooms.store.base import Append, Delete, Event, FenceAtMost, Put, Write

DEFAULT_TTL = 30.0
WAITER_TTL = 15.0  # a queued waiter refreshes its entry every WAITER_TTL / 3


@dataclass(frozen=True, slots=True)
class Lock:
    room: str
    name: str
    owner: str
    token: str  # random, unique to this grant
    fence: int
    expires_at: float  # store clock
    ttl: float

    def guard(self) -> FenceAtMost:
        """A compare that lets a write commit only while this grant is the newest."""
        return FenceAtMost(keys.lock_fence(self.name), self.fence)


@dataclass(frozen=True, slots=True)
class _InLine:
    """A queued waiter's place: its ticket (the version its entry was created with)."""

    ticket: int


@dataclass(frozen=True, slots=True)
class LockInfo:
    name: str
    owner: str
    fence: int
    expires_at: float | None


def _check_ttl(ttl: object, what: str = "a lock ttl") -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86_400:
        raise BadRequest(f"{what} must be between 0 and 86400 seconds, got {ttl!r}")
    return float(ttl)


def _grant(view: View, name: str, owner: str, token: str, ttl: float) -> tuple[list[Write], int]:
    """The writes that make ``owner`` the holder, and the new fencing token."""
    fence = int((view.get(keys.lock_fence(name)) or {}).get("fence", 0)) + 1
    holder = {"owner": owner, "token": token, "fence": fence, "ttl": ttl}
    return [
        Put(keys.lock(name), holder, ttl=ttl),
        Put(keys.lock_fence(name), {"fence": fence}),
    ], fence


class Locks:
    def __init__(self, scope: Scope) -> None:
        self._scope = scope

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

    async def try_acquire(
        self, name: str, owner: str, *, ttl: float = DEFAULT_TTL, _token: str | None = None
    ) -> Lock:
        """Take the lock now or raise ``LockHeld`` naming the holder."""
        keys.check_name(name, "lock name")
        keys.check_name(owner, "owner")
        token = _token or uuid.uuid4().hex
        taken = await self._take(name, owner, _check_ttl(ttl), token, None)
        assert isinstance(taken, Lock)
        return taken

    async def _take(
        self,
        name: str,
        owner: str,
        ttl: float,
        token: str,
        join: dict[str, Any] | None,
        *,
        in_line: bool = False,
    ) -> Lock | _InLine:
        """Take the lock if it is free; if it is held, raise ``LockHeld``, or with a
        queue entry ``join``, get in line in the same write (so no release can pass
        between finding the lock held and joining). ``in_line``: the caller may have a
        queue entry, which a grant removes (only then is the entry read: a fresh
        token has none, and reading a key that is absent costs a compare)."""
        queued = keys.lock_waiter(name, token)

        def take(view: View, _: None) -> Change:
            held = view.record(keys.lock(name))
            if held is None:
                writes, fence = _grant(view, name, owner, token, ttl)
                if in_line and view.exists(queued):
                    writes.append(Delete(queued))
                return Change(writes=writes, result={"fence": fence, "expires_at": view.now + ttl})
            if join is None:
                raise LockHeld(name, held.value["owner"])
            return Change(writes=[Put(queued, join, ttl=WAITER_TTL)], result={"queued": True})

        done = await self._scope.commit(
            take, None, [keys.lock(name), keys.lock_fence(name), *([queued] if in_line else [])]
        )
        if "fence" in done.result:
            holder = {"owner": owner, "token": token, "fence": done.result["fence"], "ttl": ttl}
            return self._lock(name, holder, done.result["expires_at"])
        return _InLine(done.versions[queued])

    async def acquire(
        self,
        name: str,
        owner: str,
        *,
        ttl: float = DEFAULT_TTL,
        tries: int = 5,
        step: float = 0.15,
    ) -> Lock:
        """Try ``tries`` times, waiting ``step``, ``2*step``, ``3*step``... between
        tries (seed 000's bounded backoff), then raise ``LockHeld``."""
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            raise BadRequest("tries must be a positive integer")
        for attempt in range(1, tries + 1):
            try:
                return await self.try_acquire(name, owner, ttl=ttl)
            except LockHeld:
                if attempt == tries:
                    raise
                await asyncio.sleep(step * attempt)
        raise AssertionError("unreachable")

    async def wait_acquire(
        self, name: str, owner: str, *, ttl: float = DEFAULT_TTL, timeout: float = 30.0
    ) -> Lock:
        """Queue for the lock (FIFO) and wait up to ``timeout`` seconds for it to be
        handed over; ``LockHeld`` if it was not."""
        keys.check_name(name, "lock name")
        keys.check_name(owner, "owner")
        ttl = _check_ttl(ttl)
        timeout = _check_ttl(timeout, "a wait timeout")
        token = uuid.uuid4().hex
        entry: dict[str, Any] = {"owner": owner, "token": token, "ttl": ttl}
        queued = keys.lock_waiter(name, token)
        taken = await self._take(name, owner, ttl, token, entry)
        if isinstance(taken, Lock):
            return taken
        entry["ticket"] = taken.ticket  # place in line, kept across refreshes
        deadline = time.monotonic() + timeout
        refresh_at = time.monotonic() + WAITER_TTL / 3

        def concerns_me(event: Event) -> bool:
            data = event.data
            if not isinstance(data, dict) or data.get("lock") != name:
                return False
            if event.type == "lock.released":
                return True
            return event.type == "lock.handoff" and data.get("ticket") == taken.ticket

        async with follow(self._scope.store, self._scope.room, concerns_me) as woken:
            # Subscribed only now: a release since we joined is caught by reading the
            # lock once more (every later one wakes us); then only events for this lock
            # and this waiter do.
            while True:
                snap = await self._scope.read([keys.lock(name)])
                held = snap.get(keys.lock(name))
                if held is not None and held.value["token"] == token:
                    return self._lock(name, held.value, held.expires_at or snap.now + ttl)
                if held is None:
                    with contextlib.suppress(LockHeld):
                        lock = await self._take(name, owner, ttl, token, None, in_line=True)
                        assert isinstance(lock, Lock)
                        return lock
                    continue
                now = time.monotonic()
                if now >= deadline:
                    return await self._give_up(name, owner, token, queued)
                if now >= refresh_at:
                    await self._scope.transact(writes=[Put(queued, entry, ttl=WAITER_TTL)])
                    refresh_at = now + WAITER_TTL / 3
                wait = min(deadline, refresh_at) - now
                if held.expires_at is not None:  # a dead holder's lock expires silently
                    wait = min(wait, max(0.0, held.expires_at - snap.now) + 0.01)
                if await woken.wait(wait):
                    for event in woken.take()[0]:
                        if event.type == "lock.handoff":  # only ours pass concerns_me
                            # granted in the write that appended this event, at its time
                            # by the store's clock (no need to read the lock back)
                            holder = {**entry, "fence": event.data["fence"]}
                            return self._lock(name, holder, event.time + ttl)

    async def _give_up(self, name: str, owner: str, token: str, queued: str) -> Lock:
        await self._scope.transact(writes=[Delete(queued)])
        snap = await self._scope.read([keys.lock(name)])
        held = snap.get(keys.lock(name))
        if held is not None and held.value["token"] == token:
            # handed over while we were leaving the queue: it is ours after all
            return self._lock(name, held.value, held.expires_at or snap.now)
        raise LockHeld(name, None if held is None else held.value["owner"])

    async def release(self, lock: Lock) -> bool:
        """Release if ``lock`` is still the current grant, handing it to the longest
        waiting queued agent; ``False`` if it had expired or changed hands (the new
        holder's lock is left untouched)."""
        while True:
            head = await self._head(lock.name)
            read = [keys.lock(lock.name), keys.lock_fence(lock.name), *([head] if head else [])]
            result = await self._scope.commit(partial(_release, lock=lock), head, read)
            if result.result is not None:
                released: bool = result.result
                return released
            # the head of the line left between the scan and the write: look again

    async def _head(self, name: str) -> str | None:
        """The queue entry of the longest waiting live agent (lowest ticket), if any.

        Only this entry is read into the release's write, so other waiters refreshing
        their entries or joining meanwhile do not make it conflict; a waiter that joins
        after the scan has a later ticket anyway."""
        page = await self._scope.store.scan(self._scope.room, keys.lock_queue(name), None, 1000)
        line = [(r.value.get("ticket", r.version), r.key) for r in page.records]
        return min(line)[1] if line else None

    async def extend(self, lock: Lock, ttl: float | None = None) -> Lock:
        """Extend a lock still held by this grant (its token is on the holder record);
        ``StaleFence`` if it expired or changed hands."""
        length = _check_ttl(ttl if ttl is not None else lock.ttl)
        holder = {"owner": lock.owner, "token": lock.token, "fence": lock.fence, "ttl": length}

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
        return self._lock(lock.name, holder, done.result)

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
    ) -> AsyncIterator[Lock]:
        """``async with locks.hold("plan", me) as lock:`` — released even if the body
        raises. With ``queue_timeout`` it queues (``wait_acquire``) instead of polling."""
        if queue_timeout is None:
            lock = await self.acquire(name, owner, ttl=ttl, tries=tries, step=step)
        else:
            lock = await self.wait_acquire(name, owner, ttl=ttl, timeout=queue_timeout)
        try:
            yield lock
        finally:
            await self.release(lock)


def _release(view: View, head: str | None, *, lock: Lock) -> Change:
    """Release ``lock``, handing it to the waiter whose entry is ``head``; result
    ``False`` if ``lock`` no longer holds, ``None`` if ``head`` has left the line."""
    held = view.get(keys.lock(lock.name))
    if held is None or held["token"] != lock.token:
        return Change(result=False)
    if head is None:
        return Change(
            writes=[Delete(keys.lock(lock.name))],
            appends=[Append("lock.released", {"lock": lock.name, "owner": lock.owner})],
            result=True,
        )
    record = view.record(head)
    if record is None:
        return Change(result=None)
    nxt = record.value
    writes, fence = _grant(view, lock.name, nxt["owner"], nxt["token"], nxt["ttl"])
    data = {
        "lock": lock.name,
        "from": lock.owner,
        "to": nxt["owner"],
        "fence": fence,
        "ticket": nxt.get("ticket", record.version),
    }
    return Change(
        writes=[*writes, Delete(head)], appends=[Append("lock.handoff", data)], result=True
    )
