"""Worker functions run in child processes by the multi-process conformance tests.

Each opens the store by URL (so it has its own connections), runs its loop and returns
what was acknowledged, so the parent can check that every acknowledged write is there.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrooms.errors import VersionConflict
from agentrooms.store import Absent, Append, Put, VersionIs, open_store


def append_events(url: str, room: str, writer: int, count: int) -> list[tuple[int, int]]:
    """Append ``count`` events one transact each; return (seq, i) per acknowledged one."""

    async def run() -> list[tuple[int, int]]:
        store = await open_store(url)
        acked = []
        try:
            for i in range(count):
                result = await store.transact(
                    room, appends=[Append("tick", {"writer": writer, "i": i})]
                )
                acked.append((result.seqs[0], i))
        finally:
            await store.close()
        return acked

    return asyncio.run(run())


def commit_own_key(url: str, room: str, writer: int, count: int) -> int:
    """``count`` compare-and-set increments of this writer's own key, each with an event,
    plus a contended increment of one shared counter every tenth commit (retried on
    conflict). Returns how many shared increments were acknowledged."""

    async def run() -> int:
        store = await open_store(url)
        shared_acked = 0
        key = f"counter/{writer}"
        try:
            for i in range(count):
                snap = await store.read(room, [key])
                version = snap.version(key)
                compares = [Absent(key)] if version is None else [VersionIs(key, version)]
                await store.transact(
                    room,
                    compares=compares,
                    writes=[Put(key, snap.value(key, 0) + 1)],
                    appends=[Append("commit", {"writer": writer, "i": i})],
                )
                if i % 10 == 0:
                    while True:
                        snap = await store.read(room, ["shared"])
                        v = snap.version("shared")
                        try:
                            await store.transact(
                                room,
                                compares=[Absent("shared")]
                                if v is None
                                else [VersionIs("shared", v)],
                                writes=[Put("shared", snap.value("shared", 0) + 1)],
                            )
                        except VersionConflict:
                            await asyncio.sleep(0.001)
                            continue
                        shared_acked += 1
                        break
        finally:
            await store.close()
        return shared_acked

    return asyncio.run(run())


def append_after(url: str, room: str, delay: float) -> int:
    """Sleep ``delay`` seconds, append one event, return its sequence number."""

    async def run() -> int:
        store = await open_store(url)
        try:
            await asyncio.sleep(delay)
            return (await store.transact(room, appends=[Append("wake")])).seqs[0]
        finally:
            await store.close()

    return asyncio.run(run())


def contend_for_lock(
    url: str, room: str, proc: int, agents: int, rounds: int, hold: float, requeue: bool = False
) -> list[tuple[str, int, float, float]]:
    """``agents`` agents of this process each take the room's lock ``one`` ``rounds``
    times through its line (``wait_acquire``), and under it read the counter, hold for
    ``hold`` seconds and write it back plus one (fenced by the grant). With ``requeue``,
    an agent's write goes with the ``requeue`` that passes the lock on and puts the agent
    back in line (its last, with the release). Returns (owner, fencing token, wall-clock
    start, wall-clock end) per acquisition."""
    import time

    from agentrooms.rooms import Rooms

    async def run() -> list[tuple[str, int, float, float]]:
        store = await open_store(url)
        held: list[tuple[str, int, float, float]] = []
        try:
            locks = Rooms(store).room(room).locks

            async def agent(owner: str) -> None:
                if requeue:
                    lock = await locks.wait_acquire("one", owner, ttl=30, timeout=120)
                    for turn in range(rounds):
                        start = time.time()
                        count = (await store.read(room, ["counter"])).value("counter", 0)
                        await asyncio.sleep(hold)
                        bump = [Put("counter", count + 1)]
                        held.append((lock.owner, lock.fence, start, time.time()))
                        if turn == rounds - 1:
                            await locks.release(lock, writes=bump)
                        else:
                            lock = await locks.requeue(lock, writes=bump, timeout=120)
                    return
                for _ in range(rounds):
                    async with locks.hold("one", owner, ttl=30, queue_timeout=120) as lock:
                        start = time.time()
                        count = (await store.read(room, ["counter"])).value("counter", 0)
                        await asyncio.sleep(hold)
                        await store.transact(
                            room, compares=[lock.guard()], writes=[Put("counter", count + 1)]
                        )
                        held.append((lock.owner, lock.fence, start, time.time()))

            await asyncio.gather(*(agent(f"p{proc}a{i}") for i in range(agents)))
        finally:
            await store.close()
        return held

    return asyncio.run(run())


def _add(view: Any, by: int) -> Any:
    """The commit loop's transition for :func:`commit_increments`: counter + ``by``."""
    from agentrooms import Change

    n = view.get("counter", 0) + by
    return Change(writes=[Put("counter", n)], appends=[Append("added", {"n": n})], result=n)


def commit_increments(
    url: str, room: str, proc: int, writers: int, count: int
) -> tuple[list[int], list[int]]:
    """``writers`` writers of this process each commit ``count`` increments of one shared
    counter through ``commit`` (each its own command id), then one delivery of the
    command ``shared`` that every writer of every process also sends. Returns the counter
    value each of their own commits produced, and what each delivery of ``shared`` got."""
    from agentrooms import CommitOptions, RetryPolicy, commit

    async def run() -> tuple[list[int], list[int]]:
        store = await open_store(url)
        policy = RetryPolicy(max_attempts=1000, budget=120)  # contention, not a limit
        try:

            async def writer(i: int) -> tuple[list[int], int]:
                own = []
                for n in range(count):
                    done = await commit(
                        store, room, _add, 1, keys=["counter"], command_id=f"p{proc}w{i}c{n}",
                        options=CommitOptions(policy=policy),
                    )  # fmt: skip
                    own.append(done.result)
                shared = await commit(
                    store,
                    room,
                    _add,
                    1,
                    keys=["counter"],
                    command_id="shared",
                    options=CommitOptions(policy=policy),
                )
                return own, shared.result

            outs = await asyncio.gather(*(writer(i) for i in range(writers)))
        finally:
            await store.close()
        return [n for own, _ in outs for n in own], [shared for _, shared in outs]

    return asyncio.run(run())


def take_lock_and_hang(url: str, room: str, ttl: float, taken: Any) -> None:
    """Take the room's lock ``one`` for ``ttl`` seconds, report (fence, wall-clock time of
    the grant), then hang without releasing it: the parent kills us."""
    import time

    from agentrooms.rooms import Rooms

    async def run() -> None:
        store = await open_store(url)
        lock = await Rooms(store).room(room).locks.try_acquire("one", "doomed", ttl=ttl)
        taken.put((lock.fence, time.time()))
        await asyncio.sleep(3600)

    asyncio.run(run())


STALE_FENCE_EXIT = 3


def claim_pause_complete(url: str, room: str, ttl: float, claimed: Any) -> None:
    """Claim the room's only task, report the claim, idle (the parent SIGSTOPs us here),
    then try to complete. Exits 3 if the completion was fenced out, 0 if it was accepted."""
    import sys

    from agentrooms.errors import StaleFence
    from agentrooms.rooms import Rooms

    async def run() -> int:
        store = await open_store(url)
        try:
            plan = Rooms(store).room(room).plan
            lease = await plan.claim_next("paused-agent", ttl=ttl)
            assert lease is not None
            claimed.put(lease.fence)
            await asyncio.sleep(ttl)  # stopped in here, well past the ttl
            try:
                await plan.complete(lease, "late result from the paused agent")
            except StaleFence:
                return STALE_FENCE_EXIT
            return 0
        finally:
            await store.close()

    sys.exit(asyncio.run(run()))
