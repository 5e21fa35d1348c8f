"""The Redis Cluster store (``redis+cluster://``) against a cluster of the run's own:
one node per store call, redirects when a slot moves, replica acknowledgements
(``?wait=``), a primary killed mid-run, and a plain ``redis://`` URL given a cluster node.
The store contract itself is the conformance suite's, which runs on this cluster too."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import pytest
import redis

from agentrooms.errors import BadRequest, StoreUnavailable
from agentrooms.rooms import Rooms, registry
from agentrooms.server.auth import TOKEN_ROOMS, MintedToken, authenticate, list_tokens, mint
from agentrooms.store import Append, Put, SetAdd, VersionIs, open_store
from agentrooms.store.redis.backend import RedisStore, ReplicasBehind
from agentrooms.store.redis.cluster import RedisClusterStore, slot_of, split_cluster_url
from agentrooms.store.redis.keys import room_tag
from tests.cluster_fixture import Cluster

# ----------------------------------------------------------------------------- pure


def test_cluster_url_is_split_into_seeds() -> None:
    scheme, user, seeds, query = split_cluster_url(
        "redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001/?prefix=p&wait=1"
    )
    assert (scheme, user, query) == ("redis", "u:pw@", "prefix=p&wait=1")
    assert seeds == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert split_cluster_url("rediss+cluster://h:1/")[0] == "rediss"
    with pytest.raises(BadRequest, match="database 0"):
        split_cluster_url("redis+cluster://h:1/3")
    with pytest.raises(BadRequest, match="host:port"):
        split_cluster_url("redis+cluster://h:x/")


def test_every_key_of_a_room_is_in_the_slot_of_its_tag() -> None:
    tag = room_tag("ar", "r1")
    assert {slot_of(f"ar:{tag}:{suffix}") for suffix in ("m", "i", "log", "r:k", "s:x")} == {
        slot_of(tag)
    }


def test_cluster_url_parameters_are_checked_at_open_without_io() -> None:
    with pytest.raises(BadRequest, match="unknown redis URL parameter 'bogus'"):
        RedisClusterStore("redis+cluster://127.0.0.1:1,127.0.0.1:2/?bogus=1")
    with pytest.raises(BadRequest, match="database 0"):
        RedisClusterStore("redis+cluster://127.0.0.1:1/?db=2")
    store = RedisClusterStore("redis+cluster://127.0.0.1:1/?prefix=p&timeout=2&wait=1")
    assert (store.prefix, store.timeout, store.wait_replicas, store.wait_ms) == ("p", 2, 1, 1000)


async def test_no_node_answering_is_unavailable() -> None:
    with pytest.raises(StoreUnavailable, match="no node gave a slot map"):
        await open_store("redis+cluster://127.0.0.1:1/?connect_timeout=0.5")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("wait=-1", "wait must be"),
        ("wait=1&wait_timeout=0", "wait_timeout must be"),
        ("wait_timeout=10", "without wait"),
        ("wait=1&wait_timeout=9000&timeout=5", "shorter than the reply timeout"),
    ],
)
def test_bad_wait_parameters_are_refused(query: str, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        RedisStore(f"redis://127.0.0.1:1/0?{query}")


# -------------------------------------------------------------------- on a cluster


@pytest.fixture
async def cluster_store(redis_cluster_url: str) -> AsyncIterator[RedisClusterStore]:
    store = await open_store(redis_cluster_url)
    assert isinstance(store, RedisClusterStore)
    try:
        yield store
    finally:
        await store.close()


def rooms_on_each_primary(store: RedisClusterStore, per_node: int = 1) -> list[str]:
    """Room names, ``per_node`` on each primary."""
    wanted = {shard.primary: per_node for shard in store.shards}
    found = []
    while any(wanted.values()):
        room = f"room-{uuid.uuid4().hex[:12]}"
        owner = store._slots[slot_of(room_tag(store.prefix, room))]
        assert owner is not None
        if wanted[owner]:
            wanted[owner] -= 1
            found.append(room)
    return found


CONTRACT = ("evalsha", "eval", "hget", "hmget", "zcard", "xread", "script", "asking", "wait")


def contract_calls(port: int) -> int:
    """Commands of the store contract a node has served so far (INFO commandstats)."""
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        stats: dict[str, Any] = client.info("commandstats")
    finally:
        client.close()
    return sum(int(v["calls"]) for k, v in stats.items() if k.removeprefix("cmdstat_") in CONTRACT)


async def test_each_store_call_touches_exactly_one_node(cluster_store: RedisClusterStore) -> None:
    store = cluster_store
    ports = [shard.primary[1] for shard in store.shards]
    calls: list[tuple[str, Callable[[str], Awaitable[Any]]]] = [
        ("transact", lambda r: store.transact(r, writes=[Put("k", 1)], appends=[Append("t", {})])),
        ("transact set", lambda r: store.transact(r, writes=[SetAdd("s", "m")])),
        ("read", lambda r: store.read(r, ["k", "j"])),
        ("scan", lambda r: store.scan(r, "", None, 10)),
        ("read_log", lambda r: store.read_log(r, 0, 10)),
        ("last_seq", store.last_seq),
        ("set_size", lambda r: store.set_size(r, "s")),
        ("set_pick", lambda r: store.set_pick(r, "s", 1)),
        ("watch", lambda r: store.watch(r, 5, 0.05)),
        ("follow_log", lambda r: store.follow_log(r, 5, 0.05)),
        ("trim_log", lambda r: store.trim_log(r, 1)),
        ("glance", lambda r: store.glance([r], ["k"], ["s"])),
        ("delete_room", store.delete_room),
    ]
    for room in rooms_on_each_primary(store):
        owner = store._slots[slot_of(room_tag(store.prefix, room))]
        assert owner is not None
        for name, call in calls:
            before = {port: contract_calls(port) for port in ports}
            await call(room)
            touched = {port for port in ports if contract_calls(port) != before[port]}
            assert touched == {owner[1]}, (name, room, touched, owner)


async def test_a_glance_over_rooms_on_every_node(cluster_store: RedisClusterStore) -> None:
    rooms = rooms_on_each_primary(cluster_store, 2)
    for room in rooms:
        await cluster_store.transact(room, writes=[Put("k", room)])
    glances = await cluster_store.glance(rooms, ["k"], [])
    assert [g.snapshot.records["k"].value for g in glances] == rooms


async def test_plain_url_to_a_cluster_node_is_refused_at_once(
    redis_cluster: Cluster, cluster_store: RedisClusterStore, redis_cluster_url: str
) -> None:
    port = cluster_store.shards[0].primary[1]
    plain = f"redis://127.0.0.1:{port}/0?prefix={cluster_store.prefix}"
    started = time.monotonic()
    with pytest.raises(BadRequest, match="redis\\+cluster://"):
        await open_store(plain)
    # a store that got past open (nothing else can) meets MOVED: BadRequest, not a retry
    direct = RedisStore(plain)
    try:
        await direct._load_scripts()
        here = ("127.0.0.1", port)
        elsewhere = next(
            r
            for r in rooms_on_each_primary(cluster_store, 3)
            if cluster_store._slots[slot_of(room_tag(cluster_store.prefix, r))] != here
        )
        with pytest.raises(BadRequest, match=r"Cluster node \(MOVED"):
            await direct.transact(elsewhere, writes=[Put("k", 1)])
        with pytest.raises(BadRequest, match="cluster mode"):
            await Rooms(direct).create(elsewhere)
    finally:
        await direct.close()
    assert time.monotonic() - started < 2.0
    assert not (await cluster_store.read(elsewhere, ["k"])).records


async def test_rooms_create_through_a_plain_url_leaves_no_registry_entry(
    cluster_store: RedisClusterStore,
) -> None:
    port = cluster_store.shards[0].primary[1]
    room = f"room-{uuid.uuid4().hex[:12]}"
    with pytest.raises(BadRequest, match="cluster"):
        async with await open_store(f"redis://127.0.0.1:{port}/0?prefix={cluster_store.prefix}"):
            pass
    assert room not in [r.name for r in await Rooms(cluster_store).list()]


async def test_a_slot_that_moves_is_followed(
    redis_cluster: Cluster, cluster_store: RedisClusterStore
) -> None:
    """While a slot migrates, a one-key call for a key not on the source is sent to the
    target after ASK, and a many-key one meets TRYAGAIN until its bounded backoff ends
    (nothing done); once the slot has moved, MOVED corrects the map. A call over many
    rooms sends the room that met ASK again alone, the others' replies kept."""
    store = cluster_store
    room = rooms_on_each_primary(store)[0]
    others = rooms_on_each_primary(store)
    for other in others:
        await store.transact(other, writes=[Put("k", other)])
    slot = slot_of(room_tag(store.prefix, room))
    source = store._slots[slot]
    assert source is not None
    target = next(s.primary for s in store.shards if s.primary != source)
    ids = {
        int(line.split()[1].split("@")[0].rsplit(":", 1)[1]): line.split()[0]
        for line in redis_cluster.cli(source[1], "CLUSTER", "NODES").splitlines()
    }
    cli = redis_cluster.cli
    cli(target[1], "CLUSTER", "SETSLOT", str(slot), "IMPORTING", ids[source[1]])
    cli(source[1], "CLUSTER", "SETSLOT", str(slot), "MIGRATING", ids[target[1]])
    try:
        before = contract_calls(target[1])
        assert await store.last_seq(room) == 0  # ASK: answered by the target
        assert not (await store.read(room, ["k"])).records
        assert contract_calls(target[1]) >= before + 2
        assert store._slots[slot] == source  # ASK does not change the map
        pages = await store.scan_rooms([room, *others], "", 10)
        assert [[r.value for r in p.records] for p in pages] == [[], *([o] for o in others)]
        with pytest.raises(StoreUnavailable, match="TRYAGAIN"):
            await store.transact(room, writes=[Put("k", "x")], appends=[Append("t", {})])
    finally:
        for port in (target[1], source[1]):
            cli(port, "CLUSTER", "SETSLOT", str(slot), "NODE", ids[target[1]])
    refreshes = store.refreshes
    await store.transact(room, writes=[Put("k", "moved")])  # MOVED, then on the target
    assert store._slots[slot] == target
    assert (await store.read(room, ["k"])).records["k"].value == "moved"
    await asyncio.sleep(0.2)
    assert store.refreshes > refreshes


