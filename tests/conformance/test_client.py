"""The same room behaviour through the library and through :mod:`agentrooms.client` over
a real server (uvicorn on a free loopback port, bearer tokens), on every backend: the
plan's claims, completion and fencing, lease expiry and reclaim, document CAS, events
exactly once per cursor, owner-checked lock release, presence. And a retried request
whose response was lost applies once (the fault proxy between client and server)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import pytest

from agentrooms.client import Client
from agentrooms.client import Room as ClientRoom
from agentrooms.errors import (
    BadRequest,
    Forbidden,
    InvalidTransition,
    LeaseHeld,
    LockHeld,
    NotFound,
    StaleFence,
    StoreUnavailable,
    VersionConflict,
)
from agentrooms.reliability.proxy import Delay, Reset, TcpProxy
from agentrooms.rooms import Document, Lease, Lock, Room, Rooms, TaskSpec
from agentrooms.server import AuthConfig, HttpLimits, create_app, mint
from agentrooms.store import Store
from tests.conftest import Backend
from tests.mcp.support import serving

RoomLike = Room | ClientRoom
SURFACES = ("library", "client")
WOKEN = 5.0  # a wake-up (or an answer at once) told from sleeping out a 10 s wait


async def _later(seconds: float, action: Awaitable[object]) -> None:
    await asyncio.sleep(seconds)
    await action


@dataclass
class Api:
    """One room through one surface: :meth:`as_agent` is the room as that agent sees it
    (the library's handle, or a client with a token minted for the agent)."""

    surface: str
    store: Store
    name: str
    base: str | None = None
    clients: list[Client] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)

    async def token(self, agent: str) -> str:
        if agent not in self.tokens:
            minted = await mint(self.store, agent, rooms=[self.name], scopes=["admin"])
            self.tokens[agent] = minted.token
        return self.tokens[agent]

    async def as_agent(self, agent: str) -> RoomLike:
        if self.surface == "library":
            return Rooms(self.store).room(self.name)
        assert self.base is not None
        client = Client(self.base, await self.token(agent), agent=agent)
        self.clients.append(client)
        return client.room(self.name)


@pytest.fixture(params=SURFACES)
async def api(request: pytest.FixtureRequest, store: Store) -> AsyncIterator[Api]:
    name = f"c-{uuid.uuid4().hex[:10]}"
    await Rooms(store).create(name, "client conformance")
    if request.param == "library":
        yield Api("library", store, name)
        return
    app = create_app(store, auth=AuthConfig(), limits=HttpLimits(rate=None))
    async with serving(app) as base:
        api = Api("client", store, name, base)
        try:
            yield api
        finally:
            for client in api.clients:
                await client.close()


# ------------------------------------------------------------------------------ plan


async def test_plan_claim_complete_and_dependents(api: Api) -> None:
    alice, bob = await api.as_agent("alice"), await api.as_agent("bob")
    ready = await alice.plan.add([TaskSpec("a", "first"), TaskSpec("b", "then", deps=["a"])])
    assert ready == ["a"]
    lease = await alice.plan.claim_next("alice", ttl=30)
    assert lease is not None and (lease.task_id, lease.agent, lease.fence) == ("a", "alice", 1)
    assert await bob.plan.claim_next("bob") is None  # b waits on a
    with pytest.raises(LeaseHeld):
        await bob.plan.claim("a", "bob")
    with pytest.raises(InvalidTransition):
        await bob.plan.claim("b", "bob")
    done = await alice.plan.complete(lease, {"answer": 42})
    assert (done.status, done.result, done.owner) == ("done", {"answer": 42}, "alice")
    task = await bob.plan.get("b")
    assert task.status == "ready" and task.waiting_on == []
    assert [t.id for t in await bob.plan.tasks("done")] == ["a"]
    with pytest.raises(NotFound):
        await bob.plan.get("nope")


