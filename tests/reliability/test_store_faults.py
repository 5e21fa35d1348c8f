"""Store faults (``reliability/faults.py``) against real servers: each one breaks the
connection or the server while it is active and the store works again after its heal,
and each is reported to the caller as ``StoreUnavailable`` (a reset aimed at a request
in flight too, when the request took effect); how faults are reported and attributed;
and what Redis without persistence does to a fencing token across a restart. The short
torture runs that draw them are in ``test_store_fault_runs.py``."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agentrooms.errors import NotFound, StoreUnavailable
from agentrooms.reliability.checker import check
from agentrooms.reliability.faults import (
    PAUSE_ALL_MS,
    ClientPause,
    Fault,
    PgTerminate,
    RedisRestart,
    RedisServer,
    Rig,
    SqliteWriterKill,
    store_under_test,
)
from agentrooms.reliability.history import Operation
from agentrooms.reliability.models import StoreModel
from agentrooms.reliability.proxy import Blackhole, Delay, Drop, Reset, ResetInFlight
from agentrooms.reliability.recorder import COMMITS
from agentrooms.reliability.surfaces import UnknownOutcome
from agentrooms.reliability.torture import (
    CLIENT_KILL,
    NO_FAULT,
    Journal,
    Journaled,
    attribute,
    leaks,
)
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.store import Put, Store, open_store

pytestmark = pytest.mark.usefixtures("services")


@pytest.fixture(scope="module")
def services(request: pytest.FixtureRequest) -> None:
    """Fail (CI) or skip (a laptop) when Redis or PostgreSQL does not answer."""
    request.getfixturevalue("redis_url")
    request.getfixturevalue("postgres_url")


# --------------------------------------------------------------------------- helpers


async def failure(call: Callable[[], Awaitable[Any]]) -> BaseException | None:
    """What ``call`` raised (``None`` if it returned)."""
    try:
        await call()
    except Exception as exc:
        return exc
    return None


async def works_again(store: Store, room: str, value: str, within: float = 15.0) -> int:
    """Write ``value`` and read it back until both succeed; the attempts it took.
    Every failure on the way must be ``StoreUnavailable``."""
    deadline = time.monotonic() + within
    attempts = 0
    while True:
        attempts += 1
        try:
            await store.transact(room, (), [Put("k", value)])
            value_read = (await store.read(room, ["k"])).value("k")
        except StoreUnavailable:
            assert time.monotonic() < deadline, f"the store did not work again in {within} s"
            await asyncio.sleep(0.1)
            continue
        assert value_read == value
        return attempts


def named(rig: Rig, cls: type[Any]) -> Fault:
    """The rig's one fault of class ``cls``."""
    (fault,) = [f for f in rig.faults if isinstance(f, cls)]
    found: Fault = fault
    return found


async def test_the_runner_creates_its_rooms_through_a_store_still_out_of_reach(
    tmp_path: Path,
) -> None:
    """The torture runner's own room creation retries while the store is out of reach
    (here: a Redis restart whose heal comes a moment later) instead of ending the run."""
    from agentrooms.reliability.torture.runner import _create

    async with store_under_test("redis", tmp_path) as rig:
        store = await open_store(rig.direct_url)
        try:
            restart = named(rig, RedisRestart)
            await restart.inject()

            async def heal_soon() -> None:
                await asyncio.sleep(1.5)
                await restart.heal()

            healing = asyncio.create_task(heal_soon())
            await _create(Rooms(store), "made-through-a-restart")
            await healing
            assert (await Rooms(store).describe("made-through-a-restart")).name
            await _create(Rooms(store), "made-through-a-restart")  # there already: fine
        finally:
            await store.close()


# ------------------------------------------------------------------ each fault alone