async def test_a_connection_broken_mid_call_is_an_unknown_outcome(
    cluster_store: RedisClusterStore,
) -> None:
    """The call fails with ``StoreUnavailable`` (not retried: it may have been applied),
    the slot map is fetched again, and the next call dials a new connection."""
    store = cluster_store
    room = rooms_on_each_primary(store)[0]
    owner = store._slots[slot_of(room_tag(store.prefix, room))]
    assert owner is not None
    await store.last_seq(room)  # the owner's wire is up
    node = store._nodes[owner]
    assert node._wire is not None
    refreshes = store.refreshes
    call = asyncio.ensure_future(store.transact(room, writes=[Put("k", 1)]))
    await asyncio.sleep(0)  # written, its reply not yet read
    node._wire.close("broken by the test")
    with pytest.raises(StoreUnavailable, match="broken by the test"):
        await call
    await asyncio.sleep(0.2)
    assert store.refreshes > refreshes
    await store.transact(room, writes=[Put("k", 2)])
    assert (await store.read(room, ["k"])).records["k"].value == 2


async def test_wait_for_replicas(redis_cluster: Cluster, redis_cluster_url: str) -> None:
    """``wait=1``: one replica per primary acknowledges every write; ``wait=2`` cannot be
    met (one replica each): the write is applied but reported as an unknown outcome."""
    async with await open_store(f"{redis_cluster_url}&wait=1&wait_timeout=2000") as store:
        rooms = rooms_on_each_primary(store)  # type: ignore[arg-type]
        for room in rooms:
            done = await store.transact(room, writes=[Put("k", 1)])
            await store.transact(room, [VersionIs("k", done.versions["k"])], [Put("k", 2)])
        assert "WAIT 1" in (await store.info()).details["wait"]
    async with await open_store(f"{redis_cluster_url}&wait=2&wait_timeout=100") as store:
        with pytest.raises(ReplicasBehind, match="only 1 of 2 replicas") as caught:
            await store.transact(rooms[0], writes=[Put("k", 3)])
        assert isinstance(caught.value, StoreUnavailable)
        assert (await store.read(rooms[0], ["k"])).records["k"].value == 3  # applied
    async with await open_store(redis_cluster_url) as store:  # without: no WAIT at all
        await store.transact(rooms[0], writes=[Put("k", 4)])
        assert "off" in (await store.info()).details["wait"]


