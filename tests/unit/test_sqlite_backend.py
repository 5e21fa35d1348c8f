"""SQLite-specific behaviour the conformance suite does not reach: URLs, durability
report, the injected clock, busy retries, the error seam, batching and the worker pool,
the cost of set_pick, the purge of expired rows, and how watch is woken."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import sqlite3
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from agentrooms.errors import BadRequest, StoreUnavailable, VersionConflict
from agentrooms.store import (
    Absent,
    Append,
    Delete,
    Present,
    Put,
    SetAdd,
    SetRemove,
    VersionIs,
    open_store,
)
from agentrooms.store.sqlite.backend import SqliteStore
from agentrooms.store.sqlite.config import SqliteConfig, parse_url
from agentrooms.store.sqlite.engine import Engine
from agentrooms.store.sqlite.operations import Operations, prefix_end
from agentrooms.store.sqlite.sql import QUERIES, migrate
from agentrooms.store.sqlite.worker import (
    BUSY_POLL_INTERVAL,
    BUSY_WINDOW,
    POLL_INTERVAL,
    poll_interval,
)
from agentrooms.store.types import PURGE_LIMIT, Compare, Prepared, PreparedWrite


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------------------- URLs


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///rel/store.db", SqliteConfig("rel/store.db")),
        ("sqlite:////abs/store.db", SqliteConfig("/abs/store.db")),
        ("sqlite:///with%20space.db", SqliteConfig("with space.db")),
        ("sqlite://", SqliteConfig(":memory:")),
        ("sqlite:///:memory:", SqliteConfig(":memory:")),
        ("sqlite:///a.db?synchronous=normal", SqliteConfig("a.db", "NORMAL")),
        ("sqlite:///a.db?busy_timeout_ms=250&synchronous=FULL", SqliteConfig("a.db", "FULL", 250)),
    ],
)
def test_url_parsing(url: str, expected: SqliteConfig) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://host/a.db",
        "sqlite:///a.db?synchronous=OFF",
        "sqlite:///a.db?busy_timeout_ms=-1",
        "sqlite:///a.db?busy_timeout_ms=soon",
        "sqlite:///a.db?journal_mode=delete",
    ],
)
def test_bad_urls_are_bad_requests(url: str) -> None:
    with pytest.raises(BadRequest):
        parse_url(url)


async def test_relative_path_is_relative_to_cwd_and_parents_are_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = await open_store("sqlite:///a/b/store.db")
    try:
        await store.transact("r", writes=[Put("k", 1)])
    finally:
        await store.close()
    assert (tmp_path / "a" / "b" / "store.db").is_file()


# --------------------------------------------------------------------------- info


async def test_info_states_durability_and_warns_about_normal(tmp_path: Path) -> None:
    full = await open_store(f"sqlite:///{tmp_path / 'full.db'}")
    normal = await open_store(f"sqlite:///{tmp_path / 'normal.db'}?synchronous=NORMAL")
    try:
        info = await full.info()
        assert info.backend == "sqlite"
        assert info.details["journal_mode"] == "wal"
        assert info.details["synchronous"] == "FULL"
        assert "power loss" in info.durability
        assert info.warnings == []
        info = await normal.info()
        assert info.details["synchronous"] == "NORMAL"
        assert len(info.warnings) == 1
        assert "power loss" in info.warnings[0]
    finally:
        await full.close()
        await normal.close()


# -------------------------------------------------------------------------- clock


async def test_expiry_follows_the_injected_clock() -> None:
    clock = FakeClock()
    store = SqliteStore("sqlite://", clock=clock)
    try:
        r = await store.transact("r", writes=[Put("lease", "a", ttl=10), Put("keep", 1)])
        snap = await store.read("r", ["lease"])
        assert snap.now == clock.now
        record = snap.get("lease")
        assert record is not None
        assert record.expires_at == clock.now + 10
        clock.now += 9.999
        assert (await store.read("r", ["lease"])).get("lease") is not None
        clock.now += 0.001
        assert (await store.read("r", ["lease", "keep"])).records.keys() == {"keep"}
        assert [rec.key for rec in (await store.scan("r")).records] == ["keep"]
        with pytest.raises(VersionConflict) as info:
            await store.transact("r", [VersionIs("lease", r.versions["lease"])], [Put("x", 1)])
        assert info.value.conflicts == {"lease": None}
        await store.transact("r", [Absent("lease")], [Put("lease", "b")], [Append("e")])
        assert (await store.read_log("r"))[0].time == clock.now
    finally:
        await store.close()


# -------------------------------------------------------------- busy and the seam


async def _create(path: Path) -> str:
    url = f"sqlite:///{path}?busy_timeout_ms=20"
    store = await open_store(url)
    await store.close()
    return url


async def test_a_busy_database_is_retried_not_reported(tmp_path: Path) -> None:
    url = await _create(tmp_path / "busy.db")
    holder = sqlite3.connect(tmp_path / "busy.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    store = await open_store(url)
    try:
        write = asyncio.create_task(store.transact("r", writes=[Put("k", 1)]))
        await asyncio.sleep(0.3)  # many times busy_timeout_ms
        assert not write.done()
        holder.execute("COMMIT")
        assert (await write).versions["k"] >= 1
    finally:
        holder.close()
        await store.close()


async def test_busy_past_the_bound_is_store_unavailable(tmp_path: Path) -> None:
    url = await _create(tmp_path / "busy.db")
    holder = sqlite3.connect(tmp_path / "busy.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    store = SqliteStore(url, retry_for=0.2)
    try:
        with pytest.raises(StoreUnavailable) as info:
            await store.transact("r", writes=[Put("k", 1)])
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        holder.execute("ROLLBACK")
        await store.transact("r", writes=[Put("k", 1)])  # and it recovers
    finally:
        holder.close()
        await store.close()


async def test_driver_errors_become_store_unavailable_with_cause(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database, not even close. " * 200)
    with pytest.raises(StoreUnavailable) as info:
        await open_store(f"sqlite:///{path}")
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(StoreUnavailable) as info:
        await open_store(f"sqlite:///{blocker / 'store.db'}")
    assert isinstance(info.value.__cause__, OSError)


async def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 's.db'}")
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreUnavailable, match="closed"):
        await store.read("r", ["k"])


# ------------------------------------------------------------- batches and pool


async def test_concurrent_writers_of_one_store_each_get_their_own_outcome() -> None:
    store = await open_store("sqlite://")
    try:
        v = (await store.transact("r", writes=[Put("hot", 0)])).versions["hot"]
        attempts = [
            store.transact("r", [VersionIs("hot", v)], [Put("hot", i)], [Append("won", i)])
            for i in range(20)
        ] + [store.transact("r", [Absent(f"own/{i}")], [Put(f"own/{i}", i)]) for i in range(20)]
        outcomes = await asyncio.gather(*attempts, return_exceptions=True)
        wins = [o for o in outcomes[:20] if not isinstance(o, BaseException)]
        assert len(wins) == 1
        assert all(isinstance(o, VersionConflict) for o in outcomes[:20] if o not in wins)
        assert not any(isinstance(o, BaseException) for o in outcomes[20:])
        assert len((await store.scan("r", "own/")).records) == 20
        assert [e.type for e in await store.read_log("r")] == ["won"]
    finally:
        await store.close()


async def test_a_failing_operation_rolls_back_alone() -> None:
    """An operation that fails after writing (a bug, a driver error) is rolled back; the
    operations batched with it still commit."""
    store = SqliteStore("sqlite://")

    def broken(ops: Operations) -> None:
        ops.transact("r", _prepared([], [_prepared_put("broken", 1)]))
        raise RuntimeError("bug after a write")

    def conflicted_after_writing(ops: Operations) -> None:
        ops.transact("r", _prepared([], [_prepared_put("half", 1)]))
        ops.transact("r", _prepared([Present("nope")], []))

    try:
        results = await asyncio.gather(
            store._call(broken, write=True),
            store.transact("r", writes=[Put("good", 1)]),
            store._call(conflicted_after_writing, write=True),
            store.transact("r", writes=[Put("also-good", 2)]),
            return_exceptions=True,
        )
        assert isinstance(results[0], RuntimeError)
        assert isinstance(results[2], VersionConflict)
        snap = await store.read("r", ["broken", "good", "half", "also-good"])
        assert snap.records.keys() == {"good", "also-good"}
    finally:
        await store.close()


def _prepared_put(key: str, value: int) -> PreparedWrite:
    return PreparedWrite(key, str(value))


def _prepared(compares: list[Compare], writes: list[PreparedWrite]) -> Prepared:
    return Prepared(compares, writes, [], [])


async def test_stores_of_one_file_share_a_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a = await open_store(url)
    b = await open_store(f"sqlite:///{tmp_path / '.' / 'shared.db'}")
    other = await open_store(f"sqlite:///{tmp_path / 'shared.db'}?synchronous=NORMAL")
    assert isinstance(a, SqliteStore)
    assert isinstance(b, SqliteStore)
    assert isinstance(other, SqliteStore)
    assert a._worker is b._worker
    assert a._worker is not other._worker
    await a.close()
    await b.transact("r", writes=[Put("k", 1)])  # still served
    await b.close()
    await other.close()
    c = await open_store(url)
    assert isinstance(c, SqliteStore)
    assert c._worker is not a._worker
    assert (await c.read("r", ["k"])).value("k") == 1
    await c.close()


# ------------------------------------------------------------------------ scan


@pytest.mark.parametrize(
    ("prefix", "end"),
    [
        ("", b""),
        ("a", "b"),
        ("task/", "task0"),
        ("a\U0010ffff", "b"),
        ("\U0010ffff", b""),
        ("\ud7ff", "\ue000"),
    ],
)
def test_prefix_end(prefix: str, end: str | bytes) -> None:
    assert prefix_end(prefix) == end


async def test_scan_at_the_top_of_unicode() -> None:
    store = await open_store("sqlite://")
    keys = ["a", "a\U0010ffff", "a\U0010ffffz", "b", "\U0010ffff", "\U0010ffff\U0010ffff"]
    try:
        await store.transact("r", writes=[Put(k, k) for k in keys])
        for prefix in ["", "a", "a\U0010ffff", "\U0010ffff", "\ud800"]:
            want = sorted(k for k in keys if k.startswith(prefix))
            got = [rec.key for rec in (await store.scan("r", prefix)).records]
            assert got == want, prefix
    finally:
        await store.close()


# --------------------------------------------------------------------------- sets


def _migrated() -> tuple[sqlite3.Connection, Operations]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(conn)
    return conn, Operations(conn, time.time)


@pytest.mark.parametrize(
    ("query", "index"),
    [
        ("set_pick_members", "set_members_pick"),
        ("set_pick_last", "set_members_pick"),
        ("set_pick_mark", "PRIMARY KEY"),
        ("transact_purge_expired", "records_expiry"),
    ],
)
def test_set_pick_and_purge_seek_an_index(query: str, index: str) -> None:
    """No scan of the set (or room) and no sort: a seek into an index read in order."""
    conn, _ = _migrated()
    params = {"room": "r", "name": "s", "member": "m", "picked_at": 1, "now_ms": 1, "limit": 3}
    plan = " | ".join(
        row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {QUERIES[query]}", params)
    )
    assert index in plan
    assert "SCAN" not in plan
    assert "TEMP B-TREE" not in plan


def test_set_pick_costs_the_same_for_a_large_set() -> None:
    """Counted in SQLite virtual machine steps, not time: picking from a 10,000-member set
    does the same work as picking from a 10-member one."""
    conn, ops = _migrated()
    for name, size in (("small", 10), ("large", 10_000)):
        rows = [{"room": "r", "name": name, "member": f"m{i:05}"} for i in range(size)]
        conn.execute("BEGIN")
        conn.executemany(QUERIES["transact_set_add"], rows)
        conn.execute("COMMIT")
    steps = {}
    for name in ("small", "large"):
        for _ in range(12):  # past the never-picked members: least recently picked ones
            ops.set_pick("r", name, 1)
        counter = [0]

        def count(counter: list[int] = counter) -> int:
            counter[0] += 1
            return 0

        conn.set_progress_handler(count, 1)
        conn.execute("BEGIN IMMEDIATE")
        ops.set_pick("r", name, 3)
        conn.execute("COMMIT")
        conn.set_progress_handler(None, 1)
        steps[name] = counter[0]
    assert steps["large"] <= steps["small"] * 1.2, steps
    conn.close()


async def test_pick_order_survives_picks_in_one_millisecond() -> None:
    clock = FakeClock()  # frozen: every pick happens at the same store time
    store = SqliteStore("sqlite://", clock=clock)
    try:
        await store.transact("r", writes=[SetAdd("s", m) for m in "edcba"])
        picks = [m for _ in range(10) for m in await store.set_pick("r", "s", 1)]
        assert picks == list("abcde") * 2
        await store.transact("r", writes=[SetRemove("s", "e"), SetAdd("s", "a")])
        assert await store.set_pick("r", "s", 5) == list("abcd")
        together = await asyncio.gather(*(store.set_pick("r", "s", 1) for _ in range(4)))
        assert sorted(m for ms in together for m in ms) == list("abcd")  # one batch, one each
    finally:
        await store.close()


def pick_in_process(url: str, room: str, times: int) -> list[str]:
    """Run in a child process: pick two members ``times`` times."""

    async def run() -> list[str]:
        store = await open_store(url)
        try:
            return [m for _ in range(times) for m in await store.set_pick(room, "ready", 2)]
        finally:
            await store.close()

    return asyncio.run(run())


@pytest.mark.slow
async def test_pickers_in_other_processes_get_different_members(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pick.db'}"
    store = await open_store(url)
    await store.transact("r", writes=[SetAdd("ready", f"t{i:03}") for i in range(200)])
    loop = asyncio.get_running_loop()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(4, mp_context=ctx) as pool:
        picked = await asyncio.gather(
            *(loop.run_in_executor(pool, pick_in_process, url, "r", 20) for _ in range(4))
        )
    everything = [m for ms in picked for m in ms]
    assert len(everything) == 160
    assert sorted(everything) == [f"t{i:03}" for i in range(160)]
    assert await store.set_pick("r", "ready", 1) == ["t160"]
    await store.close()


# --------------------------------------------------------------------------- expiry


async def _row_count(store: SqliteStore) -> int:
    def count(ops: Operations) -> int:
        rows: int = ops._conn.execute("SELECT count(*) FROM records").fetchone()[0]
        return rows

    return await store._call(count, write=False)


async def test_writes_purge_a_few_expired_rows_of_their_room() -> None:
    clock = FakeClock()
    store = SqliteStore("sqlite://", clock=clock)
    try:
        await store.transact("r", writes=[Put(f"p/{i:03}", i, ttl=1) for i in range(100)])
        await store.transact("other", writes=[Put("p", 0, ttl=1)])
        await store.transact("r", writes=[Put("keep", 1, ttl=5)])
        assert await _row_count(store) == 102
        clock.now += 2
        await store.transact("r", appends=[Append("no records written")])
        assert await _row_count(store) == 102
        await store.transact("r", writes=[Put("x", 1)])
        assert await _row_count(store) == 103 - PURGE_LIMIT
        for _ in range(4):
            await store.transact("r", writes=[Delete("x")])
        assert await _row_count(store) == 2  # "keep" (not expired) and the other room's
        assert (await store.read("r", ["keep"])).value("keep") == 1
    finally:
        await store.close()


# -------------------------------------------------------------------------- watch


async def test_watch_ignores_appends_that_do_not_pass_after() -> None:
    store = await open_store("sqlite://")
    try:
        watching = asyncio.create_task(store.watch("r", 2, 0.5))
        await asyncio.sleep(0.05)
        await store.transact("r", appends=[Append("one")])
        await store.transact("other", appends=[Append("o"), Append("o"), Append("o")])
        await asyncio.sleep(0.05)
        assert not watching.done()
        await store.transact("r", appends=[Append("two"), Append("three")])
        assert await asyncio.wait_for(watching, 1) == 3
    finally:
        await store.close()


async def test_watch_from_another_event_loop_is_woken() -> None:
    store = await open_store("sqlite://")
    started = threading.Event()

    def wait_in_thread() -> tuple[int, float]:
        async def run() -> tuple[int, float]:
            t0 = time.monotonic()
            started.set()
            return await store.watch("r", 0, 20), time.monotonic() - t0

        return asyncio.run(run())

    try:
        waiting = asyncio.get_running_loop().run_in_executor(None, wait_in_thread)
        await asyncio.to_thread(started.wait)
        await asyncio.sleep(0.1)
        await store.transact("r", appends=[Append("wake")])
        seq, waited = await waiting
        assert seq == 1
        assert waited < 5
    finally:
        await store.close()


async def test_watch_notices_another_connection_by_polling(tmp_path: Path) -> None:
    """A store with other settings has its own worker and connection, as another process
    has: its commits are found by the poll, within a few poll intervals."""
    waiter = await open_store(f"sqlite:///{tmp_path / 'w.db'}")
    writer = await open_store(f"sqlite:///{tmp_path / 'w.db'}?synchronous=NORMAL")
    assert isinstance(waiter, SqliteStore)
    assert isinstance(writer, SqliteStore)
    assert waiter._worker is not writer._worker
    try:
        watching = asyncio.create_task(waiter.watch("r", 0, 20))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        await writer.transact("r", appends=[Append("a"), Append("b")])
        assert await asyncio.wait_for(watching, 5) == 2
        assert time.monotonic() - t0 < 10 * POLL_INTERVAL
    finally:
        await waiter.close()
        await writer.close()


def test_polling_is_brisk_only_after_another_process_committed() -> None:
    assert poll_interval(0.0) == poll_interval(BUSY_WINDOW / 2) == BUSY_POLL_INTERVAL
    assert poll_interval(BUSY_WINDOW) == poll_interval(math.inf) == POLL_INTERVAL


async def test_a_commit_of_another_process_quickens_the_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a watch waits, an idle database is polled every POLL_INTERVAL; once a poll
    finds another connection's commit, every BUSY_POLL_INTERVAL for a while, so
    processes that take turns wait milliseconds for each other."""
    polls = 0
    foreign_seqs = Engine.foreign_seqs

    def counted(engine: Engine, rooms: list[str]) -> dict[str, int] | None:
        nonlocal polls
        polls += 1
        return foreign_seqs(engine, rooms)

    monkeypatch.setattr(Engine, "foreign_seqs", counted)
    waiter = await open_store(f"sqlite:///{tmp_path / 'p.db'}")
    writer = await open_store(f"sqlite:///{tmp_path / 'p.db'}?synchronous=NORMAL")
    try:
        watching = asyncio.create_task(waiter.watch("r", 1, 20))
        await asyncio.sleep(0.35)  # the first poll, then idle ones
        before = polls
        await asyncio.sleep(0.5)
        idle = polls - before
        await writer.transact("r", writes=[Put("k", 1)])  # no append: the watch waits on
        await asyncio.sleep(0.2)
        before = polls
        await asyncio.sleep(0.5)
        busy = polls - before
        assert idle <= 0.5 / POLL_INTERVAL + 2, idle
        assert busy >= 4 * idle + 10, (idle, busy)
        assert not watching.done()
        await writer.transact("r", appends=[Append("a"), Append("b")])
        assert await asyncio.wait_for(watching, 5) == 2
    finally:
        await waiter.close()
        await writer.close()


async def test_closing_the_store_ends_its_watches(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    store, other = await open_store(url), await open_store(url)  # one shared worker
    try:
        mine = asyncio.create_task(store.watch("r", 0, 30))
        theirs = asyncio.create_task(other.watch("r", 0, 30))
        await asyncio.sleep(0.1)
        await store.close()
        with pytest.raises(StoreUnavailable, match="closed"):
            await asyncio.wait_for(mine, 5)
        assert not theirs.done()
        await other.transact("r", appends=[Append("e")])
        assert await asyncio.wait_for(theirs, 5) == 1
    finally:
        await other.close()
