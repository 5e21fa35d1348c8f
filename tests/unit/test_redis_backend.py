"""The Redis backend's own pieces: command packing (pure), and what the conformance suite
cannot see from outside — watch connections, cancellation, the keys left behind by
``delete_room``, the set registry, pick order against the reference backend, and calls
the hot path's pipelined connection (:mod:`agentrooms.store.redis.wire`)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aredis
from redis.asyncio.connection import Connection

from agentrooms.errors import StoreUnavailable
from agentrooms.store import Append, Put, SetAdd, SetRemove, open_store
from agentrooms.store.memory import MemoryStore
from agentrooms.store.redis.backend import RedisStore
from agentrooms.store.redis.keys import room_keys, split_url
from agentrooms.store.redis.scripts import MAX_SEQ, block_ms, set_op_arg, watch_command
from agentrooms.store.redis.wire import Wire, pack_command, pack_evalsha
from tests.conftest import unavailable
from tests.helpers import free_port

# ----------------------------------------------------------------------------- pure


@pytest.mark.parametrize(
    "args",
    [
        ("HGET", "ar:{ar:r}:m", "seq"),
        ("XREAD", "COUNT", 1, "BLOCK", 250, "STREAMS", "k", "7-0"),
        ("SET", "日本", b"\x00\xff", "x" * 5000),
        ("PING",),
    ],
)
def test_pack_command_makes_the_bytes_redis_py_makes(args: tuple[str | int | bytes, ...]) -> None:
    assert b"".join(pack_command(*args)) == b"".join(Connection().pack_command(*args))


def test_pack_evalsha_makes_the_bytes_redis_py_makes() -> None:
    sha = "a" * 40
    keys = ["k1", "k{2}"]
    args: list[str | int | bytes] = [3, "é", "", b"\x01", "y" * 5000]
    expected = Connection().pack_command("EVALSHA", sha, len(keys), *keys, *args)
    assert b"".join(pack_evalsha(sha, keys, args)) == b"".join(expected)


def test_watch_command_reads_the_log_then_the_sequence() -> None:
    keys = room_keys("ar", "r")
    sent = b"".join(watch_command(keys, 41, 1500))
    expected = Connection().pack_command(
        "XREAD", "COUNT", 1, "BLOCK", 1500, "STREAMS", keys.log, "41-0"
    ) + Connection().pack_command("HGET", keys.meta, "seq")
    assert sent == b"".join(expected)
    # an ID Redis accepts, whatever after is (sequence numbers never get that far)
    assert f"{MAX_SEQ}-0".encode() in b"".join(watch_command(keys, 10**40, 1))
    with pytest.raises(AssertionError):
        watch_command(keys, 0, 0)  # BLOCK 0 means forever


@pytest.mark.parametrize(
    ("seconds", "ms"), [(0.0, 1), (1e-9, 1), (0.001, 1), (0.0011, 2), (0.3, 300), (3600, 3_600_000)]
)
def test_block_ms_rounds_up_and_is_never_zero(seconds: float, ms: int) -> None:
    assert block_ms(seconds) == ms


def test_set_op_arg() -> None:
    assert set_op_arg(True, "t1") == "+t1"
    assert set_op_arg(False, "-x") == "--x"
    assert set_op_arg(True, "+") == "++"


# ------------------------------------------------------------------- with a server


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aredis.Redis]:
    client = aredis.Redis.from_url(split_url(redis_url)[0])
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def redis_store(redis_url: str) -> AsyncIterator[RedisStore]:
    store = await open_store(redis_url)
    assert isinstance(store, RedisStore)
    try:
        yield store
    finally:
        await store.close()


def _text(value: bytes | str) -> str:
    return value if isinstance(value, str) else value.decode()


def _room() -> str:
    return f"unit-{uuid.uuid4().hex[:12]}"


def _watch_addresses(store: RedisStore) -> set[str]:
    """``host:port`` of ``store``'s watch connections in use, as CLIENT LIST names them."""
    found = set()
    for wire in store._busy_watch:
        if wire._transport is not None:
            host, port = wire._transport.get_extra_info("sockname")[:2]
            found.add(f"{host}:{port}")
    return found


async def _blocked(raw: aredis.Redis, addresses: set[str]) -> set[str]:
    """Those of ``addresses`` whose client is blocked in XREAD on the server."""
    clients: list[dict[str, str]] = await raw.client_list()
    return {
        c["addr"]
        for c in clients
        if c["addr"] in addresses and c["cmd"] == "xread" and "b" in c["flags"]
    }


