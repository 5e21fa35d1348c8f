"""The outbox on every backend, against a real local sink (an HTTP server on 127.0.0.1
that deduplicates by ``Idempotency-Key`` and counts what it applied), with real worker
processes that are killed at deterministic points (issue: effects; seed 003 §8).

memory:// cannot be shared with another process, so there the same worker coroutines run
in the test's process and "die" by raising at the crash point.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import multiprocessing
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agentrooms.commit import Change, View
from agentrooms.effects import (
    COMPENSATED,
    FAILED,
    PENDING,
    SUCCEEDED,
    UNKNOWN,
    Effect,
    EffectRequest,
    Outbox,
    Outcome,
    OutcomeUnknown,
    PermanentFailure,
    Reconciler,
    Worker,
    request_effects,
)
from agentrooms.errors import IdempotencyMismatch, StoreUnavailable, VersionConflict
from agentrooms.retry import NoBackoff
from agentrooms.rooms import Room, Rooms
from agentrooms.store import Put, Store, TransactResult
from tests.conformance import effects_workers as ew
from tests.conftest import Backend
from tests.helpers import Interposed

# ------------------------------------------------------------------------------ sink


class Sink:
    """An idempotent HTTP sink: ``POST /apply`` with an ``Idempotency-Key`` applies the
    call once and stores its response; a repeated key gets the stored response back and
    applies nothing. ``GET /calls/<key>`` answers the stored response or 404."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.responses: dict[str, Any] = {}
        self.applied: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                key = self.headers.get("Idempotency-Key")
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path != "/apply" or not key:
                    self._answer(400, {"error": "POST /apply with an Idempotency-Key"})
                    return
                with sink.lock:
                    sink.calls[key] += 1
                    if key not in sink.responses:
                        sink.applied[key] += 1
                        sink.responses[key] = {
                            "key": key,
                            "n": len(sink.responses) + 1,
                            "got": body,
                        }
                    response = sink.responses[key]
                self._answer(200, response)

            def do_GET(self) -> None:
                key = self.path.removeprefix("/calls/")
                with sink.lock:
                    found = sink.responses.get(key)
                self._answer(404 if found is None else 200, found or {"error": "unknown key"})

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def room(store: Store) -> Room:
    return await Rooms(store).create(f"fx-{uuid.uuid4().hex[:10]}", "effects")


# -------------------------------------------------------------------- running workers


@dataclass
class Launched:
    """A scenario running in a child process or in-process; ``wait`` gives its exit code."""

    task: asyncio.Task[int] | None = None
    process: Any = None
    queue: Any = None  # reports (a multiprocessing or an asyncio queue)
    go: Any = None  # releases a paused scenario

    async def report(self) -> Any:
        if self.process is not None:
            return await asyncio.to_thread(self.queue.get, True, 60)
        return await asyncio.wait_for(self.queue.get(), 60)

    def release(self) -> None:
        self.go.set()

    async def wait(self) -> int:
        if self.process is not None:
            await asyncio.to_thread(self.process.join, 60)
            code: int = self.process.exitcode
            return code
        assert self.task is not None
        try:
            return await asyncio.wait_for(self.task, 60)
        except ew.Crashed:
            return ew.CRASH_EXIT

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        if self.task is not None:
            self.task.cancel()


@contextlib.asynccontextmanager
async def launch(
    backend: Backend, store: Store, scenario: str, room: Room, sink: Sink, **options: Any
) -> AsyncIterator[Launched]:
    if backend.shared_across_processes:
        ctx = multiprocessing.get_context("spawn")
        queue, go = ctx.Queue(), ctx.Event()
        process = ctx.Process(
            target=ew.process_main,
            args=(backend.url, scenario, room.name, sink.url, options, (queue, go)),
        )
        process.start()
        launched = Launched(process=process, queue=queue, go=go)
    else:
        reports: asyncio.Queue[Any] = asyncio.Queue()
        go_event = asyncio.Event()

        def crash() -> Any:
            raise ew.Crashed

        async def paused() -> None:
            await go_event.wait()

        hooks = ew.Hooks(options.pop("crash_at", None), crash, reports.put_nowait, paused)
        coro = ew.SCENARIOS[scenario](store, room.name, sink.url, hooks, **options)
        launched = Launched(task=asyncio.create_task(coro), queue=reports, go=go_event)
    try:
        yield launched
    finally:
        launched.kill()
        if launched.process is not None:
            launched.queue.close()
            launched.queue.join_thread()


