"""Path reservations on every backend: atomic grants of a set, conflicts naming the
holder and pattern, shared/shared, fences, owner-checked renew and release, expiry by
the store clock with reclaim told in the log, and racing agents."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

import pytest

from agentrooms.errors import BadRequest, NotFound, PathsLost, PathsReserved
from agentrooms.rooms import Room, Rooms, globs
from agentrooms.rooms.paths import Reservation
from agentrooms.store import Store, open_store
from tests.conftest import Backend


@pytest.fixture
async def room(store: Store) -> Room:
    return await Rooms(store).create(f"p-{uuid.uuid4().hex[:10]}", "paths")


async def _types(room: Room) -> list[str]:
    return [e.type for e in await room.store.read_log(room.name, 0, 1000)]


async def test_a_set_is_granted_whole_or_not_at_all(room: Room) -> None:
    a = await room.paths.reserve(["src/a.py"], "alice")
    with pytest.raises(PathsReserved) as caught:
        await room.paths.reserve(["docs/*.md", "src/**"], "bob")
    exc = caught.value
    assert (exc.name, exc.holder, exc.pattern, exc.reservation, exc.mode) == (
        "src/**",
        "alice",
        "src/a.py",
        a.id,
        "exclusive",
    )
    assert exc.code == "paths_reserved" and exc.details()["pattern"] == "src/a.py"
    # nothing of the refused set was granted: docs/*.md is still free
    docs = await room.paths.reserve(["docs/*.md"], "carol")
    assert [r.id for r in sorted(await room.paths.held(), key=lambda r: r.fence)] == [
        a.id,
        docs.id,
    ]


async def test_disjoint_patterns_do_not_conflict(room: Room) -> None:
    await room.paths.reserve(["src/*.py"], "alice")
    await room.paths.reserve(["docs/*.md"], "bob")
    await room.paths.reserve(["src/x/y.py"], "carol")  # src/*.py matches no deeper path
    with pytest.raises(PathsReserved):
        await room.paths.reserve(["src/**/y.py"], "dave")  # matches src/x/y.py


async def test_shared_goes_with_shared_but_not_with_exclusive(room: Room) -> None:
    await room.paths.reserve(["lib/**"], "alice", mode="shared")
    await room.paths.reserve(["lib/core.py"], "bob", mode="shared")
    with pytest.raises(PathsReserved) as caught:
        await room.paths.reserve(["lib/core.py"], "carol")
    assert caught.value.mode == "shared"
    ex = await room.paths.reserve(["bin/*"], "carol")
    with pytest.raises(PathsReserved):
        await room.paths.reserve(["bin/run"], "alice", mode="shared")
    assert ex.mode == "exclusive"


async def test_fences_increase_with_every_grant(room: Room) -> None:
    fences = [(await room.paths.reserve([f"d{i}/**"], "alice")).fence for i in range(4)]
    assert fences == sorted(set(fences)) and fences[0] >= 1


async def test_renew_and_release_are_owner_checked(room: Room) -> None:
    r = await room.paths.reserve(["a/b.py"], "alice", ttl=5)
    with pytest.raises(PathsLost, match="not 'bob'"):
        await room.paths.renew(r.id, "bob")
    assert await room.paths.release(r.id, "bob") is False
    renewed = await room.paths.renew(r.id, "alice", ttl=60)
    assert renewed.fence == r.fence and renewed.expires_at > r.expires_at
    assert await room.paths.release(r.id, "alice") is True
    assert await room.paths.release(r.id, "alice") is False
    with pytest.raises(PathsLost):
        await room.paths.renew(r.id, "alice")
    await room.paths.reserve(["a/**"], "bob")  # free again
    assert (await _types(room))[-3:] == ["paths.reserved", "paths.released", "paths.reserved"]


async def test_a_lapsed_reservation_is_reclaimed_and_the_loss_told(room: Room) -> None:
    old = await room.paths.reserve(["src/**", "README.md"], "alice", ttl=0.8)
    with pytest.raises(PathsReserved):
        await room.paths.reserve(["src/a.py"], "bob")
    await asyncio.sleep(1.0)
    with pytest.raises(PathsLost, match="lapsed"):
        await room.paths.renew(old.id, "alice")  # lapsed: the holder learns it at once
    new = await room.paths.reserve(["src/a.py"], "bob")
    assert new.fence > old.fence
    log = await room.store.read_log(room.name, 0, 1000)
    (expired,) = [e for e in log if e.type == "paths.expired"]
    assert expired.data["id"] == old.id and expired.data["owner"] == "alice"
    assert expired.data["by"] == "bob"
    told = await room.events.read_new("alice", inbox=True)  # addressed to the holder
    assert [e.seq for e in told] == [expired.seq] and expired.to == ("alice",)
    assert await room.events.read_new("bob", inbox=True) == []
    assert [r.id for r in await room.paths.held()] == [new.id]
    with pytest.raises(PathsLost, match="not held"):
        await room.paths.renew(old.id, "alice")  # reclaimed: gone
    await room.paths.reserve(["README.md"], "carol")  # reclaimed whole, not pattern by pattern


async def test_check_reports_other_agents_reservations_only(room: Room) -> None:
    mine = await room.paths.reserve(["src/mine.py"], "alice")
    theirs = await room.paths.reserve(["src/**/*.md"], "bob", mode="shared")
    found = await room.paths.check(["src/mine.py", "src/x/notes.md", "docs/a.md"], "alice")
    assert [(c.pattern, c.holder, c.held, c.reservation, c.mode) for c in found] == [
        ("src/x/notes.md", "bob", "src/**/*.md", theirs.id, "shared")
    ]
    assert await room.paths.check(["src/x/notes.md"], "alice", mode="shared") == []
    assert [c.holder for c in await room.paths.check(["src/mine.py"], "bob")] == ["alice"]
    assert mine.id


async def test_bad_patterns_are_refused(room: Room) -> None:
    for bad in ["src/[ab].py", "src/{a,b}", "/abs", "a//b", "../x", "a**b", ""]:
        with pytest.raises(BadRequest):
            await room.paths.reserve([bad], "alice")
    with pytest.raises(BadRequest):
        await room.paths.reserve("src/**", "alice")  # one string, not a list
    with pytest.raises(BadRequest):
        await room.paths.reserve(["a"], "alice", mode="mine")
    with pytest.raises(NotFound):
        await Room(room.store, "no-such-room").paths.reserve(["a"], "alice")


async def test_racing_agents_never_hold_overlapping_exclusive_grants(
    room: Room, backend: Backend
) -> None:
    """Six agents on three store handles race on overlapping sets; after every grant the
    live reservations are checked pairwise."""
    sets = [["src/**"], ["src/a.py", "docs/x.md"], ["docs/*.md"], ["src/*.py"], ["lib/*"]]
    granted: list[Reservation] = []
    refused: list[str | None] = []

    handles = [await _handle(backend, room.store) for _ in range(3)]

    async def agent(n: int) -> None:
        mine = Room(handles[n % 3], room.name)
        for i in range(8):
            try:
                r = await mine.paths.reserve(sets[(n + i) % len(sets)], f"agent{n}", ttl=30)
            except PathsReserved as exc:
                refused.append(exc.holder)
                continue
            granted.append(r)
            _no_overlap(await mine.paths.held())
            if i % 2:
                assert await mine.paths.release(r.id, r.owner)

    await asyncio.gather(*(agent(n) for n in range(6)))
    _no_overlap(await room.paths.held())
    assert granted and refused
    fences = [r.fence for r in granted]
    assert len(set(fences)) == len(fences)  # one fencing token per grant


async def _handle(backend: Backend, store: Store) -> Store:
    """Another handle on the backend's data (a small pool: the server is shared)."""
    if not backend.shared_across_processes:
        return store
    url = backend.url
    if backend.name == "postgres":
        url += ("&" if "?" in url else "?") + "pool_size=2"
    opened = await open_store(url)
    backend._opened.append(opened)
    return opened