async def _until_blocked(
    raw: aredis.Redis, store: RedisStore, addresses: set[str], blocked: bool
) -> bool:
    """Wait (up to 5 s) until one of ``store``'s watch connections (collected into
    ``addresses``) is blocked on the server, or, with ``blocked=False``, none is."""
    deadline = time.monotonic() + 5
    while True:
        addresses.update(_watch_addresses(store))
        if bool(await _blocked(raw, addresses)) == blocked:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)


async def test_a_cancelled_watch_frees_its_connection_and_the_server(
    redis_store: RedisStore, raw: aredis.Redis
) -> None:
    room = _room()
    await redis_store.transact(room, appends=[Append("a")])
    for _ in range(3):
        task = asyncio.create_task(redis_store.watch(room, 1, 30))
        addresses: set[str] = set()
        assert await _until_blocked(raw, redis_store, addresses, True)
        assert len(addresses) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not redis_store._busy_watch
        assert await _until_blocked(raw, redis_store, addresses, False)
    # the pool still works, and no stale reply is read by the next waiter
    waiting = asyncio.create_task(redis_store.watch(room, 1, 10))
    await asyncio.sleep(0.1)
    await redis_store.transact(room, appends=[Append("b"), Append("c")])
    assert await asyncio.wait_for(waiting, 5) == 3
    assert redis_store._watchers._value == redis_store._max_watchers


async def test_a_watch_deadline_cancelling_the_read_leaks_nothing(redis_store: RedisStore) -> None:
    room = _room()
    for _ in range(3):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(redis_store.watch(room, 0, 30), 0.1)
    assert not redis_store._busy_watch
    assert redis_store._watchers._value == redis_store._max_watchers
    assert await redis_store.watch(room, 0, 0.05) == 0


async def test_waiters_never_take_the_hot_paths_connections(redis_url: str) -> None:
    store = await open_store(redis_url + "&max_connections=1")
    assert isinstance(store, RedisStore)
    room, other = _room(), _room()
    try:
        first = asyncio.create_task(store.watch(room, 0, 20))
        second = asyncio.create_task(store.watch(other, 0, 20))  # queues: one watch conn
        await asyncio.sleep(0.2)
        for i in range(20):  # the one hot connection stays free for these
            await asyncio.wait_for(store.transact(_room(), writes=[Put("k", i)]), 2)
        await store.transact(room, appends=[Append("wake")])
        await store.transact(other, appends=[Append("wake"), Append("again")])
        assert list(await asyncio.wait_for(asyncio.gather(first, second), 5)) == [1, 2]
    finally:
        await store.close()


async def test_watch_sees_the_sequence_past_a_deleted_or_trimmed_log(
    redis_store: RedisStore,
) -> None:
    room = _room()
    await redis_store.transact(room, appends=[Append("a"), Append("b"), Append("c")])
    assert await redis_store.trim_log(room, 99) == 4  # the newest event stays readable
    assert await redis_store.watch(room, 1, 5) == 3
    waiting = asyncio.create_task(redis_store.watch(room, 3, 10))
    await asyncio.sleep(0.1)
    await redis_store.delete_room(room)  # the log is gone; the waiter keeps waiting
    assert await redis_store.watch(room, 0, 5) == 3
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await redis_store.transact(room, appends=[Append("d")])
    assert await asyncio.wait_for(waiting, 5) == 4


async def test_an_entry_without_an_author_field_reads_as_none(
    redis_store: RedisStore, raw: aredis.Redis
) -> None:
    """Entries written before authors were stored have no ``a`` field: they read back
    with no author, next to new entries that have one; an unnamed author adds no field."""
    room = _room()
    keys = room_keys(redis_store.prefix, room)
    await raw.xadd(keys.log, {"t": "old", "d": "1", "ms": "1000"}, id="1-0")
    await raw.hset(keys.meta, "seq", 1)
    await redis_store.transact(room, appends=[Append("new", 2, author="ann"), Append("anon")])
    events = await redis_store.read_log(room)
    assert [(e.seq, e.type, e.data, e.author) for e in events] == [
        (1, "old", 1, None),
        (2, "new", 2, "ann"),
        (3, "anon", None, None),
    ]
    entries = await raw.xrange(keys.log)
    assert [sorted(_text(f) for f in fields or {}) for _, fields in entries or []][1:] == [
        ["a", "d", "ms", "t"],
        ["d", "ms", "t"],
    ]