async def test_wait_on_a_server_without_replicas(redis_url: str) -> None:
    async with await open_store(f"{redis_url}&wait=1&wait_timeout=50") as store:
        with pytest.raises(ReplicasBehind):
            await store.transact(f"room-{uuid.uuid4().hex}", writes=[Put("k", 1)])


async def test_info_shows_the_topology(cluster_store: RedisClusterStore) -> None:
    info = await cluster_store.info()
    topology = info.details["topology"]
    assert len(topology) == 3
    assert all("replicas 127.0.0.1:" in line for line in topology)
    assert any("wait is off" in w for w in info.warnings)


async def until(what: str, check: Callable[[], Awaitable[Any]], seconds: float = 30) -> Any:
    """``check()``'s result once it stops raising ``StoreUnavailable`` (as a caller retries)."""
    ended = time.monotonic() + seconds
    while True:
        try:
            return await check()
        except StoreUnavailable:
            assert time.monotonic() < ended, f"{what}: still unavailable after {seconds} s"
            await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_failover_loses_no_acknowledged_write(
    redis_cluster: Cluster, redis_cluster_url: str
) -> None:
    """Kill a primary (SIGKILL): its replica is promoted, every write acknowledged with
    ``wait=1`` is there (fence counter included), and writes resume; until the killed
    node is back as a replica, ``wait=1`` writes on its shard are unknown outcomes."""
    waiting = await open_store(f"{redis_cluster_url}&wait=1&wait_timeout=2000")
    plain = await open_store(redis_cluster_url)
    assert isinstance(waiting, RedisClusterStore)
    victim: tuple[str, int] | None = None
    killed = False
    try:
        rooms = rooms_on_each_primary(waiting, 2)
        victim = waiting._slots[slot_of(room_tag(waiting.prefix, rooms[0]))]
        assert victim is not None
        acknowledged: dict[str, int] = {}
        for room in rooms:
            for fence in (1, 2, 3):
                done = await waiting.transact(room, writes=[Put("fence", {"fence": fence})])
            acknowledged[room] = done.versions["fence"]
        redis_cluster.stop(victim[1])
        killed = True

        async def all_there() -> None:
            for room in rooms:
                record = (await waiting.read(room, ["fence"])).records["fence"]
                assert (record.version, record.value) == (acknowledged[room], {"fence": 3})

        await until("reads after the failover", all_there)
        assert victim not in {s.primary for s in waiting.shards}
        for room in rooms:  # writes resume at once without wait
            compare = [VersionIs("fence", acknowledged[room])]
            done = await until(
                "writes after the failover",
                partial(plain.transact, room, compare, [Put("fence", {"fence": 4})]),
            )
            acknowledged[room] = done.versions["fence"]
        with pytest.raises(ReplicasBehind):  # the promoted primary has no replica yet
            await waiting.transact(rooms[0], writes=[Put("other", 1)])
        redis_cluster.start(victim[1])
        killed = False
        await asyncio.to_thread(redis_cluster.wait_ok, 60)
        for room in rooms:
            await until(
                "wait=1 writes once the node is back as a replica",
                partial(waiting.transact, room, (), [Put("other", 2)]),
            )
    finally:
        if killed and victim is not None:  # the cluster whole again for the other tests
            redis_cluster.start(victim[1])
            await asyncio.to_thread(redis_cluster.wait_ok, 60)
        await waiting.close()
        await plain.close()