async def run_scenario(
    backend: Backend, store: Store, scenario: str, room: Room, sink: Sink, **options: Any
) -> int:
    async with launch(backend, store, scenario, room, sink, **options) as launched:
        return await launched.wait()


async def events(store: Store, room: Room, prefix: str = "effect.") -> list[tuple[str, Any]]:
    log = await store.read_log(room.name, 0, 10_000)
    return [(e.type, e.data) for e in log if e.type.startswith(prefix)]


async def request_three(room: Room) -> Outbox:
    outbox = Outbox(room)
    for i in range(3):
        await outbox.request(f"op-{i}", "notify", {"i": i})
    return outbox


# ------------------------------------------------------- requesting with a state change


async def test_effect_commits_with_the_state_change(store: Store, room: Room) -> None:
    def ship(view: View, order: str) -> Change:
        status = view.get(f"order/{order}", {}).get("status")
        change = Change(writes=[Put(f"order/{order}", {"status": "shipped"})], result=status)
        return request_effects(view, change, EffectRequest(f"mail-{order}", "mail", {"to": "x"}))

    await room.scope.commit(ship, "o1", ["order/o1"])
    effect = await Outbox(room).get("mail-o1")
    assert (effect.status, effect.kind, effect.params, effect.fence) == (
        PENDING,
        "mail",
        {"to": "x"},
        0,
    )
    assert await Outbox(room).counts() == {"pending": 1, "inflight": 0, "dead": 0}
    assert ("effect.requested", {"effect": "mail-o1", "kind": "mail", "compensates": None}) in (
        await events(store, room)
    )
    await room.scope.commit(ship, "o1", ["order/o1"])  # the same request again: nothing new
    assert (await Outbox(room).get("mail-o1")).version == effect.version
    with pytest.raises(IdempotencyMismatch):
        await Outbox(room).request("mail-o1", "mail", {"to": "someone else"})


async def test_a_failed_compare_records_neither_state_nor_effect(store: Store, room: Room) -> None:
    request = EffectRequest("charge-1", "charge", {"cents": 100})
    await Outbox(room).request("charge-1", "charge", {"cents": 100})
    with pytest.raises(VersionConflict):
        await store.transact(
            room.name,
            request.compares(),
            [Put("order/o2", 1), *request.writes()],
            request.appends(),
        )
    assert not (await store.read(room.name, ["order/o2"])).exists("order/o2")
    assert await Outbox(room).counts() == {"pending": 1, "inflight": 0, "dead": 0}


# ------------------------------------------------------------ workers against the sink