async def test_lease_expiry_reclaim_and_fence(api: Api) -> None:
    alice, bob = await api.as_agent("alice"), await api.as_agent("bob")
    await alice.plan.add([TaskSpec("t", max_attempts=3)])
    first = await alice.plan.claim_next("alice", ttl=0.3)
    assert first is not None
    await asyncio.sleep(0.5)
    second = await bob.plan.claim_next("bob", ttl=30)
    assert second is not None and second.task_id == "t" and second.fence == first.fence + 1
    with pytest.raises(StaleFence):  # the late holder's result is never recorded
        await alice.plan.complete(first, "late")
    with pytest.raises(StaleFence):
        await alice.plan.renew(first, 30)
    with pytest.raises(StaleFence):  # nor its fenced document write
        await alice.docs.put("out", "late", create_only=True, fence=first.guard())
    await bob.docs.put("out", "on time", create_only=True, fence=second.guard())
    done = await bob.plan.complete(second, "on time")
    assert (done.status, done.owner, done.attempts) == ("done", "bob", 2)


async def test_keep_alive_renews_and_cancel_makes_the_holder_stale(api: Api) -> None:
    alice, bob = await api.as_agent("alice"), await api.as_agent("bob")
    await alice.plan.add([TaskSpec("long"), TaskSpec("gone")])
    lease = await alice.plan.claim("long", "alice", ttl=0.6)
    async with alice.plan.keep_alive(lease, every=0.1) as keeper:
        await asyncio.sleep(1.0)  # longer than the ttl: only renewals keep it
        assert keeper.lease.expires_at > lease.expires_at
    await alice.plan.complete(keeper.lease, "kept")
    held = await alice.plan.claim("gone", "alice", ttl=30)
    await bob.plan.cancel("gone", "not needed")
    with pytest.raises(StaleFence):
        async with alice.plan.keep_alive(held, ttl=30, every=0.05):
            await asyncio.sleep(5)  # cancelled when the renewal is refused


async def test_claim_next_waits_for_a_task_and_tells_finished(api: Api) -> None:
    """One waiting claim gets the task another agent adds; after ``wait`` with none
    ready it answers ``None`` (the plan not finished), and at once once it is."""
    worker, lead = await api.as_agent("worker"), await api.as_agent("lead")
    start = time.monotonic()
    adding = asyncio.create_task(_later(0.3, lead.plan.add([TaskSpec("t1")])))
    lease = await worker.plan.claim_next("worker", ttl=30, wait=10)
    took = time.monotonic() - start
    await adding
    assert lease is not None and lease.task_id == "t1"
    assert 0.25 <= took < WOKEN, took
    start = time.monotonic()
    assert await worker.plan.claim_next("worker", wait=0.5) is None  # t1 is held
    assert 0.45 <= time.monotonic() - start < WOKEN
    assert await worker.plan.finished() is False
    await worker.plan.complete(lease, "ok")
    start = time.monotonic()
    assert await worker.plan.claim_next("worker", wait=10) is None
    assert time.monotonic() - start < WOKEN
    assert await worker.plan.finished() is True


# ------------------------------------------------------------------------- documents


async def test_document_cas(api: Api) -> None:
    alice, bob = await api.as_agent("alice"), await api.as_agent("bob")
    first = await alice.docs.put("spec", {"v": 1}, create_only=True)
    assert first.version >= 1
    with pytest.raises(VersionConflict):
        await bob.docs.put("spec", {"v": "again"}, create_only=True)
    second = await bob.docs.put("spec", {"v": 2}, if_match=first.version)
    assert second.version > first.version
    with pytest.raises(VersionConflict) as lost:  # alice wrote over what she read: refused
        await alice.docs.put("spec", {"v": "stale"}, if_match=first.version)
    assert list(lost.value.conflicts.values()) == [second.version]
    assert (await alice.docs.get("spec")).value == {"v": 2}
    await alice.docs.put("spec", {"v": 3}, must_exist=True)
    assert [d.name for d in await bob.docs.list()] == ["spec"]
    current = await bob.docs.get("spec")
    with pytest.raises(VersionConflict):
        await bob.docs.delete("spec", if_match=first.version)
    await bob.docs.delete("spec", if_match=current.version)
    with pytest.raises(NotFound):
        await alice.docs.get("spec")


