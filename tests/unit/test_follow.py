"""The shared log follower: delivery, sharing, and resync when it lost track."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from agentrooms.errors import CursorCompacted, StoreUnavailable
from agentrooms.rooms import follow as follow_module
from agentrooms.rooms.follow import follow, tell
from agentrooms.store import Append, Event, Store, open_store
from tests.helpers import Interposed


class Faulty(Interposed):
    """Counts log reads; raises the queued errors on the next ones."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.log_reads = 0
        self.faults: list[Exception] = []
        self.gate = asyncio.Event()  # log reads wait while it is clear
        self.gate.set()

    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]:
        self.log_reads += 1
        await self.gate.wait()
        if self.faults:
            raise self.faults.pop(0)
        return await super()._read_log(room, after, limit)


@pytest.fixture
async def store() -> Faulty:
    return Faulty(await open_store("memory://"))


async def append(store: Store, *types: str) -> None:
    await store.transact("r", appends=[Append(t, {"n": i}) for i, t in enumerate(types)])


async def test_delivers_matching_events_after_subscribing(store: Faulty) -> None:
    await append(store, "before")
    async with follow(store, "r", lambda e: e.type != "skip") as sub:
        await append(store, "a", "skip", "b")
        assert await sub.wait(5)
        events, resync = sub.take()
        while len(events) < 2:  # a second batch if the follower read between appends
            assert await sub.wait(5)
            events += sub.take()[0]
        assert [e.type for e in events] == ["a", "b"] and not resync
        assert not await sub.wait(0.05)  # nothing more came


async def test_one_reader_serves_every_subscription(store: Faulty) -> None:
    async with (
        follow(store, "r", lambda e: True) as one,
        follow(store, "r", lambda e: e.type == "x") as two,
    ):
        await append(store, "x")
        assert await one.wait(5) and await two.wait(5)
        assert [e.type for e in two.take()[0]] == ["x"]
        assert store.log_reads == 1  # read once for both
    assert not store.session.shared.followers  # the last one out stopped it


def _to(event: Event) -> str | None:
    """The route of the test's ``t.to`` events: whom their data names."""
    to = event.data.get("to") if isinstance(event.data, dict) else None
    return to if isinstance(to, str) else None


follow_module.route("t.to", _to)


async def test_routed_subscriptions_get_only_the_events_of_their_routes(store: Faulty) -> None:
    """An event goes to the subscriptions its route names (told or read from the log),
    beside those whose match accepts it; unroutable data is skipped, not a failure."""
    async with (
        follow(store, "r", routes=("ann",)) as ann,
        follow(store, "r", routes=("bob", "all")) as bob,
        follow(store, "r", lambda e: e.type == "t.to") as everything,
    ):
        follower = store.session.shared.followers[("r", asyncio.get_running_loop())]
        done = await store.transact(
            "r",
            appends=[
                Append("t.to", {"to": "bob"}),
                Append("t.to", ["not", "a", "dict"]),
                Append("t.to", {"to": "all"}),
                Append("other", {"to": "ann"}),  # not a routed type
            ],
        )
        assert await bob.wait(5)
        events = bob.take()[0]
        while len(events) < 2:
            assert await bob.wait(5)
            events += bob.take()[0]
        assert [e.data for e in events] == [{"to": "bob"}, {"to": "all"}]
        seen = everything.take()[0]
        while len(seen) < 3:
            assert await everything.wait(5)
            seen += everything.take()[0]
        assert len(seen) == 3
        assert not await ann.wait(0.05)
        told = Event(done.seqs[-1] + 1, "t.to", {"to": "ann"}, done.now)
        tell(store, "r", [told])  # told events take the same routes
        assert ann.take()[0] == [told] and not bob.take()[0]
        assert set(follower._routed) == {"ann", "bob", "all"}
    assert follower._routed == {} and not follower._matching


async def test_follow_wants_a_match_or_routes() -> None:
    store = await open_store("memory://")
    with pytest.raises(ValueError, match="one of them"):
        async with follow(store, "r"):
            pass
    with pytest.raises(ValueError, match="one of them"):
        async with follow(store, "r", lambda e: True, routes=("x",)):
            pass
    await store.close()


