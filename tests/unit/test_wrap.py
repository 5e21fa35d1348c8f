"""``store.wrap.Forwarding``: which operations reach the inner store, and how."""

from __future__ import annotations

from agentrooms.store import Append, Event, Store, open_store
from agentrooms.store.wrap import Forwarding


class Inner:
    """Records which of the inner store's log operations ran."""

    def __init__(self, store: Store) -> None:
        self.ran: list[str] = []
        self.store = store
        follow, watch = store._follow_log, store._watch

        async def follow_log(room: str, after: int, timeout: float, limit: int) -> list[Event]:
            self.ran.append("follow_log")
            return await follow(room, after, timeout, limit)

        async def watch_(room: str, after: int, timeout: float) -> int:
            self.ran.append("watch")
            return await watch(room, after, timeout)

        store._follow_log = follow_log  # type: ignore[method-assign]
        store._watch = watch_  # type: ignore[method-assign]


class Observing(Forwarding):
    watched = 0

    async def _watch(self, room: str, after: int, timeout: float) -> int:
        self.watched += 1
        return await super()._watch(room, after, timeout)


async def test_follow_log_is_the_backends_own_unless_watch_or_read_log_is_observed() -> None:
    inner = Inner(await open_store("memory://"))
    await inner.store.transact("r", [], [], [Append("x")])
    plain = Forwarding(inner.store)
    assert [e.type for e in await plain.follow_log("r", 0, 1.0)] == ["x"]
    assert inner.ran[0] == "follow_log"  # the backend's own: one round trip on Redis

    inner.ran.clear()
    observing = Observing(inner.store)
    assert [e.type for e in await observing.follow_log("r", 0, 1.0)] == ["x"]
    assert observing.watched == 1 and inner.ran == ["watch"]  # the override saw it
    await inner.store.close()
