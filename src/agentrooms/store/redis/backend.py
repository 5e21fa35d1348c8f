"""The Redis backend: every operation is one Lua script, run atomically by the server.

Open with ``redis://host:port/db?prefix=NAME`` (or ``rediss://`` for TLS). ``prefix``
(default ``ar``) namespaces every key, so deployments and test runs can share a server;
the other query parameters go to redis-py. The key layout is in
:mod:`agentrooms.store.redis.keys`; each script's KEYS, ARGV and reply are documented at
the top of its ``.lua`` file next to this module.

Round trips: one per call (two for a ``watch`` that waits). ``read``, ``transact``,
``scan``, ``read_log``, ``trim_log``, ``set_pick`` and ``delete_room`` are one EVALSHA each,
``last_seq`` one HGET, ``set_size`` one ZCARD; ``glance``, ``scan_rooms`` and
``scan_keys`` one EVALSHA over every room (on a cluster one per room, all in one write
per node: :meth:`RedisStore._run_many`). ``watch`` is one HGET when the
log is already past ``after`` (or the timeout is 0), else that and then a pipelined
``XREAD BLOCK`` and ``HGET`` on a watch connection (see :meth:`RedisStore._watch`). The
scripts are loaded when the store is opened; if the server forgets them (restart, failover,
SCRIPT FLUSH) the next call loads its script again and retries, once.

Time is the server's: each script reads ``TIME`` and judges expiry by it. The fencing
token of a value is computed here with :func:`~agentrooms.store.types.fence_of` when it is
written and stored beside the value, so a fence compare is exact for any integer and the
script never decodes JSON.

Connections. Every command of the contract goes over agentrooms' own connection
(:mod:`.wire`: RESP written on an ``asyncio.Protocol``, parsed by hiredis), not redis-py's
asyncio client, which costs twice the client CPU per command. The URL's connection
parameters (address, TLS, username and password, ``db``, ``client_name``) apply to it as
redis-py would apply them; redis-py itself only serves ``info`` (CONFIG GET, INFO).

* The hot path is one pipelined connection, the *wire*: a call never waits for another's
  reply before sending, and Redis answers in order (:meth:`RedisStore._send`). A call
  made while nothing is in flight is written at once; calls made while others are in
  flight go out together at the end of the event loop's turn, in one write. Concurrent
  callers share one connection, one write per turn and one read per burst of replies.
* Each reply is due within ``timeout`` (default 5 s) of its command, and a dial that a
  call needs first within ``connect_timeout`` (default: ``timeout``); redis-py's names
  ``socket_timeout`` and ``socket_connect_timeout`` say the same. A wire
  whose reply does not come in time is closed (one timer per wire, not one per call) and
  the next call dials a new one; every call waiting on it fails at once. Every failure
  is ``StoreUnavailable`` with the cause chained, outcome unknown: nothing is retried
  here (a retried EVALSHA could apply a transact twice), the caller retries its
  idempotent command.
* Blocking reads (a ``watch`` or ``follow_log`` that waits: :mod:`.watching`) each take
  a *watch wire* of their own, idle or dialled, so waiters never hold up the hot path,
  and a connection left mid-BLOCK never serves anything else: it is closed unless both
  replies were read. At most ``max_connections`` (default 100) at once; waiters beyond
  that queue, their queueing counted against their own timeout. The read is bounded by
  the watch's timeout plus ``timeout``.

Replica acknowledgement. With ``?wait=N`` (and ``wait_timeout``, milliseconds), every
script that may write is followed by ``WAIT N wait_timeout`` in the same write on the same
connection; fewer than ``N`` acknowledgements is :class:`ReplicasBehind`, a
``StoreUnavailable``: the write was applied but a failover could lose it (outcome
unknown). Without it, replication is asynchronous and a failover can lose acknowledged
writes, fencing counters included (docs/scaling.md). A cluster is
:mod:`.cluster`; a plain URL to a cluster node is a ``BadRequest`` at open, and a
``MOVED`` or ``ASK`` reply one at once.

URL parameters: ``prefix``, ``timeout``, ``connect_timeout``, ``wait``, ``wait_timeout``
and the redis-py ones
agentrooms' connections apply (:data:`~agentrooms.store.redis.config.PARAMETERS`); any
other is a ``BadRequest`` at open, naming it and the accepted ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self, TypeVar

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError, ResponseError

from agentrooms.errors import (
    BadRequest,
    CursorCompacted,
    StoreUnavailable,
)
from agentrooms.store.base import seen
from agentrooms.store.redis import scripts
from agentrooms.store.redis.config import replica_wait, timeouts
from agentrooms.store.redis.durability import judge
from agentrooms.store.redis.keys import redact_url, room_keys, split_url
from agentrooms.store.redis.watching import WatchReads
from agentrooms.store.redis.wire import (
    Arg,
    Wire,
    dial,
    pack_command,
    pack_evalsha,
    unavailable,
)
from agentrooms.store.types import (
    Event,
    Glance,
    KeyPage,
    Limits,
    Prepared,
    ScanPage,
    Snapshot,
    StoreInfo,
    TransactResult,
)

T = TypeVar("T")


# ------------------------------------------------------------------------- the store


class ReplicasBehind(StoreUnavailable):
    """A write was applied by the primary but fewer replicas than the URL's ``wait``
    acknowledged it in time: a failover now could lose it (outcome unknown)."""


class RedisStore(WatchReads):
    backend = "redis"
    shared_by_url = True

    def __init__(self, url: str, limits: Limits | None = None) -> None:
        super().__init__(url, limits)
        driver_url, self.prefix = split_url(url)
        driver_url, self.timeout, self.connect_timeout = timeouts(driver_url)
        self.wait_replicas, self.wait_ms = replica_wait(url, self.timeout)
        try:
            options: dict[str, Any] = dict(parse_url(driver_url))
        except ValueError as exc:
            raise BadRequest(f"not a usable Redis URL {redact_url(url)!r}: {exc}") from exc
        options["socket_connect_timeout"] = self.connect_timeout
        # ours, whatever the URL says: one deadline per call, no retries, bytes replies
        options.update(socket_timeout=None, retry=Retry(NoBackoff(), 0), decode_responses=False)
        pool = ConnectionPool(**options)
        try:  # connections are made lazily: check the URL's parameters now (no IO)
            self._options = pool.connection_class(**pool.connection_kwargs)  # see wire.dial
        except TypeError as exc:
            raise BadRequest(f"unknown parameter in Redis URL {redact_url(url)!r}: {exc}") from exc
        self._redis: Redis = Redis.from_pool(pool)  # INFO and CONFIG only
        self._wire: Wire | None = None  # the hot path's connection: see _send
        self._dialing: asyncio.Task[Wire] | None = None
        self._closed = False
        self._init_watchers(pool.max_connections)  # blocking reads only: see .watching

    @classmethod
    async def open(cls, url: str, limits: Limits | None = None) -> Self:
        store = cls(url, limits)
        try:  # pipelined: one round trip
            await asyncio.gather(store._load_scripts(), store._refuse_cluster())
        except BaseException:
            await store.close()
            raise
        return store

    async def _call(self, command: Callable[..., Awaitable[T]], *args: Any) -> T:
        """The one seam between agentrooms and redis-py (see the module docstring)."""
        try:
            async with asyncio.timeout(self.timeout):
                return await command(*args)
        except (RedisError, OSError) as exc:  # a timeout is an OSError too
            raise unavailable(exc) from exc

    async def _refuse_cluster(self) -> None:
        """``BadRequest`` if the server is a Redis Cluster node (``INFO cluster``): most
        rooms would meet ``MOVED`` there, after other rooms' writes had landed."""
        try:
            reply = await self._send(pack_command("INFO", "cluster"))
        except ResponseError:  # INFO renamed or disabled: MOVED is still refused per call
            return
        except (RedisError, OSError) as exc:
            raise unavailable(exc) from exc
        if b"cluster_enabled:1" in reply:
            raise BadRequest(
                f"redis: {redact_url(self.url)} is a Redis Cluster node: open the store with "
                "a redis+cluster://host:port,host:port/ URL (cluster mode)"
            )

    async def _load_scripts(self) -> None:
        """SCRIPT LOAD every script, pipelined (the first call dials the wire: a wrong
        address or password fails the store's ``open``)."""
        shas = await asyncio.gather(
            *(self._command("SCRIPT", "LOAD", script.text) for script in scripts.SCRIPTS)
        )
        for script, sha in zip(scripts.SCRIPTS, shas, strict=True):
            if scripts.text(sha) != script.sha:
                raise StoreUnavailable(f"redis loaded {script.name}.lua as {sha}, not {script.sha}")

    async def _run(
        self,
        script: scripts.Script,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        route: Arg | None = None,
    ) -> Any:
        """Run ``script`` (one EVALSHA, routed by ``route`` or else its first key),
        loading it again if the server has forgotten it; a writing script is followed by
        ``WAIT`` when the URL asks for replica acknowledgements."""
        command = pack_evalsha(script.sha, keys, args)
        if route is None and keys:
            route = keys[0]
        wait = bool(self.wait_replicas) and script in scripts.WRITES
        try:
            try:
                return await self._send(command, route, wait)
            except NoScriptError:
                await self._send(pack_command("SCRIPT", "LOAD", script.text), route)
                return await self._send(command, route, wait)
        except (RedisError, OSError) as exc:  # a timeout is an OSError too
            raise unavailable(exc) from exc

    async def _command(self, *args: Arg, route: Arg | None = None) -> Any:
        """Any other command on the wire (routed by ``route``, its key), its errors ours
        (as :meth:`_run`'s)."""
        try:
            return await self._send(pack_command(*args), route)
        except (RedisError, OSError) as exc:
            raise unavailable(exc) from exc

    async def _run_many(
        self, script: scripts.Script, calls: Sequence[tuple[Sequence[Arg], Sequence[Arg]]]
    ) -> list[Any]:
        """A read-only ``script`` once per ``(keys, args)``, routed by each call's first
        key, all in one write (:meth:`_pipeline`): one round trip. A call answered with an
        error (the server forgot the script, a cluster redirect) is sent again alone by
        :meth:`_run`, which deals with it; running a read-only script twice is harmless."""
        assert script not in scripts.WRITES  # a writing one would need WAIT, and no resend
        commands = [pack_evalsha(script.sha, keys, args) for keys, args in calls]
        try:
            replies = await self._pipeline(commands, [keys[0] for keys, _ in calls])
        except (RedisError, OSError) as exc:  # a timeout is an OSError too
            raise unavailable(exc) from exc
        return [
            await self._run(script, *call) if isinstance(reply, ResponseError) else reply
            for call, reply in zip(calls, replies, strict=True)
        ]

    async def _pipeline(self, commands: list[list[bytes]], routes: list[Arg]) -> list[Any]:
        """``commands`` in one write on the wire, their replies in order, an error reply
        as its ``ResponseError`` (``routes``: each command's key, for a cluster). A broken
        connection raises (every outcome unknown)."""
        wire = self._wire
        if wire is None or not wire.usable:
            wire = await self._redial()
        futures = wire.send([part for command in commands for part in command], len(commands))
        replies = await asyncio.gather(*futures, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException) and not isinstance(reply, ResponseError):
                raise reply
        return replies

    def _wait_command(self) -> list[bytes]:
        return pack_command("WAIT", self.wait_replicas, self.wait_ms)

    async def _call_waiting(self, wire: Wire, command: list[bytes]) -> Any:
        """``command`` and ``WAIT`` in one write on ``wire``: the command's reply, or
        :class:`ReplicasBehind` when fewer replicas than asked acknowledged it in time
        (``WAIT`` counts every write sent before it on the connection)."""
        reply, acks = wire.send([*command, *self._wait_command()], 2)
        try:
            answer = await reply
        except BaseException:
            seen(acks)
            raise
        acked = await acks
        if acked < self.wait_replicas:
            raise ReplicasBehind(
                f"redis: the write was applied but only {acked} of {self.wait_replicas} "
                f"replicas acknowledged it within {self.wait_ms} ms (the URL's wait and "
                "wait_timeout): a failover could still lose it, so its outcome is unknown"
            )
        return answer

    async def _send(
        self, command: list[bytes], route: Arg | None = None, wait: bool = False
    ) -> Any:
        """One command on the wire (:mod:`.wire`), its reply within the store's deadline
        (and a dial first, if needed, within ``connect_timeout``). Concurrent
        calls pipeline on the one connection (written at once, or with the other calls of
        their event-loop turn), and Redis answers them in order.

        If the deadline passes with a reply still to come, the wire closes itself and
        the next call dials a new one: a connection that stopped answering is replaced
        rather than waited on by every later call. Every caller waiting on it fails with
        ``ConnectionError`` (outcome unknown), as on any broken connection."""
        wire = self._wire
        if wire is None or not wire.usable:
            wire = await self._redial()  # bounded by the dial's own deadline
        if wait:
            return await self._call_waiting(wire, command)
        return await wire.call(command)

    async def _redial(self) -> Wire:
        """A new wire: one dial, shared by every caller that needs it meanwhile (one
        that gives up does not cancel it for the others)."""
        if self._closed:
            raise ConnectionError("the Redis store is closed")
        if self._dialing is None or self._dialing.done():
            self._dialing = asyncio.get_running_loop().create_task(self._dial())
            self._dialing.add_done_callback(seen)
        return await asyncio.shield(self._dialing)

    async def _dial(self) -> Wire:
        try:
            async with asyncio.timeout(self.connect_timeout):
                wire = await dial(self._options, self.timeout)
        except TimeoutError as exc:
            raise ConnectionError(
                f"no connection within {self.connect_timeout:g} s (the URL's connect_timeout)"
            ) from exc
        if self._closed:  # closed while dialling
            wire.close()
            raise ConnectionError("the Redis store is closed")
        self._wire = wire
        return wire

    # -- the contract --------------------------------------------------------------

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        rk = room_keys(self.prefix, room)
        base = rk.record
        reply = await self._run(scripts.READ, [base + k for k in keys], (), rk.meta)
        found = {}
        for i, key in enumerate(keys, 1):
            version = reply[3 * i - 2]
            if version is not None:
                found[key] = scripts.record(key, version, reply[3 * i - 1], reply[3 * i])
        return Snapshot(found, reply[0] / 1000.0)

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        """One ``glance_rooms.lua`` EVALSHA for every room: one round trip, and one script
        run on the server, not one per room (a cluster runs it per room)."""
        names = scripts.glance_args(self.prefix, rooms, keys, sets)
        reply = await self._run(scripts.GLANCE_ROOMS, names, [len(sets), len(keys)])
        return scripts.glances(rooms, keys, sets, reply)

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        meta, scan, log, base, set_base, registry = room_keys(self.prefix, room)
        compares, set_ops = ops.compares, ops.set_ops
        keys = [meta, scan, log]
        args: list[Arg] = [len(compares), len(set_ops)]
        for c in compares:
            keys.append(base + c.key)
            args.append(scripts.compare_arg(c))
        puts = []
        for w in ops.writes:
            keys.append(base + w.key)
            if w.value_json is None:
                args += (w.key, "", "")
            else:
                puts.append(w.key)
                args += (w.key, w.value_json, scripts.put_options(w))
        if set_ops:
            for op in set_ops:
                keys.append(set_base + op.name)
                args.append(scripts.set_op_arg(op.add, op.member))
            keys.append(registry)
        appends = ops.appends
        for a in appends:
            args += (a.type, a.data_json, a.author or "", a.to_json or "")
        reply = await self._run(scripts.TRANSACT, keys, args)
        if reply[0] != 0:
            raise scripts.failure(compares, reply)
        first_version = reply[2] - len(puts) + 1
        last_seq = reply[3]
        return TransactResult(
            {key: first_version + i for i, key in enumerate(puts)},
            list(range(last_seq - len(appends) + 1, last_seq + 1)),
            reply[1] / 1000.0,
        )

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        (page,) = await self._scan_rooms([room], prefix, after, limit)
        return page

    async def _scan_rooms(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[ScanPage]:
        """One ``scan_rooms.lua`` EVALSHA for every room (a cluster runs it per room)."""
        keys, args = scripts.scan_args(self.prefix, rooms, prefix, after, limit)
        reply = await self._run(scripts.SCAN_ROOMS, keys, args)
        return [scripts.scan_page(page, reply[0]) for page in reply[1:]]

    async def _scan_keys(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[KeyPage]:
        """One ``scan_rooms.lua`` EVALSHA for every room, without the values (a cluster
        runs it per room)."""
        keys, args = scripts.scan_args(self.prefix, rooms, prefix, after, limit, values=False)
        reply = await self._run(scripts.SCAN_ROOMS, keys, args)
        return [scripts.key_page(page) for page in reply[1:]]

    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]:
        keys = room_keys(self.prefix, room)
        args = [min(after, scripts.MAX_SEQ), limit]
        status, body = await self._run(scripts.READ_LOG, [keys.meta, keys.log], args)
        if status == 0:
            raise CursorCompacted(room, after, body)
        return [scripts.event(eid, fields) for eid, fields in body]

    async def _trim_log(self, room: str, before: int) -> int:
        keys = room_keys(self.prefix, room)
        low: int = await self._run(
            scripts.TRIM_LOG, [keys.meta, keys.log], [min(before, scripts.MAX_SEQ)]
        )
        return low

    async def _last_seq(self, room: str) -> int:
        meta = room_keys(self.prefix, room).meta
        seq = await self._command("HGET", meta, "seq", route=meta)
        return 0 if seq is None else int(seq)

    async def _set_pick(self, room: str, name: str, count: int) -> list[str]:
        keys = room_keys(self.prefix, room)
        picked = await self._run(scripts.SET_PICK, [keys.meta, keys.set + name], [count])
        return [member.decode() for member in picked]

    async def _set_size(self, room: str, name: str) -> int:
        key = room_keys(self.prefix, room).set + name
        size: int = await self._command("ZCARD", key, route=key)
        return size

    async def _delete_room(self, room: str) -> None:
        keys = room_keys(self.prefix, room)
        await self._run(
            scripts.DELETE_ROOM, [keys.meta, keys.scan, keys.log, keys.sets], [keys.record]
        )

    async def _info(self) -> StoreInfo:
        config, version = await self._call(self._settings)
        durability, warnings = judge(config)
        return StoreInfo(
            backend=self.backend,
            url=redact_url(self.url),
            durability=durability,
            warnings=warnings,
            details={
                "prefix": self.prefix,
                "redis_version": version,
                "timeout": self.timeout,
                "connect_timeout": self.connect_timeout,
                "wait": (
                    f"WAIT {self.wait_replicas} replicas, {self.wait_ms} ms, after each write"
                    if self.wait_replicas
                    else "off: writes are acknowledged before any replica has them"
                ),
                "clock": "the Redis server's clock (TIME, read by each script)",
                **config,
            },
        )

    async def _settings(self) -> tuple[dict[str, str], str | None]:
        """Persistence and eviction settings (CONFIG GET; INFO when CONFIG is disabled)."""
        config: dict[str, str] = {}
        try:
            for pattern in ("append*", "save", "maxmemory-policy"):
                got = await self._redis.config_get(pattern)
                config.update({scripts.text(k): scripts.text(v) for k, v in got.items()})
        except ResponseError:  # CONFIG renamed or disabled, as managed services do
            config.clear()
            persistence = await self._redis.info("persistence")
            config["aof_enabled"] = scripts.text(persistence.get("aof_enabled", ""))
        server = await self._redis.info("server")
        version = server.get("redis_version")
        return config, None if version is None else scripts.text(version)

    async def _close(self) -> None:
        self._closed = True
        try:
            await self._call(self._redis.aclose)
        finally:
            for idle in [*self._idle_watch, *self._busy_watch]:
                idle.close()
            self._idle_watch.clear()
            wire = self._wire
            if wire is not None:  # calls still waiting fail: their outcome is unknown
                wire.close()
                await wire.wait_closed()
