"""SQLite-specific behaviour the conformance suite does not reach: URLs, durability
report, the injected clock, busy retries, the error seam, batching and the worker pool."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from agentrooms.errors import BadRequest, StoreUnavailable, VersionConflict
from agentrooms.store import Absent, Append, Present, Put, VersionIs, open_store
from agentrooms.store.base import PreparedWrite
from agentrooms.store.sqlite.backend import SqliteStore
from agentrooms.store.sqlite.config import SqliteConfig, parse_url
from agentrooms.store.sqlite.operations import Operations, prefix_end


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
        ops.transact("r", [], [_prepared_put("broken", 1)], [])
        raise RuntimeError("bug after a write")

    def conflicted_after_writing(ops: Operations) -> None:
        ops.transact("r", [], [_prepared_put("half", 1)], [])
        ops.transact("r", [Present("nope")], [], [])

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