@pytest.mark.parametrize("backend", ["redis", "postgres"])
async def test_each_proxy_fault_breaks_the_connection_and_heals(
    backend: str, tmp_path: Path
) -> None:
    """Delay: calls answer, later. Drop, reset, blackhole, reset in flight: a call
    raises ``StoreUnavailable`` (the rig's 1 s timeout), never the driver's own error.
    The reset in flight cuts the connection after the write reached the store: on Redis
    (one script, one request) the write took effect, though its caller was told
    ``StoreUnavailable``, an unknown outcome. After each heal the store works; the same
    store past the proxy is never touched."""
    async with store_under_test(backend, tmp_path) as rig:
        store = await open_store(rig.url)
        direct = await open_store(rig.direct_url)
        try:
            await works_again(store, "r", "before")
            assert rig.proxy is not None and rig.proxy.accepted > 0
            seen: dict[str, str] = {}
            for cls in (Delay, Drop, Reset, Blackhole, ResetInFlight):
                fault = named(rig, cls)
                await fault.inject()
                started = time.monotonic()
                writes = [Put("k", fault.name)]
                error = await failure(lambda: store.transact("r", (), writes))  # noqa: B023
                took = time.monotonic() - started
                # the store itself answers all along
                kept = (await direct.read("r", ["k"])).value("k")
                await fault.heal()
                if cls is ResetInFlight:
                    assert rig.proxy.cut > 0
                    if backend == "redis":  # the write ran, its reply was cut
                        assert kept == fault.name
                if cls is Delay:
                    assert error is None and took >= 0.25, (error, took)
                else:
                    assert isinstance(error, StoreUnavailable), (fault.name, error)
                seen[fault.name] = "answered late" if error is None else type(error).__name__
                attempts = await works_again(store, "r", f"after {fault.name}")
                print(f"{backend} {fault.name}: {seen[fault.name]}, {took:.2f} s; {attempts=}")
                print(f"  the store then held {kept!r}")
            assert rig.proxy.resets > 0 and rig.proxy.dropped > 0
        finally:
            await store.close()
            await direct.close()


async def test_redis_pauses_and_restart_break_the_server_and_heal(tmp_path: Path) -> None:
    """``CLIENT PAUSE WRITE``: every call raises ``StoreUnavailable``, reads too (each is
    a Lua script, ``EVALSHA``, which the server holds like a write), and the heal
    (``CLIENT UNPAUSE``) ends it at once; ``ALL``: the same, until the server ends the
    pause itself; the restart (``kill -9``, AOF
    fsynced on every write): calls raise ``StoreUnavailable`` while it is down, and an
    acknowledged write is there after it."""
    async with store_under_test("redis", tmp_path) as rig:
        assert rig.redis is not None
        store = await open_store(rig.url)
        try:
            await works_again(store, "r", "before")
            pauses = {f.mode: f for f in rig.faults if isinstance(f, ClientPause)}
            write, pause_all = pauses["WRITE"], pauses["ALL"]
            await write.inject()
            # a read is an EVALSHA too, which the server holds as a write
            for call in (
                lambda: store.read("r", ["k"]),
                lambda: store.transact("r", (), [Put("k", "paused")]),
            ):
                error = await failure(call)
                assert isinstance(error, StoreUnavailable), error
            await write.heal()
            assert await works_again(store, "r", "after write pause") == 1  # healed at once

            assert pause_all.ms == PAUSE_ALL_MS
            await pause_all.inject()
            started = time.monotonic()
            error = await failure(lambda: store.read("r", ["k"]))
            assert isinstance(error, StoreUnavailable), error
            await pause_all.heal()
            assert time.monotonic() - started >= PAUSE_ALL_MS / 1000 - 0.05
            await works_again(store, "r", "kept")

            restart = named(rig, RedisRestart)
            await restart.inject()
            assert not rig.redis.running
            error = await failure(lambda: store.read("r", ["k"]))
            assert isinstance(error, StoreUnavailable), error
            await restart.heal()
            assert rig.redis.running
            deadline = time.monotonic() + 15
            while True:  # the first calls may meet the connections the kill broke
                try:
                    kept = (await store.read("r", ["k"])).value("k")
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.1)
            assert kept == "kept"  # acknowledged before the kill: fsynced, replayed
            await works_again(store, "r", "after restart")
            kinds = [what for _, what in rig.log]
            assert kinds.count("redis restart (aof always) kill -9") == 1
        finally:
            await store.close()


