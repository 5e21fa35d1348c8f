"""Event-sourcing definitions shared by the tests and the worker functions that child
processes run (spawned, so everything here is importable at module level).

The ``task`` aggregate exists in two generations:

* ``TASK_V1`` is the "old code": it writes ``TaskPriorityChanged/v1`` with a priority
  word (``"low"``, ``"normal"``, ``"high"``).
* ``TASK`` is the current code: it reads ``TaskPriorityChanged/v3`` (an integer level
  and a reason), through the upcasters v1 -> v2 (word -> level) -> v3 (add a reason).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrooms.retry import FullJitter, RetryPolicy
from agentrooms.sourcing import (
    Aggregate,
    Aggregates,
    DomainEvent,
    Projection,
    Projector,
    Recorded,
    Rows,
    Upcasters,
)
from agentrooms.store import Compare, Store, open_store
from tests.helpers import Interposed

POLICY = RetryPolicy(max_attempts=500, budget=120, backoff=FullJitter(base=0.001, cap=0.02))
LEVELS = {"low": 1, "normal": 2, "high": 3}

UPCASTERS = Upcasters()


@UPCASTERS.register("TaskPriorityChanged", 1)
def _priority_word_to_level(data: Any) -> Any:
    return {"priority": LEVELS[data["priority"]]}


@UPCASTERS.register("TaskPriorityChanged", 2)
def _add_reason(data: Any) -> Any:
    return {**data, "reason": "unknown"}


def fold_task(state: dict[str, Any], event: DomainEvent) -> dict[str, Any]:
    """The current fold: pure, returns a new dict."""
    data = event.data
    if event.name == "TaskCreated":
        return {**state, "title": data["title"], "priority": 2, "notes": [], "events": 1}
    new = {**state, "events": state.get("events", 0) + 1}
    if event.name == "TaskPriorityChanged":
        new["priority"] = data["priority"]
        new["reason"] = data["reason"]
    elif event.name == "TaskAssigned":
        new["assignee"] = data["agent"]
    elif event.name == "TaskNoted":
        new["notes"] = [*state.get("notes", []), data]
    return new


def fold_task_v1(state: dict[str, Any], event: DomainEvent) -> dict[str, Any]:
    """The old fold, with priority words."""
    if event.name == "TaskPriorityChanged":
        return {**state, "priority_word": event.data["priority"]}
    return fold_task(state, event)


TASK = Aggregate(
    "task",
    dict,
    fold_task,
    {"TaskCreated": 1, "TaskPriorityChanged": 3, "TaskAssigned": 1, "TaskNoted": 1},
    upcasters=UPCASTERS,
    snapshot_every=5,
    schema=2,
)

TASK_V1 = Aggregate(
    "task",
    dict,
    fold_task_v1,
    {"TaskCreated": 1, "TaskPriorityChanged": 1, "TaskAssigned": 1, "TaskNoted": 1},
    snapshot_every=2,
    schema=1,
)


def created(title: str) -> DomainEvent:
    return DomainEvent.of("TaskCreated/v1", {"title": title})


def noted(value: Any) -> DomainEvent:
    return DomainEvent.of("TaskNoted/v1", value)


def count_events(rows: Rows, event: Recorded) -> None:
    """Projection v1: events per task, and the total."""
    rows.put(f"task:{event.id}", rows.get(f"task:{event.id}", 0) + 1)
    rows.put("total", rows.get("total", 0) + 1)


def priorities(rows: Rows, event: Recorded) -> None:
    """Projection v2: the tasks at each priority level (reads events through upcasters)."""
    if event.event.name != "TaskPriorityChanged":
        return
    level = event.event.data["priority"]
    for other in (1, 2, 3):
        members = [m for m in rows.get(f"level:{other}", []) if m != event.id]
        if other == level:
            members.append(event.id)
        if members:
            rows.put(f"level:{other}", sorted(members))
        else:
            rows.delete(f"level:{other}")


COUNTS_V1 = Projection("tasks", count_events, version=1, batch=7)
PRIORITIES_V2 = Projection("tasks", priorities, version=2, upcasters=UPCASTERS, batch=7)


async def _yield(n: int, compares: list[Compare]) -> None:
    await asyncio.sleep(0)


def interleaved(store: Store) -> Store:
    """The store, yielding to other coroutines between a read and its write, so that
    in-process agents interleave even on the memory backend (whose calls never wait)."""
    return Interposed(store, before=_yield)


# ------------------------------------------------------------------ child processes


def load_task(url: str, room: str, task_id: str) -> tuple[int, int, Any, Any]:
    """(version, snapshot position, state from snapshot + tail, state of a full replay)."""

    async def run() -> tuple[int, int, Any, Any]:
        store = await open_store(url)
        try:
            tasks = Aggregates(store, room, TASK)
            loaded = await tasks.load(task_id)
            full = await tasks.load(task_id, snapshots=False)
            return loaded.version, loaded.snapshot, loaded.state, full.state
        finally:
            await store.close()

    return asyncio.run(run())


def project_counts(url: str, room: str) -> dict[str, Any]:
    """Catch the counting projection up in this process; return its rows."""

    async def run() -> dict[str, Any]:
        store = await open_store(url)
        try:
            projector = Projector(store, room, COUNTS_V1, policy=POLICY)
            await projector.catch_up()
            rows, _ = await projector.rows(limit=1000)
            return rows
        finally:
            await store.close()

    return asyncio.run(run())


def append_batches(
    url: str, room: str, task_id: str, writer: int, count: int, size: int
) -> list[int]:
    """``count`` appends of ``size`` events each to one task; returns the first stream
    position of each acknowledged batch."""

    async def run() -> list[int]:
        store = await open_store(url)
        try:
            tasks = Aggregates(store, room, TASK, policy=POLICY)
            acked = []
            for i in range(count):
                batch = [noted({"w": writer, "i": i, "k": k}) for k in range(size)]
                done = await tasks.append(task_id, batch)
                acked.append(done.first)
            return acked
        finally:
            await store.close()

    return asyncio.run(run())
