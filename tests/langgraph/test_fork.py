"""Two writers on one thread, both from the same parent: LangGraph's own savers fork the
thread, agentrooms' refuses the second writer.

The scenario, the same for every saver: writer A writes the thread's first checkpoint P;
A and B each read the thread's head (both get P); A writes a child of P, then B writes
a child of P. Each writer has its own saver (its own connection), as two agents would.
Then the same through LangGraph itself: agent A runs a graph, A and B read the thread's
state, and each updates it from there (``update_state``).
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, CheckpointTuple
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

from agentrooms.errors import AgentroomsError, LockHeld, StaleFence
from agentrooms.integrations.langgraph import AgentroomsSaver, ThreadHeld, ThreadOwnershipLost
from tests.conftest import Backend


def config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def checkpoint(note: str, version: int = 1) -> Checkpoint:
    """A checkpoint whose one channel ``note`` is at ``version``."""
    return Checkpoint(
        v=1,
        id=str(uuid6(clock_seq=-1)),
        ts="2000-01-01T00:00:00+00:00",
        channel_values={"note": note},
        channel_versions={"note": version},
        versions_seen={},
        updated_channels=None,
    )


VERSIONS = {"P": 1, "A": 2, "B": 3}  # each writer's next version of ``note`` is its own


async def write_from_head(
    saver: BaseCheckpointSaver[Any], head: CheckpointTuple, note: str
) -> None:
    """Write a child of ``head`` whose ``note`` is ``note``."""
    version = VERSIONS[note]
    cp = checkpoint(note, version)
    await saver.aput(head.config, cp, {"source": "loop", "step": 0}, {"note": version})


async def race(
    a: BaseCheckpointSaver[Any], b: BaseCheckpointSaver[Any], thread: str
) -> tuple[str, AgentroomsError | None]:
    """The scenario; returns P's id and what B's write raised (``None``: it wrote)."""
    parent = await a.aput(
        config(thread), checkpoint("P"), {"source": "input", "step": -1}, {"note": 1}
    )
    head_a, head_b = await a.aget_tuple(config(thread)), await b.aget_tuple(config(thread))
    assert head_a is not None and head_b is not None
    assert (
        head_a.checkpoint["id"]
        == head_b.checkpoint["id"]
        == parent["configurable"]["checkpoint_id"]
    )
    await write_from_head(a, head_a, "A")
    try:
        await write_from_head(b, head_b, "B")
    except AgentroomsError as exc:
        return head_a.checkpoint["id"], exc
    return head_a.checkpoint["id"], None


async def children_of(saver: BaseCheckpointSaver[Any], thread: str, parent: str) -> list[str]:
    """The notes of the checkpoints whose parent is ``parent``."""
    return [
        t.checkpoint["channel_values"]["note"]
        async for t in saver.alist(config(thread))
        if t.parent_config and t.parent_config["configurable"]["checkpoint_id"] == parent
    ]


@pytest.fixture(params=["sqlite", "postgres"])
def theirs(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """Which of LangGraph's savers, and the database it connects to."""
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "langgraph.db")
    return "postgres", request.getfixturevalue("postgres_url")


async def test_langgraphs_own_savers_fork_the_thread(theirs: tuple[str, str]) -> None:
    kind, conn = theirs
    async with AsyncExitStack() as stack:
        a: AsyncSqliteSaver | AsyncPostgresSaver
        b: AsyncSqliteSaver | AsyncPostgresSaver
        if kind == "sqlite":
            a = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(conn))
            b = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(conn))
        else:
            a = await stack.enter_async_context(AsyncPostgresSaver.from_conn_string(conn))
            b = await stack.enter_async_context(AsyncPostgresSaver.from_conn_string(conn))
        await a.setup()
        thread = f"t-{uuid.uuid4().hex}"
        parent, refused = await race(a, b, thread)
        assert refused is None  # nothing stopped B
        assert sorted(await children_of(a, thread, parent)) == ["A", "B"]  # P has two children
        head = await a.aget_tuple(config(thread))
        assert head is not None
        assert head.checkpoint["channel_values"]["note"] == "B"  # A's step is off the head


