"""What a process remembers of its locks stays bounded."""

from __future__ import annotations

import pytest

from agentrooms.rooms import Rooms
from agentrooms.rooms.locks import knowledge as knowledge_module
from agentrooms.store import open_store


async def test_a_process_remembers_a_bounded_number_of_locks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(knowledge_module, "SEEN", 3)
    store = await open_store("memory://")
    room = await Rooms(store).create("r")
    for i in range(5):
        assert await room.locks.release(await room.locks.try_acquire(f"l{i}", "a"))
    assert knowledge_module.knowledge_of(store).known() == [("r", "l2"), ("r", "l3"), ("r", "l4")]
    # a lock it forgot is taken the long way, with the right fencing token
    assert (await room.locks.try_acquire("l0", "a")).fence == 2
    await store.close()