async def test_pg_terminate_ends_the_runs_connections_and_the_store_reconnects(
    tmp_path: Path,
) -> None:
    async with store_under_test("postgres", tmp_path) as rig:
        store = await open_store(rig.url)
        try:
            await works_again(store, "r", "before")
            fault = named(rig, PgTerminate)
            assert isinstance(fault, PgTerminate)
            await fault.inject()
            assert fault.terminated >= 1
            error = await failure(lambda: store.read("r", ["k"]))
            assert error is None or isinstance(error, StoreUnavailable), error
            await fault.heal()
            attempts = await works_again(store, "r", "after")
            print(
                f"pg_terminate_backend: {fault.terminated} ended, first call {error!r}, {attempts=}"
            )
        finally:
            await store.close()


async def test_sqlite_writer_kill_leaves_a_sound_file(tmp_path: Path) -> None:
    async with store_under_test("sqlite", tmp_path) as rig:
        store = await open_store(rig.url)
        try:
            fault = named(rig, SqliteWriterKill)
            assert isinstance(fault, SqliteWriterKill) and fault.proc is not None
            deadline = time.monotonic() + 20
            while not await store.read_log("writer", 0, 1):  # the writer is writing
                assert time.monotonic() < deadline, "the writer wrote nothing"
                await asyncio.sleep(0.05)
            killed = fault.proc
            await fault.inject()
            assert killed.returncode == -9
            await fault.heal()
            assert fault.checks == ["ok"]
            assert fault.proc is not killed and fault.proc.poll() is None
            await works_again(store, "r", "after")
        finally:
            await store.close()


# ------------------------------------------------------------- how faults are reported


