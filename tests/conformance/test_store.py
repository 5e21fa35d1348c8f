"""The store contract, run unchanged against every backend (DESIGN.md §1).

A backend is done when this suite passes on it.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from agentrooms.errors import (
    AgentroomsError,
    BadRequest,
    CursorCompacted,
    PayloadTooLarge,
    StaleFence,
    VersionConflict,
)
from agentrooms.store import (
    Absent,
    Append,
    Delete,
    FenceAtMost,
    Limits,
    Present,
    Put,
    PutOutcome,
    Store,
    TransactResult,
    VersionIs,
    open_store,
)
from tests.conformance import workers
from tests.conftest import Backend

# ------------------------------------------------------------------ records and versions


async def test_put_then_read_returns_value_and_version(store: Store, room: str) -> None:
    result = await store.transact(room, writes=[Put("doc", {"title": "plan", "n": 1})])
    snap = await store.read(room, ["doc", "missing"])
    record = snap.get("doc")
    assert record is not None
    assert record.value == {"title": "plan", "n": 1}
    assert record.version == result.versions["doc"]
    assert record.expires_at is None
    assert snap.get("missing") is None
    assert "missing" not in snap.records


async def test_store_clock_is_reported(store: Store, room: str) -> None:
    before = time.time()
    snap = await store.read(room, ["x"])
    result = await store.transact(room, writes=[Put("x", 1)])
    # The store runs on this machine: its clock is the machine's, give or take.
    assert abs(snap.now - before) < 5
    assert result.now >= snap.now - 0.01


async def test_versions_strictly_increase_and_are_never_reused(store: Store, room: str) -> None:
    seen = []
    for value in ("a", "b"):
        seen.append((await store.transact(room, writes=[Put("k", value)])).versions["k"])
    await store.transact(room, writes=[Delete("k")])
    assert (await store.read(room, ["k"])).get("k") is None
    for value in ("c", "d"):
        seen.append((await store.transact(room, writes=[Put("k", value)])).versions["k"])
    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)
    # a version compare against the pre-delete version cannot match the re-created record
    with pytest.raises(VersionConflict):
        await store.transact(room, [VersionIs("k", seen[1])], [Put("k", "stale")])


async def test_delete_result_and_absent_delete(store: Store, room: str) -> None:
    await store.transact(room, writes=[Put("a", 1)])
    result = await store.transact(room, writes=[Delete("a"), Delete("never-existed")])
    assert result.versions == {}
    assert (await store.read(room, ["a"])).records == {}


async def test_version_compare(store: Store, room: str) -> None:
    v1 = (await store.transact(room, writes=[Put("k", 1)])).versions["k"]
    v2 = (await store.transact(room, [VersionIs("k", v1)], [Put("k", 2)])).versions["k"]
    assert v2 > v1
    with pytest.raises(VersionConflict) as info:
        await store.transact(room, [VersionIs("k", v1)], [Put("k", 3)])
    assert info.value.conflicts == {"k": v2}
    assert (await store.read(room, ["k"])).value("k") == 2


async def test_absent_and_present_compares(store: Store, room: str) -> None:
    v = (await store.transact(room, [Absent("k")], [Put("k", "first")])).versions["k"]
    with pytest.raises(VersionConflict) as info:
        await store.transact(room, [Absent("k")], [Put("k", "second")])
    assert info.value.conflicts == {"k": v}
    with pytest.raises(VersionConflict) as info:
        await store.transact(room, [Present("nope")], [Put("nope", 1)])
    assert info.value.conflicts == {"nope": None}
    await store.transact(room, [Present("k")], [Put("k", "third")])
    assert (await store.read(room, ["k", "nope"])).records.keys() == {"k"}


async def test_compare_on_a_key_that_is_not_written(store: Store, room: str) -> None:
    """A decision computed from record A guards a write to record B (stale reads)."""
    va = (await store.transact(room, writes=[Put("dep", "done")])).versions["dep"]
    await store.transact(room, [VersionIs("dep", va)], [Put("report", "ok")])
    await store.transact(room, writes=[Put("dep", "reopened")])
    with pytest.raises(VersionConflict):
        await store.transact(room, [VersionIs("dep", va)], [Put("report", "stale")])
    assert (await store.read(room, ["report"])).value("report") == "ok"


async def test_failed_multi_key_transact_changes_nothing(store: Store, room: str) -> None:
    first = await store.transact(room, writes=[Put("a", 1), Put("b", 1)], appends=[Append("setup")])
    va, vb = first.versions["a"], first.versions["b"]
    await store.transact(room, writes=[Put("b", 2)])
    with pytest.raises(VersionConflict) as info:
        await store.transact(
            room,
            compares=[VersionIs("a", va), VersionIs("b", vb), Absent("c")],
            writes=[Put("a", 99), Delete("b"), Put("c", 99)],
            appends=[Append("should-not-exist"), Append("nor-this")],
        )
    assert set(info.value.conflicts) == {"b"}
    snap = await store.read(room, ["a", "b", "c"])
    assert snap.value("a") == 1 and snap.version("a") == va
    assert snap.value("b") == 2
    assert snap.get("c") is None
    assert await store.last_seq(room) == 1
    assert [e.type for e in await store.read_log(room)] == ["setup"]


async def test_conflict_names_every_failing_key(store: Store, room: str) -> None:
    r = await store.transact(room, writes=[Put("a", 1), Put("b", 1), Put("c", 1)])
    await store.transact(room, writes=[Put("a", 2), Put("c", 2)])
    snap = await store.read(room, ["a", "c"])
    with pytest.raises(VersionConflict) as info:
        await store.transact(
            room,
            [VersionIs(k, r.versions[k]) for k in "abc"] + [Absent("b"), Present("zzz")],
            [Put("d", 1)],
        )
    assert info.value.conflicts == {
        "a": snap.version("a"),
        "b": r.versions["b"],
        "c": snap.version("c"),
        "zzz": None,
    }


async def test_rooms_are_isolated(store: Store, room: str) -> None:
    other = room + "-other"
    await store.transact(room, writes=[Put("k", "mine")], appends=[Append("e")])
    assert (await store.read(other, ["k"])).get("k") is None
    assert (await store.scan(other)).records == []
    assert await store.read_log(other) == []
    assert await store.last_seq(other) == 0
    await store.transact(other, [Absent("k")], [Put("k", "theirs")], [Append("e")])
    assert (await store.read(room, ["k"])).value("k") == "mine"
    assert [e.seq for e in await store.read_log(other)] == [1]


# --------------------------------------------------------------------------- fencing


async def test_fence_at_most(store: Store, room: str) -> None:
    await store.transact(room, writes=[Put("task/t1", {"owner": "b", "fence": 7})])
    # holder with the current token, or a newer one, passes
    await store.transact(room, [FenceAtMost("task/t1", 7)], [Put("out", "from 7")])
    await store.transact(room, [FenceAtMost("task/t1", 8)], [Put("out", "from 8")])
    with pytest.raises(StaleFence) as info:
        await store.transact(room, [FenceAtMost("task/t1", 6)], [Put("out", "late")])
    assert (info.value.key, info.value.fence, info.value.current) == ("task/t1", 6, 7)
    assert (await store.read(room, ["out"])).value("out") == "from 8"


async def test_fence_on_absent_record_or_without_field(store: Store, room: str) -> None:
    with pytest.raises(StaleFence) as info:
        await store.transact(room, [FenceAtMost("task/none", 5)], [Put("out", 1)])
    assert info.value.current is None
    await store.transact(room, writes=[Put("plain", "no fence field")])
    await store.transact(room, [FenceAtMost("plain", 0)], [Put("out", 2)])
    assert (await store.read(room, ["out"])).value("out") == 2


async def test_stale_fence_wins_over_version_conflict(store: Store, room: str) -> None:
    await store.transact(room, writes=[Put("task", {"fence": 3}), Put("doc", 1)])
    with pytest.raises(StaleFence):
        await store.transact(
            room, [VersionIs("doc", 1_000_000_000), FenceAtMost("task", 2)], [Put("doc", 2)]
        )
    assert (await store.read(room, ["doc"])).value("doc") == 1


# ---------------------------------------------------------------------- concurrency


async def _race(backend: Backend, room: str, writers: int) -> None:
    setup = await backend.open()
    try:
        v0 = (await setup.transact(room, writes=[Put("doc", {"by": None})])).versions["doc"]
        stores = [await backend.open() for _ in range(writers)]
        barrier = asyncio.Barrier(writers)

        async def writer(i: int) -> int:
            snap = await stores[i].read(room, ["doc"])
            assert snap.version("doc") == v0
            await barrier.wait()
            result = await stores[i].transact(
                room, [VersionIs("doc", v0)], [Put("doc", {"by": i})], [Append("won", i)]
            )
            return result.versions["doc"]

        outcomes = await asyncio.gather(
            *(writer(i) for i in range(writers)), return_exceptions=True
        )
        wins = [o for o in outcomes if isinstance(o, int)]
        losses = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(wins) == 1, outcomes
        assert all(isinstance(o, VersionConflict) for o in losses), losses
        winner = outcomes.index(wins[0])
        for loss in losses:
            assert isinstance(loss, VersionConflict)
            assert loss.conflicts == {"doc": wins[0]}
        snap = await setup.read(room, ["doc"])
        assert snap.value("doc") == {"by": winner}
        assert snap.version("doc") == wins[0]
        log = await setup.read_log(room)
        assert [(e.type, e.data) for e in log] == [("won", winner)]
        for s in stores:
            if s is not setup:
                await s.close()
    finally:
        await setup.close()


@pytest.mark.parametrize("writers", [2, 16])
async def test_racing_writers_exactly_one_wins(backend: Backend, room: str, writers: int) -> None:
    await _race(backend, room, writers)


async def test_concurrent_appends_in_one_process_are_gapless(store: Store, room: str) -> None:
    async def append(i: int) -> int:
        return (await store.transact(room, appends=[Append("e", i)])).seqs[0]

    seqs = await asyncio.gather(*(append(i) for i in range(200)))
    assert sorted(seqs) == list(range(1, 201))
    log = await store.read_log(room, 0, 1000)
    assert [e.seq for e in log] == list(range(1, 201))
    assert {e.data: e.seq for e in log} == dict(zip(range(200), seqs, strict=True))


def _pool(n: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))


@pytest.mark.slow
async def test_appenders_in_separate_processes(backend: Backend, room: str) -> None:
    """8 processes append concurrently: the log is gapless and strictly increasing, and
    every acknowledged append is present exactly once, at the sequence it was told."""
    writers, count = 8, 60
    if backend.shared_across_processes:
        loop = asyncio.get_running_loop()
        with _pool(writers) as pool:
            acked = await asyncio.gather(
                *(
                    loop.run_in_executor(pool, workers.append_events, backend.url, room, w, count)
                    for w in range(writers)
                )
            )
    else:  # memory:// lives in one process: the same check with concurrent tasks
        store = await backend.open()

        async def one(w: int) -> list[tuple[int, int]]:
            out = []
            for i in range(count):
                r = await store.transact(room, appends=[Append("tick", {"writer": w, "i": i})])
                out.append((r.seqs[0], i))
                await asyncio.sleep(0)
            return out

        acked = list(await asyncio.gather(*(one(w) for w in range(writers))))
    reader = await backend.open()
    log = await reader.read_log(room, 0, 10_000)
    assert [e.seq for e in log] == list(range(1, writers * count + 1))
    by_seq = {e.seq: e.data for e in log}
    for w, acks in enumerate(acked):
        assert len(acks) == count
        for seq, i in acks:
            assert by_seq[seq] == {"writer": w, "i": i}
    assert await reader.last_seq(room) == writers * count
    await reader.close()


@pytest.mark.slow
async def test_many_processes_commit_to_one_store(backend: Backend, room: str) -> None:
    """16 processes x 300 commits: no caller sees a locking error, no update is lost."""
    if not backend.shared_across_processes:
        pytest.skip("memory:// is private to one process; covered by the in-process tests")
    procs, count = 16, 300
    loop = asyncio.get_running_loop()
    with _pool(procs) as pool:
        shared_acked = await asyncio.gather(
            *(
                loop.run_in_executor(pool, workers.commit_own_key, backend.url, room, w, count)
                for w in range(procs)
            )
        )
    reader = await backend.open()
    snap = await reader.read(room, [f"counter/{w}" for w in range(procs)] + ["shared"])
    assert all(snap.value(f"counter/{w}") == count for w in range(procs))
    assert snap.value("shared") == sum(shared_acked) == procs * math.ceil(count / 10)
    assert await reader.last_seq(room) == procs * count
    await reader.close()


# ---------------------------------------------------------------------------- expiry


async def test_ttl_expiry_by_store_clock(store: Store, room: str) -> None:
    r = await store.transact(room, writes=[Put("lease", "a", ttl=0.4), Put("keep", "k")])
    snap = await store.read(room, ["lease"])
    rec = snap.get("lease")
    assert rec is not None and rec.expires_at is not None
    assert 0.3 <= rec.expires_at - snap.now <= 0.45
    await asyncio.sleep(0.6)
    snap = await store.read(room, ["lease", "keep"])
    assert snap.get("lease") is None and snap.get("keep") is not None
    assert [rec.key for rec in (await store.scan(room)).records] == ["keep"]
    # expired is absent to compares too
    with pytest.raises(VersionConflict) as info:
        await store.transact(room, [VersionIs("lease", r.versions["lease"])], [Put("x", 1)])
    assert info.value.conflicts == {"lease": None}
    with pytest.raises(VersionConflict):
        await store.transact(room, [Present("lease")], [Put("x", 1)])
    again = await store.transact(room, [Absent("lease")], [Put("lease", "b", ttl=30)])
    assert again.versions["lease"] > r.versions["lease"]
    # a put without ttl clears the expiry
    await store.transact(room, writes=[Put("lease", "c")])
    rec = (await store.read(room, ["lease"])).get("lease")
    assert rec is not None and rec.expires_at is None


# ------------------------------------------------------------------------------ scan


async def test_scan_prefix_order_and_pages(store: Store, room: str) -> None:
    keys = ["task/b", "task/a", "task/é", "task/c", "tasks", "task", "doc/1", "task/ä/x", "u"]
    await store.transact(room, writes=[Put(k, k) for k in keys])
    expected = sorted(k for k in keys if k.startswith("task/"))
    got: list[str] = []
    after = None
    pages = 0
    while True:
        page = await store.scan(room, "task/", after, limit=2)
        pages += 1
        assert len(page.records) <= 2
        got += [r.key for r in page.records]
        assert all(r.value == r.key for r in page.records)
        if page.next_after is None:
            break
        after = page.next_after
    assert got == expected
    assert pages >= 3
    everything = await store.scan(room, limit=100)
    assert [r.key for r in everything.records] == sorted(keys)
    assert everything.next_after is None
    assert [r.key for r in (await store.scan(room, "task/", "task/b")).records] == [
        k for k in expected if k > "task/b"
    ]


async def test_scan_before_prefix_and_empty(store: Store, room: str) -> None:
    await store.transact(room, writes=[Put("b/1", 1), Put("b/2", 2), Put("c", 3)])
    page = await store.scan(room, "b/", after="a")
    assert [r.key for r in page.records] == ["b/1", "b/2"]
    assert (await store.scan(room, "zz")).records == []
    assert (await store.scan(room, "b/", after="b/2")).records == []


# ------------------------------------------------------------------------------- log


async def test_log_sequence_read_and_limit(store: Store, room: str) -> None:
    r1 = await store.transact(room, appends=[Append("a", 1), Append("b", {"x": [1, 2]})])
    r2 = await store.transact(room, writes=[Put("k", 1)], appends=[Append("c")])
    assert r1.seqs == [1, 2] and r2.seqs == [3]
    log = await store.read_log(room)
    assert [(e.seq, e.type, e.data) for e in log] == [
        (1, "a", 1),
        (2, "b", {"x": [1, 2]}),
        (3, "c", None),
    ]
    assert all(abs(e.time - r2.now) < 5 for e in log)
    assert [e.seq for e in await store.read_log(room, after=1, limit=1)] == [2]
    assert await store.read_log(room, after=3) == []
    assert await store.last_seq(room) == 3


async def test_event_author_is_stored_and_read_back(store: Store, room: str) -> None:
    """An append's author comes back with its event from every read of the log; an
    append that names none reads as ``None``; appends of one transact keep their own."""
    result = await store.transact(
        room, appends=[Append("a", 1, author="ann"), Append("b"), Append("c", author="bö b")]
    )
    await store.transact(room, writes=[Put("k", 1)], appends=[Append("d", author="ann")])
    expected = [(1, "ann"), (2, None), (3, "bö b"), (4, "ann")]
    assert [(e.seq, e.author) for e in await store.read_log(room)] == expected
    assert [e.author for e in await store.read_log(room, after=2, limit=1)] == ["bö b"]
    assert [e.author for e in await store.follow_log(room, 0, 1.0)] == [a for _, a in expected]
    assert result.seqs == [1, 2, 3]


@pytest.mark.parametrize("author", ["", "x" * 201, "a\nb", 7])
async def test_bad_event_author_is_refused_before_anything_is_written(
    store: Store, room: str, author: object
) -> None:
    with pytest.raises(BadRequest, match="event author"):
        await store.transact(room, writes=[Put("k", 1)], appends=[Append("e", author=author)])  # type: ignore[arg-type]
    assert (await store.read(room, ["k"])).get("k") is None
    assert await store.last_seq(room) == 0


async def test_event_addressees_are_stored_and_read_back(store: Store, room: str) -> None:
    """An append's addressees (agents and roles) come back with its event from every read
    of the log, in the order given, a name given twice once; an append naming none has
    none; a post-trim read and a follow agree."""
    result = await store.transact(
        room,
        appends=[
            Append("m", 1, author="ann", to=["bob", "cy", "bob"], to_roles=["rev"]),
            Append("n", 2),
            Append("o", 3, to_roles=["rev", "ops"]),
        ],
    )
    await store.transact(room, writes=[Put("k", 1)], appends=[Append("p", to=["ann"])])
    expected = [(("bob", "cy"), ("rev",)), ((), ()), ((), ("rev", "ops")), (("ann",), ())]
    log = await store.read_log(room)
    assert [(e.to, e.to_roles) for e in log] == expected
    assert [e.author for e in log] == ["ann", None, None, None]
    assert [(e.to, e.to_roles) for e in await store.follow_log(room, 0, 1.0)] == expected
    assert [e.to_roles for e in await store.read_log(room, after=2, limit=1)] == [("rev", "ops")]
    assert log[0].addressed_to("cy") and log[0].addressed_to("zed", ["rev"])
    assert not log[1].addressed_to("bob", ["rev"]) and not log[3].addressed_to("bob")
    assert result.seqs == [1, 2, 3]


@pytest.mark.parametrize(
    ("to", "roles"), [(["a\nb"], []), ([], [""]), ("bob", []), ([f"a{i}" for i in range(101)], [])]
)
async def test_bad_event_addressees_are_refused_before_anything_is_written(
    store: Store, room: str, to: object, roles: object
) -> None:
    with pytest.raises(BadRequest, match="address"):
        bad = Append("e", to=to, to_roles=roles)  # type: ignore[arg-type]
        await store.transact(room, writes=[Put("k", 1)], appends=[bad])
    assert (await store.read(room, ["k"])).get("k") is None
    assert await store.last_seq(room) == 0


async def test_trimmed_log_raises_cursor_compacted(store: Store, room: str) -> None:
    await store.transact(room, appends=[Append("e", i) for i in range(10)])
    assert await store.trim_log(room, 5) == 5
    with pytest.raises(CursorCompacted) as info:
        await store.read_log(room, after=0)
    assert info.value.first_available == 5
    with pytest.raises(CursorCompacted):
        await store.read_log(room, after=3)
    assert [e.seq for e in await store.read_log(room, after=4)] == [5, 6, 7, 8, 9, 10]
    assert await store.trim_log(room, 2) == 5  # never goes back
    assert await store.trim_log(room, 1000) == 11  # capped at the head
    assert await store.read_log(room, after=10) == []
    with pytest.raises(CursorCompacted):
        await store.read_log(room, after=9)
    r = await store.transact(room, appends=[Append("after-trim")])
    assert r.seqs == [11]
    assert [e.seq for e in await store.read_log(room, after=10)] == [11]


async def test_trim_of_empty_log(store: Store, room: str) -> None:
    assert await store.trim_log(room, 10) == 1
    assert (await store.transact(room, appends=[Append("first")])).seqs == [1]


# ------------------------------------------------------------------------- bad input


class NotJson:
    pass


async def _assert_unchanged(store: Store, room: str) -> None:
    snap = await store.read(room, ["k", "x"])
    assert snap.value("k") == "original"
    assert set(snap.records) == {"k"}
    assert await store.last_seq(room) == 1


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"writes": [Put("x", NotJson())]}, id="object"),
        pytest.param({"writes": [Put("x", {1, 2})]}, id="set"),
        pytest.param({"writes": [Put("x", math.nan)]}, id="nan"),
        pytest.param({"writes": [Put("x", {"a": math.inf})]}, id="inf"),
        pytest.param({"writes": [Put("", 1)]}, id="empty-key"),
        pytest.param({"writes": [Put("x" * 2000, 1)]}, id="long-key"),
        pytest.param({"writes": [Put("x\x00y", 1)]}, id="nul-key"),
        pytest.param({"writes": [Put(42, 1)]}, id="int-key"),  # type: ignore[arg-type]
        pytest.param({"writes": [Put("x", 1, ttl=-1)]}, id="negative-ttl"),
        pytest.param({"writes": [Put("x", 1, ttl=0)]}, id="zero-ttl"),
        pytest.param({"writes": [Put("x", 1, ttl=math.inf)]}, id="inf-ttl"),
        pytest.param({"writes": [Put("x", 1, ttl=1e12)]}, id="huge-ttl"),
        pytest.param({"writes": [Put("x", "lone \ud800 surrogate")]}, id="lone-surrogate"),
        pytest.param({"appends": [Append("e", {"k": "\udfff"})]}, id="surrogate-event"),
        pytest.param({"writes": [Put("x", 1), Put("x", 2)]}, id="key-twice"),
        pytest.param({"compares": [VersionIs("k", -1)]}, id="negative-version"),
        pytest.param({"appends": [Append("", 1)]}, id="empty-event-type"),
        pytest.param({"appends": [Append("e", NotJson())]}, id="event-not-json"),
        pytest.param({"writes": ["not a write"]}, id="not-a-write"),
    ],
)
async def test_bad_input_is_typed_and_writes_nothing(
    store: Store, room: str, bad: dict[str, list[object]]
) -> None:
    await store.transact(room, writes=[Put("k", "original")], appends=[Append("setup")])
    ops: dict[str, list[object]] = {"writes": [Put("k", "changed")], "appends": [Append("no")]}
    for name, extra in bad.items():
        ops[name] = [*ops.get(name, []), *extra]
    with pytest.raises(BadRequest):
        await store.transact(room, **ops)  # type: ignore[arg-type]
    await _assert_unchanged(store, room)


@pytest.mark.parametrize("bad_room", ["", "a{b}", "x" * 500, "tab\there", None])
async def test_bad_room_names(store: Store, bad_room: str) -> None:
    with pytest.raises(BadRequest):
        await store.transact(bad_room, writes=[Put("k", 1)])
    with pytest.raises(BadRequest):
        await store.read(bad_room, ["k"])


async def test_bad_arguments_to_reads(store: Store, room: str) -> None:
    with pytest.raises(BadRequest):
        await store.read(room, "k")
    with pytest.raises(BadRequest):
        await store.scan(room, limit=0)
    with pytest.raises(BadRequest):
        await store.read_log(room, after=-1)
    with pytest.raises(BadRequest):
        await store.read_log(room, limit=10**9)


async def test_value_over_the_configured_limit(backend: Backend, room: str) -> None:
    small = await backend.open(Limits(max_value_bytes=1000))
    try:
        await small.transact(room, writes=[Put("k", "original")], appends=[Append("setup")])
        with pytest.raises(PayloadTooLarge):
            await small.transact(room, writes=[Put("k", "é" * 600)])  # 1202 bytes as UTF-8
        with pytest.raises(PayloadTooLarge):
            await small.transact(room, appends=[Append("e", "x" * 2000)])
        await _assert_unchanged(small, room)
        await small.transact(room, writes=[Put("k2", "x" * 990)])
    finally:
        await small.close()


async def test_unknown_url_scheme() -> None:
    with pytest.raises(BadRequest, match="unknown store URL scheme"):
        await open_store("mongodb://localhost/x")
    with pytest.raises(BadRequest):
        await open_store("no-scheme-at-all")


def test_errors_share_one_root() -> None:
    assert issubclass(VersionConflict, AgentroomsError)
    assert issubclass(PayloadTooLarge, BadRequest)


# ------------------------------------------------------------------------ round trips


async def test_one_mebibyte_values_and_unicode_keys_round_trip(store: Store, room: str) -> None:
    big = "αβγ🙂" * (256 * 1024 // 4) + "x" * (768 * 1024)  # well over 1 MiB of UTF-8
    value = {"z": big, "a": [1, 2.5, -0.0, 1e300, 2**63 + 1, True, None], "é": {"ü": "ß"}}
    keys = ["日本語/キー", "emoji/🙂", "mixed/ñ é", "quote/\"'\\", "space / slash"]
    await store.transact(room, writes=[Put(k, value) for k in keys])
    snap = await store.read(room, keys)
    for k in keys:
        got = snap.value(k)
        assert got == value
        assert json.dumps(got, ensure_ascii=False) == json.dumps(value, ensure_ascii=False)
        assert list(got) == ["z", "a", "é"]  # key order preserved
    page = await store.scan(room, limit=100)
    assert [r.key for r in page.records] == sorted(keys)


@pytest.mark.parametrize(
    "value",
    [0, -1, 2**53 + 1, 0.1, "", "plain", [], {}, None, False, {"nested": {"deep": [[[]]]}}],
)
async def test_scalar_and_empty_values_round_trip(store: Store, room: str, value: object) -> None:
    await store.transact(room, writes=[Put("v", value)], appends=[Append("v", value)])
    assert (await store.read(room, ["v"])).value("v", default="MISSING") == value
    assert (await store.read_log(room))[0].data == value


# ------------------------------------------------------------- recorded outcomes


async def test_a_put_outcome_records_the_versions_and_seqs_the_store_gave(
    store: Store, room: str
) -> None:
    await store.transact(room, appends=[Append("before")])
    done = await store.transact(
        room,
        compares=[Absent("cmd")],
        writes=[
            Put('doc/é"\\/x', [1, {}, []]),
            PutOutcome("cmd", {"result": [], "empty": {}, "n": 1.5}, ttl=60),
            Put("other", None),
            Delete("gone"),
        ],
        appends=[Append("a"), Append("b")],
    )
    record = (await store.read(room, ["cmd"])).get("cmd")
    assert record is not None and record.version == done.versions["cmd"]
    others = {k: v for k, v in done.versions.items() if k != "cmd"}
    assert record.value == {
        "outcome": {"versions": others, "seqs": done.seqs},
        "result": [],
        "empty": {},
        "n": 1.5,
    }
    assert done.seqs == [2, 3] and set(others) == {'doc/é"\\/x', "other"}
    assert record.expires_at is not None


async def test_a_put_outcome_alone_and_with_an_empty_object(store: Store, room: str) -> None:
    await store.transact(room, writes=[PutOutcome("cmd", {})])
    assert (await store.read(room, ["cmd"])).value("cmd") == {
        "outcome": {"versions": {}, "seqs": []}
    }


async def test_concurrent_put_outcomes_each_record_their_own(store: Store, room: str) -> None:
    """Appending transacts that arrive together (PostgreSQL sends them as one batch):
    each outcome record holds its own transact's versions and seqs, and a failed one
    records nothing."""

    async def one(i: int) -> TransactResult | VersionConflict:
        try:
            return await store.transact(
                room,
                compares=[Absent("taken")] if i % 5 == 4 else [],
                writes=[Put(f"doc{i}", i), PutOutcome(f"cmd{i}", {"i": i})],
                appends=[Append("e", i)] * (1 + i % 3),
            )
        except VersionConflict as exc:
            return exc

    await store.transact(room, writes=[Put("taken", 1)])
    results = await asyncio.gather(*(one(i) for i in range(20)))
    snap = await store.read(room, [f"cmd{i}" for i in range(20)])
    for i, done in enumerate(results):
        if i % 5 == 4:
            assert isinstance(done, VersionConflict) and snap.get(f"cmd{i}") is None
            continue
        assert isinstance(done, TransactResult)
        assert snap.value(f"cmd{i}") == {
            "outcome": {"versions": {f"doc{i}": done.versions[f"doc{i}"]}, "seqs": done.seqs},
            "i": i,
        }


@pytest.mark.parametrize(
    "writes",
    [
        [PutOutcome("a", {}), PutOutcome("b", {})],
        [PutOutcome("a", [1])],
        [PutOutcome("a", {"outcome": 1})],
    ],
    ids=["two", "not-an-object", "outcome-field"],
)
async def test_a_put_outcome_is_checked(store: Store, room: str, writes: list[Put]) -> None:
    with pytest.raises(BadRequest):
        await store.transact(room, writes=writes)
    assert (await store.read(room, ["a", "b"])).records == {}