async def test_agentrooms_refuses_the_second_writer(backend: Backend, room: str) -> None:
    store_a, store_b = await backend.open(), await backend.open()
    a = AgentroomsSaver(store_a, owner="agent-a", room=room)
    b = AgentroomsSaver(store_b, owner="agent-b", room=room)
    thread = f"t-{uuid.uuid4().hex}"
    parent, refused = await race(a, b, thread)
    assert isinstance(refused, ThreadHeld) and isinstance(refused, LockHeld)
    assert refused.thread_id == thread and refused.holder == "agent-a"
    assert thread in str(refused) and "'agent-a'" in str(refused)
    assert await children_of(a, thread, parent) == ["A"]
    head = await b.aget_tuple(config(thread))
    assert head is not None and head.checkpoint["channel_values"]["note"] == "A"
    assert await b.aowner(thread) == "agent-a"


async def test_a_writer_whose_lease_was_taken_over_is_refused(backend: Backend, room: str) -> None:
    store_a, store_b = await backend.open(), await backend.open()
    a = AgentroomsSaver(store_a, owner="agent-a", room=room, ttl=0.3)
    b = AgentroomsSaver(store_b, owner="agent-b", room=room)
    thread = f"t-{uuid.uuid4().hex}"
    await a.aput(config(thread), checkpoint("P"), {"source": "input", "step": -1}, {"note": 1})
    head = await a.aget_tuple(config(thread))
    assert head is not None
    await asyncio.sleep(0.5)  # A stalls past its lease; B takes the thread and writes
    await b.atake(thread)
    await write_from_head(b, head, "B")
    with pytest.raises(ThreadOwnershipLost) as lost:
        await write_from_head(a, head, "A")
    assert isinstance(lost.value, StaleFence)
    assert lost.value.thread_id == thread and lost.value.holder == "agent-b"
    assert "'agent-b'" in str(lost.value) and thread in str(lost.value)
    assert await children_of(a, thread, head.checkpoint["id"]) == ["B"]


async def test_a_lapsed_lease_nobody_took_is_taken_again(backend: Backend, room: str) -> None:
    store = await backend.open()
    a = AgentroomsSaver(store, owner="agent-a", room=room, ttl=0.3)
    thread = f"t-{uuid.uuid4().hex}"
    await a.aput(config(thread), checkpoint("P"), {"source": "input", "step": -1}, {"note": 1})
    first = await a.atake(thread)
    await asyncio.sleep(0.5)  # a long step: the lease lapses, nobody else wants the thread
    assert await a.aowner(thread) is None
    head = await a.aget_tuple(config(thread))
    assert head is not None
    await write_from_head(a, head, "A")
    assert (await a.atake(thread)).fence == first.fence + 1  # no grant in between
    assert await a.aowner(thread) == "agent-a"


async def test_release_hands_the_thread_to_the_next_writer(backend: Backend, room: str) -> None:
    store_a, store_b = await backend.open(), await backend.open()
    a = AgentroomsSaver(store_a, owner="agent-a", room=room)
    b = AgentroomsSaver(store_b, owner="agent-b", room=room)
    thread = f"t-{uuid.uuid4().hex}"
    await a.aput(config(thread), checkpoint("P"), {"source": "input", "step": -1}, {"note": 1})
    waiting = asyncio.create_task(b.atake(thread, timeout=10))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # B waits in line while A owns the thread
    assert await a.arelease(thread) is True
    lock = await asyncio.wait_for(waiting, 10)
    assert lock.owner == "agent-b" and await a.aowner(thread) == "agent-b"
    head = await b.aget_tuple(config(thread))
    assert head is not None
    await write_from_head(b, head, "B")
    with pytest.raises(ThreadHeld):
        await write_from_head(a, head, "A")
    assert await a.arelease(thread) is False


# ------------------------------------------------------------- the same through a graph


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]


def notes_graph(saver: BaseCheckpointSaver[Any]) -> Any:
    builder = StateGraph(Notes)
    builder.add_node("speak", lambda state: {"notes": [f"{len(state['notes'])} so far"]})
    builder.add_edge(START, "speak")
    builder.add_edge("speak", END)
    return builder.compile(checkpointer=saver)


