"""A repeated command returns exactly what its first delivery returned (the versions,
sequence numbers and grants the store assigned), not the state as it is now, and applies
nothing: through the library here, on every backend; the HTTP and MCP surfaces have
their own tests (tests/server/test_idempotency.py, tests/mcp/test_replays.py)."""

from __future__ import annotations

import asyncio

import pytest

from agentrooms.commit import Change, View, commit
from agentrooms.errors import IdempotencyMismatch, LockHeld, VersionConflict
from agentrooms.rooms import Lock, Rooms
from agentrooms.store import Append, Put, Store


async def test_a_commit_replay_returns_the_versions_and_seqs_first_given(
    store: Store, room: str
) -> None:
    def write(view: View, n: int) -> Change:
        return Change(writes=[Put("k", n)], appends=[Append("wrote", n)], result=n)

    first = await commit(store, room, write, 1, keys=["k"], command_id="c1")
    await commit(store, room, write, 2, keys=["k"])  # another writer, after it
    again = await commit(store, room, write, 1, keys=["k"], command_id="c1")
    assert again.replayed and again.result == 1
    assert again.versions == {"k": first.versions["k"]} and again.seqs == first.seqs
    assert len(await store.read_log(room)) == 2


async def test_a_document_replay_returns_the_version_first_written(store: Store, room: str) -> None:
    docs = (await Rooms(store).create(room)).docs
    first = await docs.put("notes", "alice's", create_only=True, command_id="w1")
    other = await docs.put("notes", "bob's", if_match=first.version)
    replay = await docs.put("notes", "alice's", create_only=True, command_id="w1")
    assert replay == first and replay.version != other.version
    with pytest.raises(VersionConflict):  # a write made with the replayed version
        await docs.put("notes", "alice's again", if_match=replay.version)
    assert (await docs.get("notes")).value == "bob's"


async def test_an_event_replay_returns_the_seq_first_given(store: Store, room: str) -> None:
    events = (await Rooms(store).create(room)).events
    seq = await events.post("note", {"n": 1}, command_id="e1")
    await events.post("note", {"n": 2})
    assert await events.post("note", {"n": 1}, command_id="e1") == seq
    assert [e.seq for e in await events.read(after=seq - 1)] == [seq, seq + 1]
    with pytest.raises(IdempotencyMismatch):
        await events.post("note", {"n": 3}, command_id="e1")


@pytest.mark.parametrize("how", ["try", "wait"])
async def test_a_lock_replay_returns_the_first_grant(store: Store, room: str, how: str) -> None:
    locks = (await Rooms(store).create(room)).locks

    async def acquire(owner: str, command_id: str | None = None) -> Lock:
        if how == "try":
            return await locks.try_acquire("deploy", owner, ttl=30, command_id=command_id)
        return await locks.wait_acquire("deploy", owner, ttl=30, timeout=1, command_id=command_id)

    first = await acquire("alice", "g1")
    assert await acquire("alice", "g1") == first  # while held: the same grant
    assert await locks.release(first)
    bob = await acquire("bob")
    assert await acquire("alice", "g1") == first  # after it changed hands: still the first
    holder = await locks.holder("deploy")
    assert holder is not None and holder.owner == "bob" and holder.fence == bob.fence
    with pytest.raises(LockHeld):
        await locks.try_acquire("deploy", "alice", command_id="g2")


async def test_a_lock_granted_after_a_wait_is_replayed(store: Store, room: str) -> None:
    locks = (await Rooms(store).create(room)).locks
    bob = await locks.try_acquire("deploy", "bob", ttl=30)
    waiting = asyncio.create_task(
        locks.wait_acquire("deploy", "alice", ttl=30, timeout=10, command_id="g1")
    )
    await asyncio.sleep(0.2)
    assert await locks.release(bob)
    first = await waiting
    assert first.owner == "alice" and first.fence == bob.fence + 1
    assert await locks.release(first)
    await locks.try_acquire("deploy", "carol", ttl=30)
    again = await locks.wait_acquire("deploy", "alice", ttl=30, timeout=1, command_id="g1")
    assert again == first