async def test_workers_apply_each_effect_once(
    backend: Backend, store: Store, room: Room, sink: Sink
) -> None:
    outbox = await request_three(room)
    code = await run_scenario(
        backend, store, "work", room, sink, name="w1", lease_ttl=5.0, expect=3
    )
    assert code == 0
    done = await outbox.effects()
    assert [e.status for e in done] == [SUCCEEDED] * 3
    assert sink.applied == {f"op-{i}": 1 for i in range(3)}
    assert [e.result for e in done] == [sink.responses[e.id] for e in done]
    kinds = [k for k, _ in await events(store, room)]
    assert kinds.count("effect.claimed") == kinds.count("effect.succeeded") == 3
    assert await outbox.counts() == {"pending": 0, "inflight": 0, "dead": 0}


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", ew.POINTS)
async def test_a_killed_worker_loses_and_repeats_nothing(
    backend: Backend, store: Store, room: Room, sink: Sink, crash_at: str
) -> None:
    """The worker dies (os._exit) at ``crash_at`` on its first effect; a restarted
    worker's reconciler settles it by asking the sink; every effect ends up succeeded and
    the sink applied each exactly once."""
    outbox = await request_three(room)
    first = await run_scenario(
        backend,
        store,
        "work",
        room,
        sink,
        name="doomed",
        lease_ttl=1.0,
        expect=3,
        crash_at=crash_at,
    )
    assert first == ew.CRASH_EXIT
    (victim,) = [e for e in await outbox.effects() if e.fence == 1]
    expected_status = SUCCEEDED if crash_at == "after_record" else "claimed"
    assert victim.status == expected_status
    assert sink.applied[victim.id] == (0 if crash_at == "before_call" else 1)

    again = await run_scenario(
        backend, store, "work", room, sink, name="reborn", lease_ttl=5.0, expect=3
    )
    assert again == 0
    final = await outbox.effects()
    assert [e.status for e in final] == [SUCCEEDED] * 3
    assert sink.applied == {f"op-{i}": 1 for i in range(3)}
    assert all(sink.calls[key] == 1 for key in sink.calls)  # nothing was even re-sent
    settled = await outbox.get(victim.id)
    assert settled.result == sink.responses[victim.id]
    log = await events(store, room)
    reconciled = [d for k, d in log if k == "effect.reconciling"]
    if crash_at == "after_record":
        assert reconciled == []
    else:
        assert [d["effect"] for d in reconciled] == [victim.id]
        assert reconciled[0]["previous_holder"] == "doomed"
    if crash_at == "after_call":  # found at the sink, never performed again
        succeeded = [d for k, d in log if k == "effect.succeeded" and d["effect"] == victim.id]
        assert [d.get("reconciled") for d in succeeded] == [True]
        assert settled.attempts == 1
    if crash_at == "before_call":  # not at the sink: handed back and performed once
        assert settled.attempts == 2


@pytest.mark.slow
async def test_a_late_worker_cannot_record_after_a_takeover(
    backend: Backend, store: Store, room: Room, sink: Sink
) -> None:
    """Worker A claims and freezes before its call; its lease lapses; the reconciler
    (nothing at the sink) hands the effect back and worker B performs it. A wakes, calls
    the sink (the same key: deduplicated) and tries to record: ``StaleFence``."""
    outbox = Outbox(room)
    await outbox.request("op-x", "notify", {"x": 1})
    async with launch(
        backend, store, "pause_then_call", room, sink, name="late", lease_ttl=0.5
    ) as late:
        fence = await late.report()
        await asyncio.sleep(0.7)
        reconciler = Reconciler(outbox, ew.sink_check(sink.url), unknown_after=0.0)
        (handed_back,) = await reconciler.run_once()
        assert (handed_back.status, handed_back.fence) == (PENDING, fence + 1)
        hooks = ew.Hooks()
        worker = Worker(outbox, ew.sink_handler(sink.url, hooks), name="prompt")
        (done,) = await worker.drain()
        assert (done.status, done.fence, done.holder) == (SUCCEEDED, fence + 2, "prompt")
        late.release()
        assert await late.wait() == ew.STALE_FENCE_EXIT
    final = await outbox.get("op-x")
    assert (final.status, final.fence, final.holder) == (SUCCEEDED, fence + 2, "prompt")
    assert final.result == sink.responses["op-x"]
    assert sink.applied == {"op-x": 1} and sink.calls == {"op-x": 2}
    fenced = [d for k, d in await events(store, room) if k == "effect.fenced"]
    assert fenced == [{"effect": "op-x", "by": "late", "fence": fence}]


# ------------------------------------------------------- retries, dead, unknown, undo


def failing_handler(failures: dict[str, int], exc: Exception) -> Any:
    async def handler(effect: Effect) -> Any:
        failures[effect.id] += 1
        raise exc

    return handler