# ---------------------------------------------------------------------------- events


async def test_events_exactly_once_per_cursor(api: Api) -> None:
    poster = await api.as_agent("poster")
    seqs = [await poster.events.post("step", {"i": i}) for i in range(12)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 12
    readers = [await api.as_agent("reader") for _ in range(3)]  # one agent, three readers

    async def drain(room: RoomLike) -> list[int]:
        got: list[int] = []
        while events := await room.events.read_new("reader", 2):
            got += [e.seq for e in events]
        return got

    taken = await asyncio.gather(*(drain(r) for r in readers))
    log = [e.seq for e in await poster.events.read(0, 100)]  # room.created, then the steps
    assert log[-12:] == seqs
    everything = [seq for part in taken for seq in part]
    assert sorted(everything) == log  # each event to exactly one of them, none twice
    assert await readers[0].events.cursor("reader") == log[-1]
    # explicit ack: the cursor moves only on ack (at-least-once)
    other = await api.as_agent("other")
    again = await other.events.read_new("other", 5, ack="explicit")
    assert [e.seq for e in again] == log[:5]
    assert [e.seq for e in await other.events.read_new("other", 5, ack="explicit")] == log[:5]
    assert await other.events.ack("other", log[4]) == log[4]
    assert await other.events.ack("other", log[1]) == log[4]  # never backwards
    assert [e.seq for e in await other.events.read_new("other", 2, ack="explicit")] == log[5:7]
    event = (await other.events.read(seqs[2], 1))[0]
    author = "poster" if api.surface == "client" else None  # the library names no author
    assert (event.type, event.data, event.author) == ("step", {"i": 3}, author)


@pytest.mark.parametrize("ack", ["auto", "explicit"])
async def test_subscribe_yields_new_events_as_they_arrive(api: Api, ack: str) -> None:
    poster, reader = await api.as_agent("poster"), await api.as_agent("sub")
    await poster.events.post("before")
    got: list[str] = []

    async def follow() -> None:
        mode: Literal["auto", "explicit"] = "auto" if ack == "auto" else "explicit"
        async for event in reader.events.subscribe("sub", ack=mode, wait=5):
            got.append(event.type)
            if mode == "explicit":
                await reader.events.ack("sub", event.seq)
            if len(got) == 4:
                return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.3)  # the follower waits on an idle log
    await poster.events.post("one")
    await poster.events.post("two")
    await asyncio.wait_for(follower, 10)
    assert got == ["room.created", "before", "one", "two"]
    assert await reader.events.cursor("sub") == await api.store.last_seq(api.name)


async def test_read_new_waits_for_an_event(api: Api) -> None:
    """One waiting read gets the event another agent posts, and answers empty after
    ``wait`` when none comes."""
    reader, poster = await api.as_agent("reader"), await api.as_agent("poster")
    assert [e.type for e in await reader.events.read_new("reader")] == ["room.created"]
    start = time.monotonic()
    posting = asyncio.create_task(_later(0.3, poster.events.post("note", {"n": 1})))
    got = await reader.events.read_new("reader", wait=10)
    took = time.monotonic() - start
    await posting
    assert [(e.type, e.data) for e in got] == [("note", {"n": 1})]
    assert 0.25 <= took < WOKEN, took
    start = time.monotonic()
    assert await reader.events.read_new("reader", wait=0.5) == []
    assert 0.45 <= time.monotonic() - start < WOKEN


# ----------------------------------------------------------------------------- locks