async def test_delete_room_leaves_only_the_counters(
    redis_store: RedisStore, raw: aredis.Redis
) -> None:
    room, kept = _room(), _room()
    keys = room_keys(redis_store.prefix, room)
    await redis_store.transact(room, writes=[Put(f"k{i:04}", i) for i in range(2500)])
    await redis_store.transact(
        room,
        writes=[Put("ttl", 1, ttl=60), *(SetAdd(f"set{i}", "m") for i in range(5))],
        appends=[Append("e1"), Append("e2")],
    )
    await redis_store.transact(
        room, writes=[SetAdd("big", f"m{i:05}") for i in range(3000)], appends=[Append("e3")]
    )
    await redis_store.transact(kept, writes=[Put("k0001", "kept"), SetAdd("s", "m")])
    await redis_store.delete_room(room)
    left = [_text(k) async for k in raw.scan_iter(match=keys.meta[:-1] + "*")]
    assert left == [keys.meta]
    meta = {_text(k): _text(v) for k, v in (await raw.hgetall(keys.meta)).items()}
    assert meta["seq"] == "3" and meta["low"] == "4" and int(meta["ver"]) >= 2501
    assert (await redis_store.read(kept, ["k0001"])).value("k0001") == "kept"
    assert await redis_store.set_size(kept, "s") == 1


async def test_the_set_registry_holds_exactly_the_non_empty_sets(
    redis_store: RedisStore, raw: aredis.Redis
) -> None:
    room = _room()
    keys = room_keys(redis_store.prefix, room)

    async def registry() -> set[str]:
        return {_text(m) for m in await raw.smembers(keys.sets)}

    await redis_store.transact(room, writes=[SetAdd("a", "x"), SetAdd("a", "y"), SetAdd("b", "x")])
    assert await registry() == {keys.set + "a", keys.set + "b"}
    await redis_store.set_pick(room, "a", 1)
    await redis_store.transact(room, writes=[SetRemove("a", "x"), SetRemove("b", "nope")])
    assert await registry() == {keys.set + "a", keys.set + "b"}
    await redis_store.transact(room, writes=[SetRemove("a", "y"), SetRemove("b", "x")])
    assert await registry() == set()
    assert await raw.exists(keys.set + "a", keys.set + "b", keys.sets) == 0
    await redis_store.transact(room, writes=[SetAdd("a", "z"), SetRemove("a", "z")])
    assert await raw.exists(keys.set + "a", keys.sets) == 0


async def test_large_picks_go_round_the_set_in_order(redis_store: RedisStore) -> None:
    room = _room()
    members = [f"m{i:05}" for i in range(3000)]
    await redis_store.transact(room, writes=[SetAdd("s", m) for m in reversed(members)])
    assert await redis_store.set_pick(room, "s", 2500) == members[:2500]
    assert await redis_store.set_pick(room, "s", 1000) == members[2500:] + members[:500]
    assert await redis_store.set_pick(room, "s", 3) == members[500:503]


async def test_pick_order_matches_the_reference_backend(redis_store: RedisStore) -> None:
    """Random adds, removes and picks, with members that sort differently by UTF-16
    or by locale than by code point."""
    room, memory = _room(), MemoryStore()
    members = [
        "a",
        "B",
        "aa",
        "a b",
        "é",
        "e\u0301",
        "日本",
        "\uff5a",
        "\uffff",
        "\U00010000",
        "😀",
    ]
    rnd = random.Random(20240611)
    for step in range(400):
        choice = rnd.random()
        if choice < 0.45:
            count = rnd.randint(1, 6)
            got = await redis_store.set_pick(room, "s", count)
            assert got == await memory.set_pick(room, "s", count), step
        else:
            ops = [
                (SetAdd if rnd.random() < 0.6 else SetRemove)("s", rnd.choice(members))
                for _ in range(rnd.randint(1, 3))
            ]
            for store in (redis_store, memory):
                await store.transact(room, writes=ops)
        assert await redis_store.set_size(room, "s") == await memory.set_size(room, "s")


# ------------------------------------------------------------------------ the wire