def test_doctor_prints_the_topology(redis_cluster: Cluster, redis_cluster_url: str) -> None:
    """The CLI surface: ``doctor`` shows each primary, its slots and its replicas; a plain
    ``redis://`` URL to a cluster node is a usage error naming cluster mode."""
    from typer.testing import CliRunner

    from agentrooms.cli import app
    from agentrooms.cli_common import EXIT_USAGE

    runner = CliRunner()
    result = runner.invoke(app, ["doctor", "--url", redis_cluster_url], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output  # warns: no WAIT, no persistence
    # the table may wrap a long topology line anywhere (how long depends on the ports)
    assert " ".join(result.output.split()).count("replicas 127.0.0.1:") == 3, result.output
    assert "topology" in result.output and "slots 0-" in result.output
    result = runner.invoke(app, ["doctor", "--url", redis_cluster_url, "--json"])
    assert len(json.loads(result.output)["details"]["topology"]) == 3
    plain = f"redis://127.0.0.1:{redis_cluster.ports[0]}/0"
    result = runner.invoke(app, ["doctor", "--url", plain], env={"COLUMNS": "200"})
    assert result.exit_code == EXIT_USAGE and "redis+cluster://" in result.output


async def test_registry_entries_and_tokens_are_spread_over_the_primaries(
    cluster_store: RedisClusterStore,
) -> None:
    """Rooms registered through one shard per primary, and tokens minted until their
    rooms cover two primaries: each entry is in its shard on its owner, and the listing
    and token checks read them back from every node they landed on."""
    store = cluster_store

    def owner(room: str) -> tuple[str, int] | None:
        return store._slots[slot_of(room_tag(store.prefix, room))]

    wanted = {shard.primary for shard in store.shards}
    names: list[str] = []
    while wanted:
        name = f"reg-{uuid.uuid4().hex[:12]}"
        if owner(registry.shard_of(name)) in wanted:
            wanted.discard(owner(registry.shard_of(name)))
            names.append(name)
    rooms = Rooms(store)
    for name in names:
        await rooms.create(name)
        entry = await store.read(registry.shard_of(name), [f"room/{name}"])
        assert entry.records  # written to its shard, whose owner is one of each primary
    listed = [r.name for r in await rooms.list()]
    assert [n for n in listed if n in names] == sorted(names)
    minted: list[MintedToken] = []
    while len({owner(TOKEN_ROOMS[int(m.info.id[0], 16)]) for m in minted}) < 2:
        assert len(minted) < 32
        minted.append(await mint(store, "a", rooms="*", scopes=["admin"]))
    for m in minted:
        token_id, secret = m.token.split("_")[1:]
        principal, _ = await authenticate(store, token_id, secret)
        assert principal.token_id == token_id
    assert {t.id for t in await list_tokens(store)} >= {m.info.id for m in minted}