async def test_retries_up_to_the_attempt_limit_then_dead(store: Store, room: Room) -> None:
    outbox = Outbox(room)
    await outbox.request("flaky", "notify", None, max_attempts=3)
    calls: collections.Counter[str] = collections.Counter()
    worker = Worker(
        outbox, failing_handler(calls, RuntimeError("503")), name="w", backoff=NoBackoff()
    )
    done = await worker.drain()
    assert [e.status for e in done] == [PENDING, PENDING, FAILED]
    assert calls["flaky"] == 3
    dead = await outbox.get("flaky")
    assert dead.error == {"type": "RuntimeError", "message": "503"} and dead.attempts == 3
    assert await outbox.counts() == {"pending": 0, "inflight": 0, "dead": 1}
    kinds = [k for k, _ in await events(store, room)]
    assert kinds.count("effect.retry") == 2 and kinds[-1] == "effect.failed"


async def test_a_retry_waits_for_its_backoff(room: Room) -> None:
    outbox = Outbox(room)
    await outbox.request("slow", "notify")
    calls: collections.Counter[str] = collections.Counter()
    worker = Worker(outbox, failing_handler(calls, RuntimeError("x")), name="w")  # 0.5 s backoff
    assert len(await worker.drain()) == 1
    assert await worker.claim() is None  # not due yet
    pending = await outbox.get("slow")
    assert pending.status == PENDING and pending.not_before is not None


async def test_a_permanent_failure_is_not_retried(room: Room) -> None:
    outbox = Outbox(room)
    await outbox.request("refused", "notify")
    calls: collections.Counter[str] = collections.Counter()
    worker = Worker(outbox, failing_handler(calls, PermanentFailure("400")), name="w")
    assert [e.status for e in await worker.drain()] == [FAILED]
    assert calls["refused"] == 1


async def test_unknown_outcome_is_compensated(store: Store, room: Room) -> None:
    outbox = Outbox(room)
    await outbox.request("transfer-9", "transfer", {"cents": 500})
    calls: collections.Counter[str] = collections.Counter()
    worker = Worker(outbox, failing_handler(calls, OutcomeUnknown("timeout")), name="w")
    (unsure,) = await worker.drain()
    assert unsure.status == UNKNOWN and unsure.holder is None
    assert await outbox.counts() == {"pending": 0, "inflight": 1, "dead": 0}

    async def check(effect: Effect) -> Outcome:
        return Outcome.compensate(effect, "refund", {"cents": effect.params["cents"]})

    patient = Reconciler(outbox, check, unknown_after=60.0)
    assert await patient.run_once() == []  # still settling at the destination
    (undone,) = await Reconciler(outbox, check, unknown_after=0.0).run_once()
    assert (undone.status, undone.compensation) == (COMPENSATED, "transfer-9.undo")
    refund = await outbox.get("transfer-9.undo")
    assert (refund.status, refund.kind, refund.params, refund.compensates) == (
        PENDING,
        "refund",
        {"cents": 500},
        "transfer-9",
    )
    log = await events(store, room)
    i = [k for k, _ in log].index("effect.compensated")
    assert log[i + 1][0] == "effect.requested" and log[i + 1][1]["compensates"] == "transfer-9"

    async def refunded(effect: Effect) -> Any:
        return {"refunded": effect.params["cents"]}

    (paid_back,) = await Worker(outbox, refunded, name="w2").drain()
    assert (paid_back.status, paid_back.result) == (SUCCEEDED, {"refunded": 500})


