"""CRDT sync on every backend: agents merge through the room, nothing is lost."""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agentrooms.crdt import (
    GCounter,
    HybridClock,
    LWWRegister,
    ORSet,
    PNCounter,
    Text,
    Timestamp,
    load,
    sync,
)
from agentrooms.errors import BadRequest
from agentrooms.metrics import Metrics
from agentrooms.store import Put, Store
from tests.conformance.sourcing_workers import interleaved
from tests.conftest import Backend

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
        self.g = await sync(self.store, room, "g", self.g)
        self.pn = await sync(self.store, room, "pn", self.pn)
        self.reg = await sync(self.store, room, "reg", self.reg)
        self.tags = await sync(self.store, room, "tags", self.tags)
        self.text = await sync(self.store, room, "text", self.text)


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


async def test_syncs_at_once_are_never_rejected(backend: Backend, room: str) -> None:
    stores = [await backend.open() for _ in range(AGENTS)]
    barrier = asyncio.Barrier(AGENTS)
    metrics = Metrics(CollectorRegistry())

    async def hammer(i: int, s: Store) -> GCounter:
        local = GCounter()
        for _ in range(10):
            local = local.increment(f"n{i}")
            await barrier.wait()
            local = await sync(interleaved(s), room, "hits", local, metrics=metrics)
        return local

    await asyncio.gather(*(hammer(i, s) for i, s in enumerate(stores)))
    final = await load(stores[0], room, "hits", GCounter)
    assert final is not None and final.value == AGENTS * 10
    assert metrics.snapshot()["errors"]["conflict"] > 0  # the merge-on-conflict path ran
    for s in set(stores):
        await s.close()


async def test_sync_writes_only_what_is_new(store: Store, room: str) -> None:
    local = await sync(store, room, "c", GCounter().increment("a", 3))
    version = (await store.read(room, ["c"])).version("c")
    same = await sync(store, room, "c", GCounter().increment("a", 1))  # nothing new
    assert same.value == 3
    assert (await store.read(room, ["c"])).version("c") == version
    merged = await sync(store, room, "c", local.increment("b", 2))
    assert merged.value == 5 and await load(store, room, "c", GCounter) == merged


async def test_sync_onto_another_kind_is_refused_and_changes_nothing(
    store: Store, room: str
) -> None:
    await sync(store, room, "c", PNCounter().increment("a", 2))
    await store.transact(room, writes=[Put("plain", {"not": "a crdt"})])
    before = await store.read(room, ["c", "plain"])
    with pytest.raises(BadRequest, match="expected a g-counter"):
        await sync(store, room, "c", GCounter().increment("a"))
    with pytest.raises(BadRequest):
        await sync(store, room, "plain", ORSet())
    assert (await store.read(room, ["c", "plain"])).records == before.records
