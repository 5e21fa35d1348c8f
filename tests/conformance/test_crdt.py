"""CRDT sync on every backend: agents merge through the room, nothing is lost."""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentrooms.crdt import (
    GCounter,
    HybridClock,
    LWWRegister,
    ORSet,
    PNCounter,
    Text,
    Timestamp,
    compact,
    load,
    push,
    replica_key,
    sync,
)
from agentrooms.errors import BadRequest, StaleFence, VersionConflict
from agentrooms.store import Put, Store
from agentrooms.store.types import Prepared, ScanPage, Snapshot, TransactResult
from agentrooms.store.wrap import Forwarding
from tests.conformance.sourcing_workers import interleaved
from tests.conftest import Backend
from tests.helpers import Interposed

AGENTS, ROUNDS = 8, 6
TOKEN = re.compile(r"<\d+\.\d+>")


@dataclass
class Agent:
    """One agent's local replicas and what it did to them."""

    index: int
    store: Store
    node: str = ""
    g: GCounter = field(default_factory=GCounter)
    pn: PNCounter = field(default_factory=PNCounter)
    reg: LWWRegister = field(default_factory=LWWRegister)
    tags: ORSet = field(default_factory=ORSet)
    text: Text = field(default_factory=Text)
    pn_total: int = 0
    stamps: list[tuple[Timestamp, Any]] = field(default_factory=list)
    added: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    tokens: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.node = f"agent-{self.index}"
        self.rng = random.Random(self.index)
        self.clock = HybridClock(self.node)

    def work(self, r: int) -> None:
        self.g = self.g.increment(self.node)
        delta = self.rng.randint(-3, 5)
        self.pn, self.pn_total = self.pn.increment(self.node, delta), self.pn_total + delta
        self.reg = self.reg.set({"by": self.node, "round": r}, self.clock)
        assert self.reg.stamp is not None
        self.stamps.append((self.reg.stamp, self.reg.value))
        element = f"{self.node}/{r}"
        self.tags = self.tags.add(self.node, element)
        self.added.add(element)
        if r >= 2 and r % 2 == 0:
            victim = f"{self.node}/{r - 2}"
            self.tags = self.tags.remove(victim)
            self.removed.add(victim)
        self.edit_text(r)

    def edit_text(self, r: int) -> None:
        """Insert a token between two tokens; sometimes delete one of ours, whole."""
        current = self.text.value
        boundaries = [0, *(m.end() for m in TOKEN.finditer(current))]
        token = f"<{self.index}.{r}>"
        self.text = self.text.insert(self.node, self.rng.choice(boundaries), token)
        self.tokens.add(token)
        if r % 3 == 2:
            victim = f"<{self.index}.{r - 2}>"
            at = self.text.value.find(victim)
            assert at >= 0
            self.text = self.text.delete(self.node, at, len(victim))
            self.deleted.add(victim)

    async def sync_all(self, room: str) -> None:
        node = self.node
        self.g = await sync(self.store, room, "g", self.g, replica=node)
        self.pn = await sync(self.store, room, "pn", self.pn, replica=node)
        self.reg = await sync(self.store, room, "reg", self.reg, replica=node)
        self.tags = await sync(self.store, room, "tags", self.tags, replica=node)
        self.text = await sync(self.store, room, "text", self.text, replica=node)


async def test_eight_agents_converge_and_lose_nothing(backend: Backend, room: str) -> None:
    raw = [await backend.open() for _ in range(AGENTS)]
    agents = [Agent(i, interleaved(s)) for i, s in enumerate(raw)]

    async def run(agent: Agent) -> None:
        for r in range(ROUNDS):
            agent.work(r)
            await agent.sync_all(room)
            await asyncio.sleep(agent.rng.random() * 0.002)

    await asyncio.gather(*(run(a) for a in agents))
    for agent in agents:  # everyone has written everything; one more sync each
        await agent.sync_all(room)

    reader = agents[0].store
    room_g = await load(reader, room, "g", GCounter)
    room_text = await load(reader, room, "text", Text)
    for agent in agents:
        assert agent.g == room_g
        assert agent.pn == agents[0].pn and agent.reg == agents[0].reg
        assert agent.tags == agents[0].tags and agent.text == room_text
    assert agents[0].g.value == AGENTS * ROUNDS  # no increment lost
    assert agents[0].pn.value == sum(a.pn_total for a in agents)
    winner = max((s for a in agents for s in a.stamps), key=lambda s: s[0])
    assert (agents[0].reg.stamp, agents[0].reg.value) == winner
    added = set().union(*(a.added for a in agents))
    removed = set().union(*(a.removed for a in agents))
    assert agents[0].tags.value == added - removed
    text = agents[0].text.value
    kept = set().union(*(a.tokens for a in agents)) - set().union(*(a.deleted for a in agents))
    found = TOKEN.findall(text)
    assert sorted(found) == sorted(kept)  # each kept edit exactly once, deleted ones gone
    assert "".join(found) == text  # and nothing else: no edit was torn apart
    for s in set(raw):
        await s.close()