async def test_undecided_and_failing_checks_leave_it_unknown(room: Room) -> None:
    outbox = Outbox(room)
    await outbox.request("q", "notify")
    calls: collections.Counter[str] = collections.Counter()
    await Worker(outbox, failing_handler(calls, OutcomeUnknown("?")), name="w").drain()

    async def cannot_tell(effect: Effect) -> Outcome:
        return Outcome.undecided()

    async def broken(effect: Effect) -> Outcome:
        raise ConnectionError("destination down")

    (first,) = await Reconciler(outbox, cannot_tell, unknown_after=0.0).run_once()
    (second,) = await Reconciler(outbox, broken, unknown_after=0.0).run_once()
    assert (first.status, second.status) == (UNKNOWN, UNKNOWN)
    assert second.error == {"type": "ConnectionError", "message": "destination down"}
    assert second.fence == first.fence + 1 and second.holder is None

    async def gone(effect: Effect) -> Outcome:
        return Outcome.failed({"reason": "rejected upstream"})

    (dead,) = await Reconciler(outbox, gone, unknown_after=0.0).run_once()
    assert (dead.status, dead.error) == (FAILED, {"reason": "rejected upstream"})


async def test_a_live_lease_is_not_taken_over(room: Room) -> None:
    outbox = Outbox(room)
    await outbox.request("busy", "notify")
    worker = Worker(outbox, failing_handler(collections.Counter(), RuntimeError()), name="w")
    claimed = await worker.claim()
    assert claimed is not None

    async def never(effect: Effect) -> Outcome:
        raise AssertionError("must not be asked")

    assert await Reconciler(outbox, never, unknown_after=0.0).run_once() == []
    assert (await outbox.get("busy")).fence == claimed.fence


async def test_a_renewing_worker_keeps_its_lease(room: Room) -> None:
    outbox = Outbox(room)
    await outbox.request("long", "notify")

    async def slow(effect: Effect) -> Any:
        await asyncio.sleep(1.0)
        return "ok"

    worker = Worker(outbox, slow, name="w", lease_ttl=0.4, renew_every=0.1)
    task = asyncio.create_task(worker.run_once())
    await asyncio.sleep(0.6)

    async def never(effect: Effect) -> Outcome:
        raise AssertionError("must not be asked")

    assert await Reconciler(outbox, never, unknown_after=0.0).run_once() == []
    done = await task
    assert done is not None and done.status == SUCCEEDED


async def test_a_lost_record_response_is_resent_safely(store: Store, room: Room) -> None:
    """The store commits the worker's record but the response is lost: the worker
    resends, recognises its own write by the fence, and nothing is recorded twice."""
    await Outbox(room).request("op-lost", "notify")

    async def lose_second(n: int, result: TransactResult) -> None:
        if n == 2:  # 1: the claim, 2: the record
            raise StoreUnavailable("response lost")

    flaky = Interposed(store, after=lose_second)
    outbox = Outbox(Rooms(flaky).room(room.name))

    async def ok(effect: Effect) -> Any:
        return {"done": effect.id}

    (done,) = await Worker(outbox, ok, name="w", renew_every=0).drain()
    assert (done.status, done.result) == (SUCCEEDED, {"done": "op-lost"})
    assert flaky.calls == 3
    kinds = [k for k, _ in await events(store, room)]
    assert kinds.count("effect.succeeded") == 1


async def test_a_running_worker_is_woken_by_new_requests(room: Room, sink: Sink) -> None:
    outbox = Outbox(room)
    worker = Worker(outbox, ew.sink_handler(sink.url, ew.Hooks()), name="w")
    reconciler = Reconciler(outbox, ew.sink_check(sink.url))
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop=stop, idle=5.0, reconciler=reconciler))
    await asyncio.sleep(0.1)
    await outbox.request("op-live", "notify", {"n": 1})
    for _ in range(200):
        if (await outbox.get("op-live")).status == SUCCEEDED:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(running, 10)
    assert (await outbox.get("op-live")).status == SUCCEEDED
    assert sink.applied == {"op-live": 1}


async def test_a_result_that_cannot_be_stored_leaves_the_outcome_unknown(room: Room) -> None:
    outbox = Outbox(room)
    await outbox.request("odd", "notify")

    async def odd(effect: Effect) -> Any:
        return {"not json": object()}

    (unsure,) = await Worker(outbox, odd, name="w").drain()
    assert unsure.status == UNKNOWN and unsure.error["type"] == "BadRequest"