async def test_concurrent_calls_pipeline_on_one_connection_and_each_gets_its_own_reply(
    redis_store: RedisStore,
) -> None:
    """200 concurrent transacts are all written before the first reply is read, on the
    one connection of the hot path, in two writes (the first alone, the rest at the end
    of the turn), and each caller gets the reply to its own command (its own key's
    version, its own event's number)."""
    room = _room()
    await redis_store.read(room, [])  # dialled
    wire = redis_store._wire
    assert wire is not None
    tasks = [
        asyncio.create_task(
            redis_store.transact(room, writes=[Put(f"k{i}", i)], appends=[Append("e", i)])
        )
        for i in range(200)
    ]
    writes = wire.writes
    await asyncio.sleep(0)  # each task runs to its write
    assert wire.pending == 200
    await asyncio.sleep(0)  # the end of the turn: the commands after the first go out
    assert wire.writes - writes == 2
    results = await asyncio.gather(*tasks)
    assert redis_store._wire is wire and wire.pending == 0
    snap = await redis_store.read(room, [f"k{i}" for i in range(200)])
    events = {e.seq: e.data for e in await redis_store.read_log(room, 0, 500)}
    for i, result in enumerate(results):
        assert result.versions == {f"k{i}": snap.version(f"k{i}")}
        assert events[result.seqs[0]] == i
    assert sorted(events) == list(range(1, 201))


async def test_an_error_reply_in_a_pipeline_reaches_only_its_caller(
    redis_store: RedisStore, raw: aredis.Redis
) -> None:
    """A room whose meta key holds the wrong type makes the server answer its scripts
    with an error; the other room's commands pipelined with them get their replies."""
    broken, fine = _room(), _room()
    await raw.set(room_keys(redis_store.prefix, broken).meta, "not a hash")
    outcomes = await asyncio.gather(
        *(
            redis_store.transact(broken if i % 2 else fine, writes=[Put(f"k{i}", i)])
            for i in range(20)
        ),
        return_exceptions=True,
    )
    for i, outcome in enumerate(outcomes):
        if i % 2:
            assert isinstance(outcome, StoreUnavailable)
            assert "WRONGTYPE" in str(outcome.__cause__)
        else:
            assert not isinstance(outcome, BaseException)
    snap = await redis_store.read(fine, [f"k{i}" for i in range(0, 20, 2)])
    assert len(snap.records) == 10
    await raw.delete(room_keys(redis_store.prefix, broken).meta)


async def test_a_caller_that_gives_up_leaves_the_pipeline_in_step(
    redis_store: RedisStore,
) -> None:
    """Cancelling callers whose replies are still to come fails none of the others: the
    replies of the cancelled ones are read and dropped, so every later caller still
    gets its own."""
    room = _room()
    tasks = [
        asyncio.create_task(redis_store.transact(room, writes=[Put(f"k{i}", i)])) for i in range(50)
    ]
    await asyncio.sleep(0)
    for task in tasks[1::3]:
        task.cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    kept = [i for i, o in enumerate(done) if not isinstance(o, BaseException)]
    assert set(kept) >= {i for i in range(50) if i % 3 != 1}
    for i in range(20):  # the connection still answers in order
        result = await redis_store.transact(room, writes=[Put(f"again{i}", i)])
        assert list(result.versions) == [f"again{i}"]


async def test_a_missing_script_is_loaded_again_and_the_call_goes_through(
    redis_store: RedisStore, raw: aredis.Redis
) -> None:
    """After SCRIPT FLUSH (a restart or failover does the same) the next calls get
    NOSCRIPT on the wire, load their script again and succeed (also those of a call over
    many rooms, each sent again alone)."""
    room = _room()
    await redis_store.transact(room, writes=[Put("before", 1)])
    await raw.script_flush()
    pages = await redis_store.scan_rooms([room, room + "-none", room], "b", 5)
    assert [[r.value for r in p.records] for p in pages] == [[1], [], [1]]
    await raw.script_flush()
    glances = await redis_store.glance([room, room + "-none"], ["before"])
    assert [g.snapshot.value("before") for g in glances] == [1, None]
    results = await asyncio.gather(
        *(redis_store.transact(room, writes=[Put(f"k{i}", i)]) for i in range(5))
    )
    assert [list(r.versions) for r in results] == [[f"k{i}"] for i in range(5)]
    assert (await redis_store.read(room, ["k4"])).value("k4") == 4


BUSY = """
local start = redis.call('TIME')
local t0 = start[1] * 1000000 + start[2]
while true do
    local now = redis.call('TIME')
    if now[1] * 1000000 + now[2] - t0 > tonumber(ARGV[1]) then return 1 end
end
"""