async def test_a_store_failure_asks_for_resync_and_recovers(store: Faulty) -> None:
    async with follow(store, "r", lambda e: True) as sub:
        store.faults.append(StoreUnavailable("down"))
        await append(store, "lost?")
        assert await sub.wait(5)
        events, resync = sub.take()
        assert resync  # the waiter must re-read its state itself
        if not events:  # the retry after the pause delivers the event
            assert await sub.wait(5)
            events = sub.take()[0]
        assert [e.type for e in events] == ["lost?"]


async def test_a_trimmed_log_restarts_from_the_newest_and_asks_for_resync(
    store: Faulty,
) -> None:
    async with follow(store, "r", lambda e: True) as sub:
        store.faults.append(CursorCompacted("r", 0, 5))
        await append(store, "gone")
        assert await sub.wait(5)
        assert sub.take() == ([], True)
        await append(store, "next")
        assert await sub.wait(5)
        assert [e.type for e in sub.take()[0]] == ["next"]


async def test_cancelled_waiters_stop_the_follower(store: Faulty) -> None:
    async def waiter() -> None:
        async with follow(store, "r", lambda e: True) as sub:
            await sub.wait(60)

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0.05)
    follower = next(iter(store.session.shared.followers.values()))
    assert follower._task is not None and not follower._task.done()
    running = follower._task
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait([running], timeout=5)
    assert running.cancelled()
    assert not store.session.shared.followers


class Native(Faulty):
    """As Redis: every wake-up of the follower reads the new events (one round trip)."""

    @property
    def follow_returns_events(self) -> bool:
        return True


async def test_an_event_told_and_read_back_is_handed_out_once() -> None:
    """``tell`` hands an event out ahead of the follower; whichever of the two comes
    second skips it, so a subscription gets each event once."""
    store = Native(await open_store("memory://"))
    async with follow(store, "r", lambda e: True) as sub:
        # told first: the follower's read of the log is held back until after the tell
        store.gate.clear()
        done = await store.transact("r", appends=[Append("first", None)])
        first = Event(done.seqs[0], "first", None, done.now)
        tell(store, "r", [first])
        assert sub.take() == ([first], False)
        store.gate.set()
        while store.log_reads == 0 or follower_of(store)._position != first.seq:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert not await sub.wait(0.1)  # read back, not handed out again
        assert not follower_of(store)._told

        # read first: the follower has handed it out when the tell comes
        done = await store.transact("r", appends=[Append("second", None)])
        assert await sub.wait(5)
        assert [e.type for e in sub.take()[0]] == ["second"]
        tell(store, "r", [Event(done.seqs[0], "second", None, done.now)])
        assert not await sub.wait(0.1)
        assert not follower_of(store)._told


async def test_a_batch_of_told_events_is_not_read_back(store: Faulty) -> None:
    """Where following is a watch and then a read (SQLite, PostgreSQL), the read is
    skipped when this process told every new event already; one it did not tell (another
    process appended it) is read, with the told ones around it skipped."""
    assert not store.follow_returns_events
    async with follow(store, "r", lambda e: True) as sub:
        told = []
        for name in ("one", "two"):
            done = await store.transact("r", appends=[Append(name, None)])
            told.append(Event(done.seqs[0], name, None, done.now))
            tell(store, "r", told[-1:])
        assert sub.take() == (told, False)
        while follower_of(store)._position != told[-1].seq:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert store.log_reads == 0 and not follower_of(store)._told
        assert not await sub.wait(0.1)

        done = await store.transact("r", appends=[Append("mine", None)])
        tell(store, "r", [Event(done.seqs[0], "mine", None, done.now)])
        await append(store, "theirs")  # not told: as from another process
        assert sub.take()[0][0].type == "mine"
        events: list[Event] = []
        while not events:
            assert await sub.wait(5)
            events = sub.take()[0]
        assert [e.type for e in events] == ["theirs"] and store.log_reads >= 1