def _no_overlap(held: list[Reservation]) -> None:
    for a, b in itertools.combinations(held, 2):
        if a.mode == b.mode == "shared":
            continue
        for p, q in itertools.product(a.patterns, b.patterns):
            assert not globs.overlap(p, q), (a, b)


async def test_a_grant_reads_only_the_index_it_could_overlap(room: Room) -> None:
    for i in range(30):
        await room.paths.reserve([f"pkg{i}/**", f"pkg{i}/src/*.py"], f"agent{i}")
    await room.paths.reserve(["src/*.py"], "root")
    scans: list[tuple[str, int]] = []
    scan = room.store.scan

    async def counted(r: str, prefix: str = "", after: str | None = None, limit: int = 100) -> Any:
        page = await scan(r, prefix, after, limit)
        scans.append((prefix, len(page.records)))
        return page

    room.store.scan = counted  # type: ignore[method-assign,assignment]
    try:
        await room.paths.reserve(["new/deep/x.py"], "bench")
        assert sum(n for _, n in scans) == 0  # nothing under pkg*/ or src/ was read
        assert sorted(p for p, _ in scans) == [
            "pathx/*",
            "pathx/new/*",
            "pathx/new/deep/*",
            "pathx/new/deep/x.py/",
        ]
        scans.clear()
        with pytest.raises(PathsReserved):
            await room.paths.reserve(["pkg7/src/a.py"], "bench")
        assert sum(n for _, n in scans) == 2  # pkg7's two patterns, nothing of the others
    finally:
        del room.store.scan


async def test_only_an_overlapping_grant_reclaims_a_lapsed_reservation(room: Room) -> None:
    old = await room.paths.reserve(["docs/**"], "alice", ttl=0.2, mode="shared")
    await asyncio.sleep(0.4)
    await room.paths.reserve(["docs/a.md"], "bob", mode="shared")  # shared/shared: no clash
    await room.paths.reserve(["src/a.py"], "bob")  # elsewhere
    assert "paths.expired" not in await _types(room)
    await room.paths.reserve(["docs/b.md"], "carol")
    log = await room.store.read_log(room.name, 0, 1000)
    assert [e.data["id"] for e in log if e.type == "paths.expired"] == [old.id]


async def test_hold_renews_releases_and_cancels_the_body_on_loss(room: Room) -> None:
    async with room.paths.hold(["src/**"], "alice", ttl=1.2) as held:
        await asyncio.sleep(1.6)  # past the ttl: the background renewals keep it
        assert [r.id for r in await room.paths.held()] == [held.id]
    assert await room.paths.held() == []  # released on the way out
    reached = False
    with pytest.raises(PathsLost):
        async with room.paths.hold(["docs/**"], "alice", ttl=0.3) as held:
            assert await room.paths.release(held.id, "alice")  # lost under the body
            await asyncio.sleep(5)
            reached = True
    assert not reached