async def test_lock_release_is_owner_checked(api: Api) -> None:
    alice, bob = await api.as_agent("alice"), await api.as_agent("bob")
    lock = await alice.locks.try_acquire("merge", "alice", ttl=30)
    with pytest.raises(LockHeld) as held:
        await bob.locks.try_acquire("merge", "bob")
    assert held.value.holder == "alice"
    if api.surface == "client":  # the server checks the grant's token and its owner; the
        # library's release compares the fence only (in-process code is trusted)
        forged = Lock(api.name, "merge", "bob", "0" * 32, lock.fence, 0.0, 30.0)
        assert await bob.locks.release(forged) is False  # a guess releases nothing
        with pytest.raises(Forbidden):  # nor does another agent holding the real grant
            await bob.locks.release(lock)
    holder = await bob.locks.holder("merge")
    assert holder is not None and (holder.owner, holder.fence) == ("alice", lock.fence)
    extended = await alice.locks.extend(lock, 60)
    assert extended.expires_at > lock.expires_at
    assert await alice.locks.release(lock) is True
    assert await alice.locks.release(lock) is False  # that grant is gone
    assert await bob.locks.holder("merge") is None
    async with bob.locks.hold("merge", "bob") as mine:
        assert mine.fence > lock.fence
        with pytest.raises(StaleFence):
            await alice.locks.extend(lock)
    assert await alice.locks.holder("merge") is None


async def test_lock_waiter_gets_the_released_lock(api: Api) -> None:
    alice, bob = await api.as_agent("alice"), await api.as_agent("bob")
    lock = await alice.locks.try_acquire("turn", "alice", ttl=30)
    waiting = asyncio.create_task(bob.locks.wait_acquire("turn", "bob", ttl=30, timeout=10))
    for _ in range(100):
        if await alice.locks.waiters("turn"):
            break
        await asyncio.sleep(0.05)
    assert [w.owner for w in await alice.locks.waiters("turn")] == ["bob"]
    assert await alice.locks.release(lock)
    handed = await asyncio.wait_for(waiting, 10)
    assert handed.owner == "bob" and handed.fence > lock.fence


# -------------------------------------------------------------------------- presence


async def test_presence(api: Api) -> None:
    alice, bob = await api.as_agent("alice"), await api.as_agent("bob")
    member = await alice.presence.heartbeat("alice", "busy", {"on": "t1"}, ttl=30)
    assert (member.agent, member.status, member.metadata) == ("alice", "busy", {"on": "t1"})
    await bob.presence.heartbeat("bob")
    assert [m.agent for m in await bob.presence.who_is_online()] == ["alice", "bob"]
    await alice.presence.leave("alice")
    assert [m.agent for m in await alice.presence.who_is_online()] == ["bob"]
    await bob.presence.heartbeat("bob", ttl=0.2)
    await asyncio.sleep(0.4)
    assert await alice.presence.who_is_online() == []


async def test_errors_of_a_missing_room_and_a_bad_call(api: Api) -> None:
    alice = await api.as_agent("alice")
    with pytest.raises(BadRequest):
        await alice.plan.add([TaskSpec("x", deps=["missing"])])
    if api.surface == "client":
        with pytest.raises(Forbidden):  # a client acts as its token's agent only
            await alice.plan.claim_next("mallory")
        assert isinstance(alice, ClientRoom)
        other: RoomLike = alice.client.room("no-such-room")
    else:
        other = Rooms(api.store).room("no-such-room")
    with pytest.raises(NotFound):
        await other.describe()
    with pytest.raises(NotFound):
        await other.plan.tasks()


# ------------------------------------------------------------- a lost response, retried


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():  # noqa: ASYNC110 (the store's state is what is awaited)
            await asyncio.sleep(0.01)