class Rejections(Forwarding):
    """Counts the transacts that the store rejected (a failed compare)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.writes = self.rejected = 0

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        self.writes += 1
        await asyncio.sleep(0)  # in-process agents interleave even on the memory backend
        try:
            return await self.inner._transact(room, ops)
        except (VersionConflict, StaleFence):
            self.rejected += 1
            raise


async def test_pushes_and_syncs_at_once_are_never_rejected(backend: Backend, room: str) -> None:
    stores = [Rejections(await backend.open()) for _ in range(AGENTS)]
    barrier = asyncio.Barrier(AGENTS)

    async def hammer(i: int, s: Store) -> GCounter:
        local = GCounter()
        for r in range(10):
            local = local.increment(f"n{i}")
            await barrier.wait()
            if r % 2:
                local = await sync(s, room, "hits", local, replica=f"n{i}")
            else:
                await push(s, room, "hits", local, replica=f"n{i}")
        return local

    finals = await asyncio.gather(*(hammer(i, s) for i, s in enumerate(stores)))
    final = await load(stores[0], room, "hits", GCounter)
    assert final is not None and final.value == AGENTS * 10
    assert all(f.value >= 10 for f in finals)
    assert sum(s.writes for s in stores) >= AGENTS * 5  # every push wrote
    assert sum(s.rejected for s in stores) == 0
    for s in stores:
        await s.inner.close()


async def test_sync_writes_only_what_is_new(store: Store, room: str) -> None:
    local = await sync(store, room, "c", GCounter().increment("a", 3), replica="a")
    mine = replica_key("c", "b")
    same = await sync(store, room, "c", GCounter().increment("a", 1), replica="b")  # nothing new
    assert same.value == 3
    assert (await store.read(room, [mine])).records == {}
    merged = await sync(store, room, "c", local.increment("b", 2), replica="b")
    assert merged.value == 5 and await load(store, room, "c", GCounter) == merged
    version = (await store.read(room, [mine])).version(mine)
    assert version is not None
    await sync(store, room, "c", merged, replica="b")
    assert (await store.read(room, [mine])).version(mine) == version


async def test_sync_onto_another_kind_is_refused_and_changes_nothing(
    store: Store, room: str
) -> None:
    await sync(store, room, "c", PNCounter().increment("a", 2), replica="a")
    await store.transact(room, writes=[Put("plain", {"not": "a crdt"})])
    keys = ["c", "plain", replica_key("c", "b"), replica_key("plain", "b")]
    before = await store.read(room, keys)
    with pytest.raises(BadRequest, match="expected a g-counter"):
        await sync(store, room, "c", GCounter().increment("a"), replica="b")
    with pytest.raises(BadRequest):
        await sync(store, room, "plain", ORSet(), replica="b")
    assert (await store.read(room, keys)).records == before.records


async def test_a_value_in_the_single_record_layout_reads_as_the_base(
    store: Store, room: str
) -> None:
    old = ORSet().add("a", "x").add("a", "y")
    await store.transact(room, writes=[Put("tags", old.to_json())])  # the old layout
    assert await load(store, room, "tags", ORSet) == old
    mine = await sync(store, room, "tags", ORSet().add("b", "z"), replica="b")
    assert mine.value == {"x", "y", "z"}
    assert (await store.read(room, ["tags"])).value("tags") == old.to_json()  # unconverted
    assert await compact(store, room, "tags", ORSet) == 1
    base = (await store.read(room, ["tags"])).value("tags")
    assert ORSet.from_json(base) == mine  # the base keeps the single-record form
    assert (await store.scan(room, "crdt/")).records == []
    assert await load(store, room, "tags", ORSet) == mine


async def test_compaction_keeps_what_is_pushed_while_it_runs(store: Store, room: str) -> None:
    counters = {n: GCounter().increment(n, i + 1) for i, n in enumerate(["a", "b", "c"])}
    for node, counter in counters.items():
        await push(store, room, "n", counter, replica=node)
    late = counters["b"].increment("b", 10)

    async def push_between(n: int, compares: list[Any]) -> None:
        if n == 2:  # after the base is written, before the replica records are deleted
            await push(store, room, "n", late, replica="b")

    assert await compact(Interposed(store, before=push_between), room, "n", GCounter) == 2
    left = (await store.scan(room, "crdt/")).records
    assert [r.key for r in left] == [replica_key("n", "b")]
    base = GCounter.from_json((await store.read(room, ["n"])).value("n"))
    assert base.value == 6  # what compaction read, b's push during it not yet
    loaded = await load(store, room, "n", GCounter)
    assert loaded is not None and loaded.value == 16  # nothing lost, nothing twice
    assert await compact(store, room, "n", GCounter) == 1
    assert await load(store, room, "n", GCounter) == loaded


async def test_a_load_over_the_bound_compacts(store: Store, room: str) -> None:
    for i in range(5):
        await push(store, room, "n", GCounter().increment(f"r{i}"), replica=f"r{i}")
    counted = Interposed(store)
    first = await load(counted, room, "n", GCounter, compact_above=4)
    assert first is not None and first.value == 5 and counted.calls >= 2
    assert (await store.scan(room, "crdt/")).records == []
    assert await load(store, room, "n", GCounter, compact_above=4) == first
    under = Interposed(store)
    await push(store, room, "n", GCounter().increment("r9"), replica="r9")
    again = await load(under, room, "n", GCounter, compact_above=4)
    assert again is not None and again.value == 6 and under.calls == 0  # not over: no write


async def test_values_whose_keys_share_a_prefix_do_not_mix(store: Store, room: str) -> None:
    await push(store, room, "a", GCounter().increment("x/y", 1), replica="x/y")
    await push(store, room, "a/x", GCounter().increment("y", 2), replica="y")
    await push(store, room, "a%2Fx", GCounter().increment("y", 4), replica="y")
    values = [await load(store, room, k, GCounter) for k in ("a", "a/x", "a%2Fx")]
    assert [v.value if v else None for v in values] == [1, 2, 4]
    assert replica_key("a/x", "y") != replica_key("a%2Fx", "y")
    with pytest.raises(BadRequest, match="node id"):
        await push(store, room, "a", GCounter(), replica="")


class CompactAfterFirstCall(Forwarding):
    """Runs a whole compaction right after the first read or scan it forwards returns."""

    def __init__(self, inner: Store, room: str, key: str) -> None:
        super().__init__(inner)
        self.room, self.key, self.calls = room, key, 0

    async def _after_call(self) -> None:
        self.calls += 1
        if self.calls == 1:
            assert await compact(self.inner, self.room, self.key, GCounter) == 3

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        snapshot = await self.inner._read(room, keys)
        await self._after_call()
        return snapshot

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        page = await self.inner._scan(room, prefix, after, limit)
        await self._after_call()
        return page


async def test_a_load_overtaken_by_a_compaction_misses_nothing(store: Store, room: str) -> None:
    await push(store, room, "n", GCounter().increment("old", 7), replica="old")
    await compact(store, room, "n", GCounter)  # a base, as well as replica records
    for node in ("a", "b", "c"):
        await push(store, room, "n", GCounter().increment(node, 1), replica=node)
    racing = CompactAfterFirstCall(store, room, "n")
    loaded = await load(racing, room, "n", GCounter, compact_above=None)
    assert racing.calls == 2  # the compaction ran between the load's scan and its read
    assert loaded is not None and loaded.value == 10


async def test_a_load_that_loses_the_base_to_another_compaction_leaves_it_the_folding(
    store: Store, room: str
) -> None:
    for i in range(5):
        await push(store, room, "n", GCounter().increment(f"r{i}"), replica=f"r{i}")

    async def compact_first(n: int, compares: list[Any]) -> None:
        if n == 1:  # another reader's compaction gets to the base first
            assert await compact(store, room, "n", GCounter) == 5

    racing = Interposed(store, before=compact_first)
    loaded = await load(racing, room, "n", GCounter, compact_above=4)
    assert loaded is not None and loaded.value == 5
    assert racing.calls == 1  # its compare-and-swap of the base failed; no deletes sent
    assert (await store.scan(room, "crdt/")).records == []
    assert await load(store, room, "n", GCounter) == loaded
