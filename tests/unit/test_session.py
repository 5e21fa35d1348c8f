"""What a process knows about a store lives in one session per handle (store.session)."""

from __future__ import annotations

import asyncio

from agentrooms.commit import Change, View, commit
from agentrooms.rooms.locks import knowledge_of
from agentrooms.sourcing import Aggregates
from agentrooms.store import Put, Store, open_store
from tests.conformance import sourcing_workers as w
from tests.helpers import Interposed


async def test_each_handle_has_one_session_and_handles_of_one_store_share_its_part(
    shared_url: str,
) -> None:
    one, two = await open_store(shared_url), await open_store(shared_url)
    private = await open_store("memory://")
    try:
        assert one.session is one.session and one.session is not two.session
        assert one.session.shared is two.session.shared  # same data: followers, waiters
        assert private.session.shared is not one.session.shared
        assert knowledge_of(one) is one.session.locks  # lock knowledge: per handle
        assert knowledge_of(one) is not knowledge_of(two)
    finally:
        for store in (one, two, private):
            await store.close()


async def test_memory_handles_share_nothing() -> None:
    one, two = await open_store("memory://"), await open_store("memory://")
    assert one.session.shared is not two.session.shared
    await one.close()
    await two.close()


def test_turns_are_per_event_loop() -> None:
    async def turns(store: Store) -> object:
        return store.session.turns()

    async def main() -> Store:
        return await open_store("memory://")

    store = asyncio.run(main())
    first, again = asyncio.run(turns(store)), asyncio.run(turns(store))
    assert first is not again  # another loop: its asyncio locks cannot be shared

    async def same() -> None:
        assert store.session.turns() is store.session.turns()

    asyncio.run(same())


async def test_aggregates_of_one_definition_on_one_handle_share_what_they_wrote() -> None:
    """A second Aggregates of the same definition on the same handle appends without a
    read after the first one's append; on another handle it reads."""
    store = await open_store("memory://")
    room = "r"
    await Aggregates(store, room, w.TASK).append("t1", [w.created("x")])
    counting = Interposed(store)
    reads = counting.reads
    # Interposed is another handle: a session of its own, so it reads the head first
    await Aggregates(counting, room, w.TASK).append("t1", [w.noted("a")])
    assert counting.reads > reads
    again = Aggregates(counting, room, w.TASK)
    reads = counting.reads
    await again.append("t1", [w.noted("b")])
    assert counting.reads == reads  # what the first Aggregates on this handle wrote
    loaded = await again.load("t1", snapshots=False)
    assert loaded.version == 3 and loaded.state["notes"] == ["a", "b"]
    await store.close()


async def test_a_commit_marks_hot_keys_in_its_handles_turns() -> None:
    store = await open_store("memory://")
    await store.transact("r", writes=[Put("k", 0)])
    stale = await store.read("r", ["k"])
    await store.transact("r", writes=[Put("k", 1)])

    def bump(view: View, _: None) -> Change:
        return Change(writes=[Put("k", (view.get("k") or 0) + 1)])

    done = await commit(store, "r", bump, None, keys=["k"], guess=stale)
    assert done.attempts == 2  # the guess lost: "k" conflicted, and is hot now
    assert store.session.turns().hot_keys("r", ["k", "other"]) == [("r", "k")]
    await store.close()