async def test_a_pipeline_cut_off_by_its_deadline_fails_every_caller(
    redis_url: str, raw: aredis.Redis
) -> None:
    """The server stalls (a busy script) past the store's deadline while calls wait for
    their replies: every caller gets ``StoreUnavailable`` (outcome unknown), none waits
    forever, the connection that stopped answering is dropped, and the store works
    again afterwards on a new one."""
    async with _with_deadline(redis_url, 0.3) as (store, room):
        stalled = store._wire
        assert stalled is not None
        stall = asyncio.ensure_future(raw.eval(BUSY, 0, 800_000))
        await asyncio.sleep(0.05)
        calls = [
            asyncio.create_task(store.transact(room, writes=[Put(f"k{i}", i)])) for i in range(6)
        ]
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 3)
        assert all(isinstance(o, StoreUnavailable) for o in outcomes), outcomes
        assert not stalled.usable
        await stall
        assert (await store.transact(room, writes=[Put("after", 1)])).versions
        assert store._wire is not stalled


async def test_a_wire_that_keeps_answering_outlives_its_deadline(redis_url: str) -> None:
    """The deadline is per reply, not per connection: calls answered in time, back to
    back or after an idle spell, for longer than the deadline, keep the one wire."""
    async with _with_deadline(redis_url, 0.2) as (store, room):
        wire = store._wire
        assert wire is not None and wire.deadline == 0.2
        until = time.monotonic() + 0.6
        while time.monotonic() < until:
            await store.read(room, ["k"])
        await asyncio.sleep(0.3)  # idle past the deadline: nothing is late
        await asyncio.gather(*(store.read(room, ["k"]) for _ in range(50)))
        assert store._wire is wire and wire.usable
        await asyncio.sleep(0.45)  # the timer fires once more, finds nothing waiting...
        assert wire._watchdog is None and wire.usable  # ...and is not armed again


@contextlib.asynccontextmanager
async def _with_deadline(redis_url: str, seconds: float) -> AsyncIterator[tuple[RedisStore, str]]:
    """A store whose replies are due within ``seconds``, and a room with one record."""
    store = await open_store(f"{redis_url}&socket_timeout={seconds}")
    assert isinstance(store, RedisStore)
    room = _room()
    try:
        await store.transact(room, writes=[Put("k", 0)])
        yield store, room
    finally:
        await store.close()


async def test_a_connection_the_server_drops_is_dialled_again(
    redis_store: RedisStore, raw: aredis.Redis
) -> None:
    """CLIENT KILL of the hot path's connection: the wire notices, and the next call
    dials a new one and succeeds."""
    room = _room()
    await redis_store.transact(room, writes=[Put("k", 0)])
    wire = redis_store._wire
    assert wire is not None and wire._transport is not None
    host, port = wire._transport.get_extra_info("sockname")[:2]
    assert await raw.client_kill(f"{host}:{port}")
    await asyncio.wait_for(wire.wait_closed(), 5)
    assert not wire.usable
    assert (await redis_store.transact(room, writes=[Put("k", 1)])).versions == {"k": 2}
    assert redis_store._wire is not wire and redis_store._wire is not None
    assert redis_store._wire.usable


async def test_calls_after_close_fail_and_dial_nothing(redis_url: str) -> None:
    store = await open_store(redis_url)
    assert isinstance(store, RedisStore)
    await store.transact(_room(), writes=[Put("k", 0)])
    await store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await store.read(_room(), ["k"])
    assert store._wire is not None and not store._wire.usable