async def graph_race(
    a: BaseCheckpointSaver[Any], b: BaseCheckpointSaver[Any]
) -> tuple[Any, RunnableConfig, AgentroomsError | None]:
    """Agent A runs the graph; A and B each read the thread's state and update it from
    there (``update_state`` writes a child of the state it is given). Returns A's graph,
    the thread, and what B's update raised (``None``: it wrote)."""
    graph_a, graph_b = notes_graph(a), notes_graph(b)
    thread: RunnableConfig = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}}
    await graph_a.ainvoke({"notes": ["start"]}, thread)
    seen_a, seen_b = await graph_a.aget_state(thread), await graph_b.aget_state(thread)
    assert seen_a.config == seen_b.config
    await graph_a.aupdate_state(seen_a.config, {"notes": ["A"]})
    try:
        await graph_b.aupdate_state(seen_b.config, {"notes": ["B"]})
    except AgentroomsError as exc:
        return graph_a, thread, exc
    return graph_a, thread, None


async def forks(graph: Any, thread: RunnableConfig) -> int:
    """How many checkpoints of the thread share a parent with another."""
    parents = [
        s.parent_config["configurable"]["checkpoint_id"]
        async for s in graph.aget_state_history(thread)
        if s.parent_config is not None
    ]
    return len(parents) - len(set(parents))


async def test_langgraphs_own_savers_fork_a_graphs_thread(theirs: tuple[str, str]) -> None:
    kind, conn = theirs
    async with AsyncExitStack() as stack:
        a: AsyncSqliteSaver | AsyncPostgresSaver
        b: AsyncSqliteSaver | AsyncPostgresSaver
        if kind == "sqlite":
            a = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(conn))
            b = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(conn))
        else:
            a = await stack.enter_async_context(AsyncPostgresSaver.from_conn_string(conn))
            b = await stack.enter_async_context(AsyncPostgresSaver.from_conn_string(conn))
        await a.setup()
        graph, thread, refused = await graph_race(a, b)
        assert refused is None  # nothing stopped B
        assert await forks(graph, thread) == 1  # two checkpoints with one parent
        notes = (await graph.aget_state(thread)).values["notes"]
        assert notes[-1] == "B" and "A" not in notes  # A's update is off the head


async def test_agentrooms_refuses_the_second_agents_update(backend: Backend, room: str) -> None:
    a = AgentroomsSaver(await backend.open(), owner="agent-a", room=room)
    b = AgentroomsSaver(await backend.open(), owner="agent-b", room=room)
    graph, thread, refused = await graph_race(a, b)
    assert isinstance(refused, ThreadHeld) and refused.holder == "agent-a"
    assert await forks(graph, thread) == 0
    notes = (await graph.aget_state(thread)).values["notes"]
    assert notes[-1] == "A" and "B" not in notes


async def test_agents_racing_for_one_thread_leave_it_linear(backend: Backend, room: str) -> None:
    savers = [
        AgentroomsSaver(await backend.open(), owner=f"agent-{i}", room=room) for i in range(4)
    ]
    graphs = [notes_graph(s) for s in savers]
    thread: RunnableConfig = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}}
    outcomes = await asyncio.gather(
        *(g.ainvoke({"notes": [f"from {i}"]}, thread) for i, g in enumerate(graphs)),
        return_exceptions=True,
    )
    won = [i for i, o in enumerate(outcomes) if not isinstance(o, BaseException)]
    assert len(won) == 1, outcomes
    assert all(isinstance(o, ThreadHeld) for i, o in enumerate(outcomes) if i != won[0])
    assert await savers[0].aowner(thread["configurable"]["thread_id"]) == f"agent-{won[0]}"
    assert await forks(graphs[0], thread) == 0
    notes = (await graphs[0].aget_state(thread)).values["notes"]
    assert notes == [f"from {won[0]}", "1 so far"]


@pytest.mark.parametrize("keep_alive", [True, False])
async def test_owning_keeps_the_lease_alive_through_a_long_step(
    backend: Backend, room: str, keep_alive: bool
) -> None:
    a = AgentroomsSaver(await backend.open(), owner="agent-a", room=room, ttl=0.4)
    b = AgentroomsSaver(await backend.open(), owner="agent-b", room=room)
    thread = f"t-{uuid.uuid4().hex}"
    async with a.owning(thread, keep_alive=keep_alive) as lock:
        await asyncio.sleep(1.0)  # a step of more than twice the TTL, with no write
        if keep_alive:
            assert await b.aowner(thread) == "agent-a"
            with pytest.raises(ThreadHeld):
                await b.atake(thread)
        else:
            assert await b.aowner(thread) is None
        await a.aput(config(thread), checkpoint("A"), {"step": 0}, {"note": 1})
        assert (await a.atake(thread)).fence == lock.fence + (0 if keep_alive else 1)
    assert await b.aowner(thread) is None
