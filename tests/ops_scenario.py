"""The 2am scenario: a room seeded with one of everything an operator must see at once.

:func:`seed_2am` builds, through the library wherever the library can get there (and by
writing the documented record layout where the scenario needs the past: a waiter who
joined a minute ago, an effect unknown for five minutes):

* 200 tasks (a small DAG), some done, some claimed;
* one expired lease nobody reclaimed (``EXPIRED_TASK``);
* one task failed at its attempt limit (``FAILED_TASK``);
* one lock (``LOCK``) held, with 5 waiters queued "over a minute" (joined 75 s ago);
* one cursor (``LAGGING_AGENT``) 5,000 events behind the head;
* one effect in the unknown state (``UNKNOWN_EFFECT``), unknown for 300 s;
* one dead letter: an effect failed for good (``DEAD_EFFECT``);
* one hot key: ``doc/HOT_DOC`` lost ``HOT_CONFLICTS`` compare-and-sets.

Reused by the dashboard's browser test: import :func:`seed_2am` and :class:`Seeded`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from agentrooms.effects import Outbox, OutcomeUnknown, PermanentFailure, Worker
from agentrooms.effects.model import Effect, effect_key
from agentrooms.errors import VersionConflict
from agentrooms.rooms import Room, Rooms, TaskSpec, keys
from agentrooms.store import Append, Put, Store, VersionIs
from agentrooms.store.types import JSON

TASKS = 200
EXPIRED_TASK = "t-expired"
FAILED_TASK = "t-failed"
LOCK = "deploy"
LOCK_HOLDER = "carol"
WAITERS = 5
WAITED = 75.0  # seconds the waiters have been in line
LAGGING_AGENT = "laggard"
LAG = 5000
UNKNOWN_EFFECT = "charge-42"
UNKNOWN_FOR = 300.0
DEAD_EFFECT = "email-7"
HOT_DOC = "hot"
HOT_CONFLICTS = 25
ONLINE = ("alice", "bob", LOCK_HOLDER)


@dataclass(frozen=True)
class Seeded:
    room: str
    last_seq: int


async def seed_2am(store: Store, room: str) -> Seeded:
    """Create ``room`` and seed it with the scenario (module docstring)."""
    r = await Rooms(store).create(room, "the 2am scenario")
    specs = [TaskSpec(EXPIRED_TASK), TaskSpec(FAILED_TASK, max_attempts=1)]
    specs += [TaskSpec("t-000", "root")]
    specs += [
        TaskSpec(f"t-{i:03d}", f"step {i}", deps=[f"t-{(i - 1) // 3:03d}"]) for i in range(1, 198)
    ]
    await r.plan.add(specs)
    assert len(specs) == TASKS
    # done work and live leases, so the plan has every status
    lease = await r.plan.claim("t-000", "alice", ttl=600)
    await r.plan.complete(lease)
    await r.plan.claim("t-001", "bob", ttl=600)
    # one task failed at its limit of one attempt
    failing = await r.plan.claim(FAILED_TASK, "bob", ttl=600)
    await r.plan.fail(failing, {"message": "exit status 137"})
    # one lease that runs out while nobody claims anything
    await r.plan.claim(EXPIRED_TASK, "dave", ttl=0.05)
    # presence
    for agent in ONLINE:
        await r.presence.heartbeat(agent, "working", ttl=600)
    # a held lock and five waiters who joined a minute ago (entries as the queue writes
    # them, with the join time the queue records)
    held = await r.locks.try_acquire(LOCK, LOCK_HOLDER, ttl=600)
    assert held is not None
    now = (await store.read(room, [])).now
    for i in range(WAITERS):
        waiter = f"w{i}"
        entry = {
            "owner": f"worker-{i}",
            "token": f"token-{i}",
            "ttl": 30.0,
            "waiter": waiter,
            "ticket": i + 1,
            "joined_at": now - WAITED + i,
        }
        await store.transact(room, writes=[Put(keys.lock_waiter(LOCK, waiter), entry, 600)])
    await _effects(store, r, now)
    await _hot_key(store, r)
    await _lagging_cursor(store, r)
    await asyncio.sleep(0.1)  # the expired lease is past its expiry by the store's clock
    return Seeded(room, await store.last_seq(room))


async def _effects(store: Store, r: Room, now: float) -> None:
    """One effect left unknown by its worker (for UNKNOWN_FOR s), one refused for good."""
    room = r.name
    outbox = Outbox(r)
    await outbox.request(UNKNOWN_EFFECT, "charge", {"amount": 42})
    await outbox.request(DEAD_EFFECT, "email", {"to": "ops@example.com"})

    async def handler(effect: Effect) -> JSON:
        if effect.id == UNKNOWN_EFFECT:
            raise OutcomeUnknown("the payment gateway timed out after the request was sent")
        raise PermanentFailure("mailbox does not exist")

    await Worker(outbox, handler, name="worker-fx", lease_ttl=60).drain()
    key = effect_key(UNKNOWN_EFFECT)
    record = (await store.read(room, [key])).get(key)
    assert record is not None and record.value["status"] == "unknown"
    older = {**record.value, "since": now - UNKNOWN_FOR}
    await store.transact(room, [VersionIs(key, record.version)], [Put(key, older)])


async def _hot_key(store: Store, r: Room) -> None:
    """Writers racing on one document with stale versions."""
    room = r.name
    doc = await r.docs.put(HOT_DOC, {"n": 0})
    for i in range(HOT_CONFLICTS):
        try:
            await store.transact(
                room, [VersionIs(keys.doc(HOT_DOC), doc.version - 1)], [Put(keys.doc(HOT_DOC), i)]
            )
        except VersionConflict:
            pass
        else:
            raise AssertionError("a stale compare-and-set was applied")


async def _lagging_cursor(store: Store, r: Room) -> None:
    """A cursor that stopped at the start while LAG events arrived."""
    room = r.name
    await r.events.ack(LAGGING_AGENT, 1)
    await r.events.ack("alice", 1)
    batch = store.limits.max_ops - 10
    left = LAG
    while left > 0:
        n = min(batch, left)
        await store.transact(room, appends=[Append("build.log", {"line": j}) for j in range(n)])
        left -= n
    await r.events.ack("alice", await store.last_seq(room))
