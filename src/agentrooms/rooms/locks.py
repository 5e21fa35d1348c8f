"""Named locks: TTL, owner-checked release and extend, a fencing token on every grant.

The holder record ``lock/<name>`` expires with the lock's TTL (by the store's clock); its
fencing counter lives apart in ``lockfence/<name>``, which never expires, so tokens keep
increasing across expiries and releases. Release and extend compare that counter with
the caller's token, so a holder whose lock expired and was taken by someone else cannot
touch the new holder's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from agentrooms.commit import Change, View
from agentrooms.errors import BadRequest, LockHeld, StaleFence, VersionConflict
from agentrooms.rooms import keys
from agentrooms.rooms.scope import Scope
from agentrooms.store.base import Delete, FenceAtMost, Present, Put

DEFAULT_TTL = 30.0


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
class LockInfo:
    name: str
    owner: str
    fence: int
    expires_at: float | None


def _check_ttl(ttl: object) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86_400:
        raise BadRequest(f"a lock ttl must be between 0 and 86400 seconds, got {ttl!r}")
    return float(ttl)


class Locks:
    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    async def try_acquire(self, name: str, owner: str, *, ttl: float = DEFAULT_TTL) -> Lock:
        """Take the lock now or raise ``LockHeld`` naming the holder."""
        keys.check_name(name, "lock name")
        keys.check_name(owner, "owner")
        ttl = _check_ttl(ttl)
        token = uuid.uuid4().hex

        def take(view: View, _: None) -> Change:
            held = view.get(keys.lock(name))
            if held is not None:
                raise LockHeld(name, held["owner"])
            fence = int((view.get(keys.lock_fence(name)) or {}).get("fence", 0)) + 1
            holder = {"owner": owner, "token": token, "fence": fence}
            return Change(
                writes=[
                    Put(keys.lock(name), holder, ttl=ttl),
                    Put(keys.lock_fence(name), {"fence": fence}),
                ],
                result={"fence": fence, "expires_at": view.now + ttl},
            )

        result = await self._scope.commit(take, None, [keys.lock(name), keys.lock_fence(name)])
        granted = result.result
        return Lock(
            self._scope.room, name, owner, token, granted["fence"], granted["expires_at"], ttl
        )

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

    async def release(self, lock: Lock) -> bool:
        """Release if ``lock`` is still the current grant; ``False`` if it had expired
        or another owner holds the lock now (which is left untouched)."""
        try:
            await self._scope.transact(
                [lock.guard(), Present(keys.lock(lock.name))],
                [Delete(keys.lock(lock.name))],
            )
        except (StaleFence, VersionConflict):
            return False
        return True

    async def extend(self, lock: Lock, ttl: float | None = None) -> Lock:
        """Extend a lock still held; ``StaleFence`` if it expired or changed hands."""
        length = _check_ttl(ttl if ttl is not None else lock.ttl)
        holder = {"owner": lock.owner, "token": lock.token, "fence": lock.fence}
        try:
            done = await self._scope.transact(
                [lock.guard(), Present(keys.lock(lock.name))],
                [Put(keys.lock(lock.name), holder, ttl=length)],
            )
        except VersionConflict as exc:
            raise StaleFence(keys.lock(lock.name), lock.fence, None) from exc
        return Lock(
            lock.room, lock.name, lock.owner, lock.token, lock.fence, done.now + length, length
        )

    async def holder(self, name: str) -> LockInfo | None:
        keys.check_name(name, "lock name")
        record = (await self._scope.read([keys.lock(name)])).get(keys.lock(name))
        if record is None:
            return None
        return LockInfo(name, record.value["owner"], record.value["fence"], record.expires_at)

    @contextlib.asynccontextmanager
    async def hold(
        self, name: str, owner: str, *, ttl: float = DEFAULT_TTL, tries: int = 5, step: float = 0.15
    ) -> AsyncIterator[Lock]:
        """``async with locks.hold("plan", me) as lock:`` — released even if the body raises."""
        lock = await self.acquire(name, owner, ttl=ttl, tries=tries, step=step)
        try:
            yield lock
        finally:
            await self.release(lock)
