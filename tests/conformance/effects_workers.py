"""Outbox workers for the effect tests: the same coroutines run in a spawned child process
(shared backends: it opens the store by URL) or in the test's own process (memory://).

Crashes happen at named points, never by timing: ``Hooks.point(name)`` ends the process
with ``os._exit`` (no cleanup, no finally blocks, like SIGKILL) when ``name`` is the
configured crash point; in-process it raises :class:`Crashed`, a ``BaseException`` that
nothing in the library catches, so nothing is recorded after it either.

Crash points, in the order a worker passes them::

    before_call   claimed, the sink not called yet
    after_call    the sink accepted the call; success not recorded
    after_record  success recorded
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NoReturn

from agentrooms.effects import TERMINAL, Effect, Outbox, Outcome, Reconciler, Worker
from agentrooms.errors import StaleFence
from agentrooms.rooms import Rooms
from agentrooms.store import Store, open_store

CRASH_EXIT = 70
STALE_FENCE_EXIT = 3
POINTS = ("before_call", "after_call", "after_record")


class Crashed(BaseException):
    """The in-process stand-in for the process dying at a crash point."""


@dataclass
class Hooks:
    """How a scenario reaches the test: where to crash, how to report, how to freeze."""

    crash_at: str | None = None
    crash: Callable[[], NoReturn] | None = None
    report: Callable[[Any], None] = lambda _: None
    pause: Callable[[], Awaitable[None]] | None = None
    passed: list[str] = field(default_factory=list)

    def point(self, name: str) -> None:
        self.passed.append(name)
        if name == self.crash_at:
            assert self.crash is not None
            self.crash()


# ------------------------------------------------------------------------ sink client


def sink_post(sink_url: str, key: str, params: Any) -> Any:
    """POST the operation to the sink with ``key`` as its Idempotency-Key."""
    request = urllib.request.Request(
        f"{sink_url}/apply",
        data=json.dumps(params).encode(),
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def sink_lookup(sink_url: str, key: str) -> Any | None:
    """The sink's stored response for ``key``, or ``None`` if it never applied it."""
    try:
        with urllib.request.urlopen(f"{sink_url}/calls/{key}", timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            return None
        raise


def sink_handler(sink_url: str, hooks: Hooks) -> Callable[[Effect], Awaitable[Any]]:
    async def handler(effect: Effect) -> Any:
        hooks.point("before_call")
        response = await asyncio.to_thread(
            sink_post, sink_url, effect.idempotency_key, effect.params
        )
        hooks.point("after_call")
        return response

    return handler


def sink_check(sink_url: str) -> Callable[[Effect], Awaitable[Outcome]]:
    """Ask the sink by idempotency key whether the effect was applied."""

    async def check(effect: Effect) -> Outcome:
        found = await asyncio.to_thread(sink_lookup, sink_url, effect.idempotency_key)
        return Outcome.not_applied() if found is None else Outcome.applied(found)

    return check


# ------------------------------------------------------------------------- scenarios


async def work(
    store: Store,
    room: str,
    sink_url: str,
    hooks: Hooks,
    *,
    name: str,
    lease_ttl: float,
    expect: int,
    timeout: float = 20.0,
) -> int:
    """Settle what a dead worker left (reconciler), then perform effects, until ``expect``
    effects of the room are terminal. Returns 0 (or dies at the crash point)."""
    outbox = Outbox(Rooms(store).room(room))
    worker = Worker(outbox, sink_handler(sink_url, hooks), name=name, lease_ttl=lease_ttl)
    reconciler = Reconciler(outbox, sink_check(sink_url), name=f"{name}-rec", unknown_after=0.1)
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        await reconciler.run_once()
        effect = await worker.claim()
        if effect is not None:
            await worker.perform(effect)
            hooks.point("after_record")
            continue
        if sum(e.status in TERMINAL for e in await outbox.effects()) >= expect:
            return 0
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{name}: fewer than {expect} effects settled in {timeout}s")


async def pause_then_call(
    store: Store, room: str, sink_url: str, hooks: Hooks, *, name: str, lease_ttl: float
) -> int:
    """Claim the only effect, report the fence, freeze (``hooks.pause``, no lease
    renewal: a stalled process) before calling the sink, then call it and try to record.
    Returns 3 if the record was fenced out."""
    outbox = Outbox(Rooms(store).room(room))

    async def handler(effect: Effect) -> Any:
        hooks.report(effect.fence)
        assert hooks.pause is not None
        await hooks.pause()
        return await asyncio.to_thread(sink_post, sink_url, effect.idempotency_key, effect.params)

    worker = Worker(outbox, handler, name=name, lease_ttl=lease_ttl, renew_every=0)
    effect = await worker.claim()
    assert effect is not None
    try:
        await worker.perform(effect)
    except StaleFence:
        return STALE_FENCE_EXIT
    return 0


SCENARIOS: dict[str, Callable[..., Coroutine[Any, Any, int]]] = {
    "work": work,
    "pause_then_call": pause_then_call,
}


def process_main(
    url: str, scenario: str, room: str, sink_url: str, options: dict[str, Any], channel: Any
) -> None:
    """Child process entry: open the store by URL and run ``scenario``. ``channel`` is a
    (queue, event) pair: reports go to the queue, a pause blocks the whole process (its
    event loop included, so no lease renewal either) until the event is set."""
    queue, go = channel
    crash_at = options.pop("crash_at", None)

    async def frozen() -> None:
        go.wait(60)  # deliberately blocking: the process is "stopped"

    hooks = Hooks(crash_at, lambda: os._exit(CRASH_EXIT), queue.put, frozen)

    async def run() -> int:
        store = await open_store(url)
        try:
            return await SCENARIOS[scenario](store, room, sink_url, hooks, **options)
        finally:
            await store.close()

    sys.exit(asyncio.run(run()))