async def test_where_reads_return_events_a_process_that_told_them_all_only_watches() -> None:
    """Where following is one read returning the events (Redis), a follower whose last
    read found only events this process had told watches the newest seq instead: the
    events it is told next are not read back; one not told (another process appended
    it) is read, and the follower reads again from then on."""
    store = Native(await open_store("memory://"))
    async with follow(store, "r", lambda e: True) as sub:
        follower = follower_of(store)
        assert not follower._telling
        done = await store.transact("r", appends=[Append("first", None)])
        tell(store, "r", [Event(done.seqs[0], "first", None, done.now)])
        while follower._position != done.seqs[0]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert follower._telling
        reads = store.log_reads
        for name in ("two", "three"):
            done = await store.transact("r", appends=[Append(name, None)])
            tell(store, "r", [Event(done.seqs[0], name, None, done.now)])
        while follower._position != done.seqs[0]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert store.log_reads == reads and not follower._told
        assert [e.type for e in sub.take()[0]] == ["first", "two", "three"]
        await append(store, "theirs")
        events: list[Event] = []
        while not events:
            assert await sub.wait(5)
            events = sub.take()[0]
        assert [e.type for e in events] == ["theirs"]
        assert store.log_reads > reads and not follower._telling


def follower_of(store: Store) -> follow_module.Follower:
    (follower,) = store.session.shared.followers.values()
    return follower


# ------------------------------------------------------------ handles of one store


async def test_sqlite_handles_share_a_reader_by_worker_not_by_spelling(tmp_path: Path) -> None:
    """Handles of one file share a reader when they share the worker that wakes their
    watches: the same file, however spelled, with the same options."""
    (tmp_path / "sub").mkdir()
    one = await open_store(f"sqlite:///{tmp_path / 'a.db'}")
    two = await open_store(f"sqlite:///{tmp_path / 'sub' / '..' / 'a.db'}")
    tuned = await open_store(f"sqlite:///{tmp_path / 'a.db'}?synchronous=NORMAL")
    other = await open_store(f"sqlite:///{tmp_path / 'b.db'}")
    memory, memory_too = await open_store("sqlite://"), await open_store("sqlite://")
    try:
        assert one.identity == two.identity
        assert len({one.identity, tuned.identity, other.identity}) == 3
        assert memory.identity != memory_too.identity  # each its own database
    finally:
        for store in (one, two, tuned, other, memory, memory_too):
            await store.close()


async def test_handles_of_one_store_share_one_reader(shared_url: str) -> None:
    """Two handles opened with one URL: one follower per room serves the waiters of
    both, and an event told through one wakes the waiters of the other at once."""
    first, second = await open_store(shared_url), await open_store(shared_url)
    room = f"share-{uuid.uuid4().hex[:8]}"
    await first.transact(room, appends=[Append("created")])
    try:
        assert first.identity == second.identity
        assert first.session.shared is second.session.shared
        async with (
            follow(first, room, lambda e: True) as one,
            follow(second, room, lambda e: True) as two,
        ):
            assert len(first.session.shared.followers) == 1
            await second.transact(room, appends=[Append("x")])
            assert await one.wait(5) and await two.wait(5)
            assert [e.type for e in one.take()[0]] == [e.type for e in two.take()[0]] == ["x"]
            tell(first, room, [Event(99, "told", {}, 0.0)])
            assert await two.wait(0)  # no read of the log in between
            assert [e.type for e in two.take()[0]] == ["told"]
        assert not first.session.shared.followers
    finally:
        await first.close()
        await second.close()


async def test_a_closed_handle_hands_the_reading_to_another(shared_url: str) -> None:
    """The follower reads through the first subscriber's handle; once that handle is
    closed, its read fails, the waiters resync, and it reads on through the other."""
    first, second = await open_store(shared_url), await open_store(shared_url)
    room = f"share-{uuid.uuid4().hex[:8]}"
    await second.transact(room, appends=[Append("created")])
    try:
        async with (
            follow(first, room, lambda e: True),
            follow(second, room, lambda e: e.type == "after") as sub,
        ):
            follower = first.session.shared.followers[(room, asyncio.get_running_loop())]
            assert follower.store is first
            await first.close()
            await second.transact(room, appends=[Append("after")])
            events: list[Event] = []
            while not events:
                assert await sub.wait(5)
                events += sub.take()[0]
            assert [e.type for e in events] == ["after"]
            assert follower.store is second
    finally:
        await second.close()


async def test_handles_of_separate_memory_stores_do_not_share() -> None:
    one, two = await open_store("memory://"), await open_store("memory://")
    assert one.identity != two.identity
    async with follow(one, "r", lambda e: True), follow(two, "r", lambda e: True):
        assert one.session.shared is not two.session.shared
        assert one.session.shared.followers and two.session.shared.followers
