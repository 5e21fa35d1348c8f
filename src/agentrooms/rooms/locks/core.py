"""The lock core: grants with a TTL and a fencing token, owner-checked release and extend.

``lock/<name>`` is the holder record; it expires with the grant's TTL by the store's clock.
``lockfence/<name>`` keeps the newest fencing token and never expires, so no two grants of
a lock share a token. ``lockgrant/<name>/<grant token>`` expires with the holder record:
``release`` and ``extend`` act only while the holder record still carries the caller's
grant, checked by its secret grant token (not the public fencing token) in the write
itself. A release is one write that
frees the lock, or hands it to the head of its line (:mod:`.line`), with the holder's last
writes. What the process knows (:mod:`.knowledge`) only picks which write is tried first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from agentrooms.commit import Change, View
from agentrooms.errors import BadRequest, LockHeld, StaleFence, VersionConflict
from agentrooms.rooms import keys
from agentrooms.rooms.follow import tell
from agentrooms.rooms.locks import line as lines
from agentrooms.rooms.locks.knowledge import Knowledge
from agentrooms.rooms.locks.records import (
    DEFAULT_TTL,
    Claim,
    Lock,
    LockInfo,
    acquiring,
    check_read,
    check_ttl,
    grant_record,
    grant_times,
    grant_writes,
    handed,
    holder_value,
    local_time,
    mark,
    new_claim,
    owns,
)
from agentrooms.rooms.scope import Scope
from agentrooms.store.types import (
    Absent,
    Append,
    Compare,
    Delete,
    FenceAtMost,
    Present,
    Put,
    Record,
    TransactResult,
    VersionIs,
    Write,
    appended,
)


class LockCore:
    """Take, release, extend and inspect the locks of one room."""

    def __init__(self, scope: Scope, knowledge: Knowledge | None = None) -> None:
        self._scope = scope
        self._known = knowledge if knowledge is not None else Knowledge()

    def _lock(self, name: str, value: dict[str, Any], expires_at: float) -> Lock:
        granted_at, renewed_at = grant_times(value, expires_at)
        return Lock(
            self._scope.room,
            name,
            value["owner"],
            value["token"],
            value["fence"],
            expires_at,
            value["ttl"],
            granted_at=granted_at,
            renewed_at=renewed_at,
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
        the grant comes with (:meth:`~.Locks.wait_acquire`). With ``command_id`` the grant
        is recorded atomically with it: a repeated call returns that grant (token, fence,
        expiry) as the first call got it, whoever holds the lock now, and takes nothing."""
        claim = new_claim(name, owner, ttl)
        wanted = check_read(read)
        if command_id is None:
            lock = await self._take(claim)
        else:
            lock = await self._take_read(claim, command_id=command_id)
        return await self._with_values(lock, wanted)

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
        the grant comes with (:meth:`~.Locks.wait_acquire`)."""
        if isinstance(tries, bool) or not isinstance(tries, int) or tries < 1:
            raise BadRequest("tries must be a positive integer")
        check_read(read)
        for attempt in range(1, tries + 1):
            try:
                return await self.try_acquire(name, owner, ttl=ttl, read=read)
            except LockHeld:
                if attempt == tries:
                    raise
                await asyncio.sleep(step * attempt)
        raise AssertionError("unreachable")

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

    async def _take(self, claim: Claim) -> Lock:
        """Take the lock if it is free, else ``LockHeld``: one write when the lock is
        believed free (it compares the lock absent and the counter at the token known),
        the commit loop otherwise or when that guess was wrong."""
        name = claim.name
        fence = self._known.free_at(self._scope.room, name)
        if fence is not None:
            holder = claim.holder(fence + 1)
            counter: Compare = (
                FenceAtMost(keys.lock_fence(name), fence)
                if fence
                else Absent(keys.lock_fence(name))
            )
            try:
                done = await self._scope.transact(
                    [Absent(keys.lock(name)), counter], [*grant_writes(name, holder), mark(name)]
                )
            except (VersionConflict, StaleFence):
                pass  # taken since, or granted and released elsewhere: read it
            else:
                lock = self._lock(name, holder, done.now + claim.ttl)
                until = local_time(lock.expires_at, done.now)
                self._known.granted(lock, until, done.versions[keys.lock_line(name)])
                return lock
        return await self._take_read(claim)

    async def _take_read(
        self, claim: Claim, queued: str | None = None, command_id: str | None = None
    ) -> Lock:
        """The commit loop's take: read the lock, grant it if free (removing our queue
        entry ``queued``, if given), raise ``LockHeld`` naming the holder if not. With
        ``command_id``, the grant is recorded with it, and a repeat returns it."""
        name = claim.name
        found: list[tuple[int, float | None]] = []

        def take(view: View, _: object) -> Change:
            fence = int((view.get(keys.lock_fence(name)) or {}).get("fence", 0))
            held = view.record(keys.lock(name))
            if held is not None:
                found[:] = [(fence, local_time(held.expires_at, view.now))]
                raise LockHeld(name, held.value["owner"])
            holder = claim.holder(fence + 1, view.now)
            writes = [*grant_writes(name, holder), mark(name)]
            if queued is not None and view.exists(queued):
                writes.append(Delete(queued))
            return Change(writes=writes, result={"holder": holder, "now": view.now})

        record_keys = [keys.lock(name), keys.lock_fence(name), *([queued] if queued else [])]
        event = None if command_id is None else acquiring(name, claim.owner, claim.ttl)
        try:
            done = await self._scope.commit(take, event, record_keys, command_id=command_id)
        except LockHeld:
            self._known.found_held(self._scope.room, name, *found[0])
            raise
        now = done.result["now"]
        lock = self._lock(name, done.result["holder"], now + claim.ttl)
        if not done.replayed:  # a replayed grant says nothing of the lock now
            until = local_time(lock.expires_at, now)
            self._known.granted(lock, until, done.versions[keys.lock_line(name)])
        return lock

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
        self, lock: Lock, writes: list[Write], rejoin: Put | None = None
    ) -> tuple[int, float] | None:
        """Release ``lock`` (``StaleFence`` if it is no longer the current grant) with
        ``writes``, handing it to the head of the line. ``rejoin``, the releaser's queue
        entry, goes in line with a handoff: its ticket and the store time it joined
        (``None``: nobody was in line, the lock is free and the entry was not written)."""
        # A grant of the free lock whose mark is unchanged: nobody joined, free it without
        # reading the line (the write compares the mark). Else the line's front, looked up.
        extra: list[Compare] = []
        marked = self._known.mark_of(lock)
        if marked is not None:
            line, extra = lines.Line(None), [VersionIs(keys.lock_line(lock.name), marked)]
        else:
            line = await lines.front(self._scope, lock.name, self._known.ahead_of(lock))
        while True:
            try:
                done = await self._release(lock, line, writes, extra, rejoin)
            except StaleFence as exc:
                await self._scope.read([])  # NotFound if the room itself is gone
                if exc.key != keys.lock(lock.name):  # not this grant's token: say the lock
                    raise StaleFence(keys.lock(lock.name), lock.fence, None) from None
                raise
            except VersionConflict as exc:
                if extra and keys.lock_line(lock.name) in exc.conflicts:
                    line, extra = await lines.scan(self._scope, lock.name), []  # someone joined
                    continue
                if line.head is None or line.head.key not in exc.conflicts:
                    raise
                # the head left between the lookup and the write: the next one named
                line = await lines.next_of(self._scope, self._known, lock.name, line.behind)
                continue
            if line.head is None:
                self._known.released(lock, None)
                return None
            self._known.released(lock, line.head.value["ttl"])
            return None if rejoin is None else (done.versions[rejoin.key], done.now)

    async def _release(
        self,
        lock: Lock,
        line: lines.Line,
        writes: list[Write],
        compares: list[Compare],
        rejoin: Put | None,
    ) -> TransactResult:
        """One write: release ``lock`` (its holder record still carries its fencing
        token, or ``StaleFence``) with ``writes``, if ``compares`` hold, handing it to the
        head of ``line`` if that entry is still there (else ``VersionConflict`` naming
        it), with ``rejoin`` put last (its ticket is later than every waiter's)."""
        mine = owns(lock)
        ours = Delete(keys.lock_grant(lock.name, lock.token))
        head = line.head
        if head is None:
            data: dict[str, Any] = {"lock": lock.name, "owner": lock.owner}
            released = Append("lock.released", data, lock.owner)
            done = await self._scope.transact(
                [*mine, *compares], [*writes, Delete(keys.lock(lock.name)), ours], [released]
            )
            self._tell(done, released)
            return done
        nxt = head.value
        # While ``mine`` holds, the counter is at our token: the next one is ours + 1.
        holder = holder_value(nxt["owner"], nxt["token"], lock.fence + 1, nxt["ttl"])
        data = {
            "lock": lock.name,
            "from": lock.owner,
            "to": nxt["owner"],
            "fence": holder["fence"],
            "ticket": nxt.get("ticket", head.version),
            "waiter": nxt.get("waiter"),
            "line": list(line.behind[: lines.LINE]),
        }
        if passed := handed(writes, nxt.get("read")):
            data["handed"] = passed
        handoff = Append("lock.handoff", data, lock.owner)
        done = await self._scope.transact(
            [*mine, Present(head.key), *compares],
            [
                *writes,
                ours,
                *grant_writes(lock.name, holder),
                Delete(head.key),
                *([rejoin] if rejoin else []),
            ],
            [handoff],
        )
        self._tell(done, handoff)
        return done

    def _tell(self, done: TransactResult, event: Append) -> None:
        """The waiters of this process learn of ``event``, which ``done`` appended, now,
        not when the reader of the log gets it."""
        tell(self._scope.store, self._scope.room, appended(done.seqs, [event], done.now))

    # ------------------------------------------------------------------- the rest

    async def extend(self, lock: Lock, ttl: float | None = None) -> Lock:
        """Extend a lock still held by this grant (its token is on the holder record);
        ``StaleFence`` if it expired or changed hands."""
        length = check_ttl(ttl if ttl is not None else lock.ttl)

        def extend(view: View, _: None) -> Change:
            record = view.record(keys.lock(lock.name))
            held = None if record is None else record.value
            if held is None or held["token"] != lock.token or held["fence"] != lock.fence:
                current = None if held is None else held["fence"]
                raise StaleFence(keys.lock(lock.name), lock.fence, current)
            assert record is not None
            granted_at = grant_times(held, record.expires_at)[0]
            holder = holder_value(lock.owner, lock.token, lock.fence, length, granted_at, view.now)
            return Change(
                writes=[
                    Put(keys.lock(lock.name), holder, ttl=length),
                    grant_record(lock.name, holder),
                ],
                result={"holder": holder, "now": view.now},
            )

        done = await self._scope.commit(extend, None, [keys.lock(lock.name)])
        self._known.extended(lock, time.monotonic() + length)
        return self._lock(lock.name, done.result["holder"], done.result["now"] + length)

    async def holder(self, name: str) -> LockInfo | None:
        """The lock's holder, ``None`` if it is free (an expired grant holds nothing)."""
        keys.check_name(name, "lock name")
        record = (await self._scope.read([keys.lock(name)])).get(keys.lock(name))
        return None if record is None else _info(name, record)

    async def held(self, limit: int = 1000, after: str | None = None) -> list[LockInfo]:
        """The room's held locks by name after the name ``after``, at most ``limit`` (one
        scan, one snapshot; an expired grant holds nothing and is not listed)."""
        await self._scope.read([])
        prefix = keys.lock("")
        cursor = None if after is None else prefix + after
        page = await self._scope.store.scan(self._scope.room, prefix, cursor, limit)
        return [_info(r.key[len(prefix) :], r) for r in page.records]


def _info(name: str, record: Record) -> LockInfo:
    value = record.value
    granted_at, renewed_at = grant_times(value, record.expires_at)
    return LockInfo(name, value["owner"], value["fence"], record.expires_at, granted_at, renewed_at)