async def test_a_retry_after_a_lost_response_applies_once(store: Store, backend: Backend) -> None:
    """The proxy holds every chunk back; once the server has applied the claim (seen in
    the store), every connection is reset, so its answer never arrives: the client
    retries with the same Idempotency-Key and gets the first claim's lease, and the task
    was claimed once. Then the same for an event post and a document write."""
    name = f"c-{uuid.uuid4().hex[:10]}"
    room = await Rooms(store).create(name)
    await room.plan.add([TaskSpec("t"), TaskSpec("u")])
    token = (await mint(store, "alice", rooms=[name], scopes=["admin"])).token
    app = create_app(store, auth=AuthConfig(), limits=HttpLimits(rate=None))
    async with serving(app) as base:
        port = int(base.rsplit(":", 1)[1])
        proxy = TcpProxy(("127.0.0.1", port))
        proxy.start()
        try:
            async with Client(f"http://127.0.0.1:{proxy.port}", token, agent="alice") as client:
                remote = client.room(name)
                await remote.describe()  # a pooled connection through the proxy

                async def lost_answer(
                    call: Awaitable[object], applied: Callable[[], Awaitable[bool]]
                ) -> object:
                    delay, reset = Delay(proxy, 1.0), Reset(proxy)
                    await delay.inject()
                    pending = asyncio.ensure_future(call)
                    await _until(applied)
                    await reset.inject()  # the answer is still held back: it is lost
                    await delay.heal()
                    await reset.heal()
                    return await asyncio.wait_for(pending, 20)

                async def claimed() -> bool:
                    return (await room.plan.get("t")).status == "claimed"

                accepted = proxy.accepted
                lease = await lost_answer(remote.plan.claim("t", ttl=60), claimed)
                assert proxy.accepted > accepted  # the retry came on a new connection
                task = await room.plan.get("t")
                assert (task.attempts, task.fence, task.owner) == (1, 1, "alice")
                assert isinstance(lease, Lease) and (lease.fence, lease.agent) == (1, "alice")
                assert lease.expires_at == task.lease_expires  # the first delivery's lease
                head = await store.last_seq(name)

                async def posted() -> bool:
                    return await store.last_seq(name) > head

                seq = await lost_answer(remote.events.post("once", {"n": 1}), posted)
                events = await room.events.read(head, 100)
                assert [e.seq for e in events if e.type == "once"] == [seq]

                async def written() -> bool:
                    return bool(await room.docs.list())

                doc = await lost_answer(remote.docs.put("d", 1, create_only=True), written)
                assert isinstance(doc, Document)
                assert doc.version == (await room.docs.get("d")).version
        finally:
            proxy.stop()


@pytest.mark.parametrize("backend", ["sqlite", "redis"], indirect=True)
async def test_a_call_without_a_key_is_not_resent_once_it_may_have_applied(
    store: Store, backend: Backend
) -> None:
    """A lock release carries no key: once its answer is lost the client says the
    outcome is unknown (``StoreUnavailable``) instead of resending it; the release did
    apply, once. A read whose answer is lost is simply sent again."""
    name = f"c-{uuid.uuid4().hex[:10]}"
    room = await Rooms(store).create(name)
    token = (await mint(store, "alice", rooms=[name], scopes=["admin"])).token
    app = create_app(store, auth=AuthConfig(), limits=HttpLimits(rate=None))
    async with serving(app) as base:
        port = int(base.rsplit(":", 1)[1])
        proxy = TcpProxy(("127.0.0.1", port))
        proxy.start()
        try:
            async with Client(f"http://127.0.0.1:{proxy.port}", token, agent="alice") as client:
                remote = client.room(name)
                lock = await remote.locks.try_acquire("l", ttl=60)
                delay, reset = Delay(proxy, 1.0), Reset(proxy)
                await delay.inject()
                pending = asyncio.ensure_future(remote.locks.release(lock))

                async def released() -> bool:
                    return await room.locks.holder("l") is None

                await _until(released)
                await reset.inject()
                await delay.heal()
                await reset.heal()
                with pytest.raises(StoreUnavailable, match="outcome is unknown"):
                    await asyncio.wait_for(pending, 20)
                assert await room.locks.holder("l") is None
                await delay.inject()
                reading = asyncio.ensure_future(remote.describe())
                await asyncio.sleep(0.3)
                await reset.inject()
                await delay.heal()
                await reset.heal()
                assert (await asyncio.wait_for(reading, 20)).name == name
        finally:
            proxy.stop()