class Raises:
    """A surface whose every call raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def read(self, key: str) -> tuple[str | None, int | None]:
        raise self.error


@pytest.mark.parametrize(
    ("error", "typed"),
    [
        (ConnectionResetError(104, "Connection reset by peer"), False),
        (TimeoutError(), False),
        (StoreUnavailable("redis: ConnectionError"), True),
        (UnknownOutcome("GET docs/k: 503", "HTTP 503 store_unavailable: unknown outcome"), True),
    ],
)
def test_a_raw_exception_reaching_a_caller_is_an_anomaly(error: BaseException, typed: bool) -> None:
    """A raw driver or OS exception is an anomaly of the history; a typed error, or what
    an HTTP/MCP caller saw, is not."""
    journal = Journal()
    surface = Journaled(Raises(error), lambda e: journal.event(0, e))  # type: ignore[arg-type]
    with pytest.raises(type(error)):
        asyncio.run(surface.read("k0"))
    (seen,) = journal.errors
    assert seen.typed is typed and seen.op == "read"
    assert len(leaks(journal.errors)) == (0 if typed else 1)
    assert journal.close()[0].unknown


def test_errors_are_attributed_to_the_faults_active_while_the_call_was_in_flight() -> None:
    from agentrooms.reliability.torture import Seen, Window

    second = 1_000_000_000
    windows = [Window("proxy reset", 10 * second, 11 * second), Window(CLIENT_KILL, 30 * second)]
    windows[1].closed()
    errors = [
        Seen(0, "read", 10 * second, 10 * second + 5, "StoreUnavailable", True),
        Seen(1, "put", 11 * second + 1, 11 * second + 2, "StoreUnavailable", True),  # grace
        Seen(2, "cas", 20 * second, 20 * second + 1, "StoreUnavailable", True),
    ]
    found = attribute(errors, windows)
    assert found == Counter(
        {("proxy reset", "StoreUnavailable"): 2, (NO_FAULT, "StoreUnavailable"): 1}
    )


def test_regression_a_commit_whose_reply_was_lost_answers_replayed_on_its_own_retry() -> None:
    """Found by the first torture runs with store faults (PostgreSQL, proxy blackhole then
    reset): a commit's first attempt committed and its reply was lost; the commit loop
    re-read, found the outcome recorded and answered ``replayed=True``, on the command's
    only delivery. Applied once, at the next position: linearizable. Before, the model
    required ``replayed`` False for an id not applied yet and flagged the history."""

    def commit(client: int, cid: str, out: Any, call: int, ret: int | None) -> Operation:
        return Operation(client, COMMITS, "commit", {"id": cid}, out, call, ret)

    history = [
        commit(0, "0.0", {"result": 1, "replayed": False}, 0, 1),
        commit(0, "0.3", {"result": 2, "replayed": True}, 2, 10),  # its own retry found it
        commit(1, "1.2", {"result": 3, "replayed": False}, 11, 12),
        Operation(2, COMMITS, "read_commits", None, {"ids": ["0.0", "0.3", "1.2"]}, 13, 14),
    ]
    assert check(StoreModel(), history).linearizable
    # still flagged: a replay at a position it never had, a second application
    wrong = [history[0], commit(0, "0.3", {"result": 3, "replayed": True}, 2, 10)]
    assert not check(StoreModel(), wrong).linearizable
    twice = [*history[:2], commit(1, "0.3", {"result": 3, "replayed": False}, 11, 12)]
    assert not check(StoreModel(), twice).linearizable


# --------------------------------------------------------- Redis without persistence


async def claim_after_restart(tmp_path: Path, aof: bool) -> tuple[int, int | str, int]:
    """On a test-owned redis-server: a plan task claimed by ``a`` (fence acknowledged),
    then ``kill -9`` and a start on the same port. Returns the first fence; what a claim
    by ``b`` through the same room handle gets after the restart, once ``a``'s lease has
    lapsed (its fence, or the error's name); and the fence ``b`` then holds (if the room
    was lost, once the application has set it up again)."""
    server = RedisServer(tmp_path, aof=aof)
    await server.start()
    store = await open_store(f"{server.url}?prefix=fence&timeout=2&connect_timeout=2")
    try:
        rooms = Rooms(store)
        room = await rooms.create("r")
        await room.plan.add([TaskSpec("t", max_attempts=10)])
        first = await room.plan.claim_next("a", ttl=0.3)
        assert first is not None
        await server.restart()
        await asyncio.sleep(0.4)  # a's lease has lapsed, wherever it is still known
        deadline = time.monotonic() + 15
        while True:
            try:
                lease = await room.plan.claim_next("b", ttl=0.3)
            except StoreUnavailable:  # the connections the kill broke
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            except NotFound:
                break
            else:
                assert lease is not None
                return first.fence, lease.fence, lease.fence
        assert await store.read_log("r", 0, 10) == []  # its room.created is gone too
        room = await rooms.create("r")  # the application sets its plan up again
        await room.plan.add([TaskSpec("t", max_attempts=10)])
        second = await room.plan.claim_next("b", ttl=0.3)
        assert second is not None
        return first.fence, "NotFound", second.fence
    finally:
        await store.close()
        server.stop()


async def test_redis_without_persistence_hands_out_a_fence_twice_after_a_restart(
    tmp_path: Path,
) -> None:
    """No AOF, no snapshots: the restart forgets the room, the task and its fence. A
    claim through the room's handle raises ``NotFound``; set up again, the task's next
    claim is granted fence 1, the fence ``a`` already holds: two holders of one
    fencing token."""
    first, again, second = await claim_after_restart(tmp_path, aof=False)
    assert first == 1
    assert again == "NotFound"  # the restarted server holds no room
    assert second == first  # the same fencing token, handed out twice


async def test_redis_with_appendfsync_always_keeps_the_acknowledged_fence(
    tmp_path: Path,
) -> None:
    """``--appendonly yes --appendfsync always``: the acknowledged claim survives the
    restart, and once ``a``'s lease lapses the next claim gets a larger fence."""
    first, again, second = await claim_after_restart(tmp_path, aof=True)
    assert first == 1
    assert again == second == 2  # the task survived, its lapsed lease is claimed anew