@contextlib.asynccontextmanager
async def _redis_server(directory: Path, *options: str) -> AsyncIterator[int]:
    """A redis-server of this test's own on a free port, with ``options``: the port.
    Only the process started here is stopped."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server (the binary, to start a private server)")
        raise AssertionError("unreachable")
    port = free_port()
    listen = ["--port", str(port)]
    if "--tls-port" in options:  # TLS only: the port given is the TLS one
        listen = ["--port", "0", "--tls-port", str(port)]
        options = tuple(o for o in options if o != "--tls-port")
    process = await asyncio.create_subprocess_exec(
        binary, *listen, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", str(directory), *options,
        stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)
            else:
                writer.close()
                break
        yield port
    finally:
        process.terminate()
        await process.wait()


@pytest.fixture
async def private_redis(tmp_path: Path) -> AsyncIterator[int]:
    """A private redis-server with a password: its port."""
    async with _redis_server(tmp_path, "--requirepass", "s3cret") as port:
        yield port


async def test_the_wire_authenticates_selects_the_database_and_names_itself(
    private_redis: int,
) -> None:
    """The URL's password, database number and client name apply to the hot path's
    connection as to redis-py's; a wrong password fails ``open`` with
    ``StoreUnavailable``."""
    base = f"redis://:s3cret@127.0.0.1:{private_redis}/3?client_name=agentrooms-test&prefix=p"
    store = await open_store(base)
    assert isinstance(store, RedisStore)
    try:
        await store.transact("room", writes=[Put("k", 7)])
        raw = aredis.Redis(host="127.0.0.1", port=private_redis, password="s3cret", db=3)
        try:
            assert [key async for key in raw.scan_iter("p*")]  # in database 3
            clients = await raw.client_list()
            assert "agentrooms-test" in {c["name"] for c in clients}
        finally:
            await raw.aclose()
    finally:
        await store.close()
    with pytest.raises(StoreUnavailable, match=r"WRONGPASS|invalid"):
        await open_store(base.replace("s3cret", "wrong"))


async def _serve_once(reply: bytes) -> tuple[asyncio.Server, int]:
    """A TCP server that answers anything it is sent with ``reply``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(reply)
        await writer.drain()
        await reader.read(100)  # until the client closes
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("reply", [b"?not resp\r\n", b"+OK\r\n+OK\r\n"], ids=["garbage", "unasked"])
async def test_a_server_that_breaks_the_protocol_fails_the_wire(reply: bytes) -> None:
    """A reply that is not RESP, or one more reply than was asked for: the caller gets
    ``ConnectionError`` and the wire is closed, never left out of step."""
    server, port = await _serve_once(reply)
    try:
        _, wire = await asyncio.get_running_loop().create_connection(Wire, "127.0.0.1", port)
        future = wire.call(pack_command("PING"))
        if reply.startswith(b"?"):
            with pytest.raises(ConnectionError, match="not RESP"):
                await future
        else:
            assert await future == b"OK"
        await wire.wait_closed()
        assert not wire.usable and wire.error is not None
        with pytest.raises(ConnectionError):
            wire.call(pack_command("PING"))
    finally:
        server.close()
        await server.wait_closed()


async def test_closing_the_store_under_a_waiting_follower_leaves_no_unseen_error(
    redis_url: str,
) -> None:
    """A watch waiting on its wire when the store closes fails with ``StoreUnavailable``;
    the reply queued behind its XREAD fails too, and that error is marked seen (asyncio
    would log 'Future exception was never retrieved' otherwise)."""
    store = await open_store(redis_url)
    assert isinstance(store, RedisStore)
    waiting = asyncio.create_task(store.watch(_room(), 0, 30))
    for _ in range(500):  # until the watch waits on its wire
        if store._busy_watch:
            break
        await asyncio.sleep(0.01)
    (wire,) = store._busy_watch
    futures = list(wire._waiting)
    assert len(futures) == 2
    await store.close()
    with pytest.raises(StoreUnavailable):
        await waiting
    for future in futures:
        assert future.done()
        assert future.cancelled() or not future._log_traceback


async def test_the_wire_speaks_tls_and_checks_the_servers_certificate(tmp_path: Path) -> None:
    """``rediss://`` with the URL's ``ssl_*`` parameters: the hot path and the watch
    wires connect over TLS, verifying the server against the given CA; a client that
    trusts another CA cannot open the store."""
    openssl = shutil.which("openssl")
    if openssl is None:
        unavailable("openssl (the binary, to make a test certificate)")
    cert, key, other = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "other.pem"
    for certificate, private in ((cert, key), (other, tmp_path / "other-key.pem")):
        made = await asyncio.create_subprocess_exec(
            str(openssl), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(private), "-out", str(certificate),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        assert await made.wait() == 0
    tls = ("--tls-port", "--tls-cert-file", str(cert), "--tls-key-file", str(key))
    async with _redis_server(tmp_path, *tls, "--tls-auth-clients", "no") as port:
        url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={cert}&prefix=t"
        store = await open_store(url)
        try:
            room = _room()
            waiting = asyncio.create_task(store.watch(room, 0, 10))  # a watch wire, TLS too
            await asyncio.sleep(0.05)
            await store.transact(room, writes=[Put("k", 1)], appends=[Append("e")])
            assert await asyncio.wait_for(waiting, 5) == 1
            assert (await store.read(room, ["k"])).value("k") == 1
        finally:
            await store.close()
        with pytest.raises(StoreUnavailable, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
            await open_store(url.replace(str(cert), str(other)))
