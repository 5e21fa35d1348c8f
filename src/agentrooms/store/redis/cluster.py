"""The Redis backend on a Redis Cluster: ``redis+cluster://h1:p1,h2:p2/?prefix=NAME``.

The same scripts and key layout as :mod:`.backend` (every key of a room shares the hash
slot of its tag ``{<prefix>:<room>}``, so each script touches one slot), routed by room:

* The slot map comes from ``CLUSTER SLOTS``, asked of the URL's nodes (any one that
  answers) when the store is opened. Each primary gets a :class:`~.backend.RedisStore`
  of its own, used only for its connections: one pipelined wire for the hot path and its
  own watch wires, dialled lazily. Every call goes to the one primary that owns its
  room's slot (``CRC16`` of the tag): one node per store call, one round trip. A call
  over many rooms (``glance``, ``scan_rooms``) sends one write to each primary that owns
  some of them, all at once.
* Scripts are loaded on every primary at open; a primary that does not know a script
  (a replica promoted by a failover, a new node) gets it loaded on ``NOSCRIPT``, as on
  one server.
* ``MOVED``: the slot is pointed at the node named, the map is fetched again in the
  background, and the call goes to the new node. ``ASK``: the call is sent once to the
  node named, after ``ASKING``. ``TRYAGAIN`` and ``CLUSTERDOWN``: the call is sent
  again after a short backoff, within the URL's ``timeout``. A redirect or refusal means
  the server did nothing, so these retries are safe; at most :data:`MAX_REDIRECTS`, then
  ``StoreUnavailable``.
* A connection that breaks mid-call is ``StoreUnavailable``, outcome unknown, as on one
  server, and the slot map is fetched again (a failover moves the slots to a replica);
  the caller retries its idempotent command.
* ``?wait=N`` (and ``wait_timeout``) sends ``WAIT`` after every write on the primary that
  took it (see :mod:`.backend`): fewer acknowledgements are an unknown outcome.

Only database 0 exists on a cluster. Blocking reads (``watch``, ``follow_log``) wait on
the primary that owns the room. What is not done: the records the room layer keeps in
one room of its own (the room registry, tokens) live on that room's one node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Self
from urllib.parse import parse_qsl

from redis.crc import key_slot
from redis.exceptions import RedisError, ResponseError

from agentrooms.errors import BadRequest, StoreUnavailable
from agentrooms.store.base import Store, seen
from agentrooms.store.redis import scripts
from agentrooms.store.redis.backend import RedisStore, ReplicasBehind
from agentrooms.store.redis.durability import judge
from agentrooms.store.redis.keys import redact_url
from agentrooms.store.redis.wire import Arg, pack_command
from agentrooms.store.types import Glance, KeyPage, Limits, ScanPage, StoreInfo

__all__ = ["MAX_REDIRECTS", "RedisClusterStore", "Shard", "slot_of"]

MAX_REDIRECTS = 5
"""Redirects and refusals (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``) one call
follows before it fails with ``StoreUnavailable``."""

SLOTS = 16384

Address = tuple[str, int]


@lru_cache(maxsize=8192)
def slot_of(key: Arg) -> int:
    """The hash slot of ``key`` (CRC16 of its hash tag, as Redis Cluster computes it)."""
    return int(key_slot(key.encode() if isinstance(key, str) else str(key).encode()))


class Shard:
    """One primary, the slot ranges it serves and its replicas (``CLUSTER SLOTS``)."""

    __slots__ = ("health", "primary", "ranges", "replicas")

    def __init__(self, primary: Address, replicas: list[Address]) -> None:
        self.primary = primary
        self.replicas = replicas
        self.ranges: list[tuple[int, int]] = []
        self.health: dict[Address, str] = {}  # a replica's, when not "online"

    def describe(self) -> str:
        slots = ", ".join(f"{a}-{b}" for a, b in self.ranges)
        replicas = (
            ", ".join(
                f"{h}:{p}" + (f" ({self.health[h, p]})" if (h, p) in self.health else "")
                for h, p in self.replicas
            )
            or "none"
        )
        return f"primary {self.primary[0]}:{self.primary[1]} slots {slots}; replicas {replicas}"


def split_cluster_url(url: str) -> tuple[str, str, list[Address], str]:
    """``(scheme for one node, user info with its "@" or "", seed addresses, query)``
    from ``redis+cluster://[user:password@]h1:p1,h2:p2[/0][?query]``."""
    scheme, _, rest = url.partition("://")
    node_scheme = "rediss" if scheme.lower().startswith("rediss") else "redis"
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if path.strip("/") not in ("", "0"):
        raise BadRequest(f"a Redis Cluster has only database 0, not {path!r}")
    if "db" in dict(parse_qsl(query)) and dict(parse_qsl(query))["db"] != "0":
        raise BadRequest("a Redis Cluster has only database 0")
    seeds: list[Address] = []
    for part in hosts.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon:
            host, port = port, "6379"
        if not host or not port.isdigit():
            raise BadRequest(
                f"not host:port in the Redis Cluster URL {redact_url(url)!r}: {part!r}"
            )
        seeds.append((host.strip("[]"), int(port)))
    return node_scheme, userinfo + at, seeds, query


def _address(asked: Address, host: object, port: object) -> Address:
    name = scripts.text(host)
    return (asked[0] if name in ("", "?") else name, int(str(scripts.text(port))))


def _from_slots(asked: Address, reply: Sequence[Any]) -> list[Shard]:
    """The shards a ``CLUSTER SLOTS`` reply describes (``asked``: the node that gave it)."""
    shards: dict[Address, Shard] = {}
    for start, end, primary, *replicas in reply:
        owner = _address(asked, primary[0], primary[1])
        replicas_at = [_address(asked, r[0], r[1]) for r in replicas]
        shard = shards.setdefault(owner, Shard(owner, replicas_at))
        shard.ranges.append((int(start), int(end)))
    return list(shards.values())


def _from_shards(asked: Address, reply: Sequence[Any]) -> list[Shard]:
    """The shards serving slots in a ``CLUSTER SHARDS`` reply (RESP2: flat lists), with
    the replicas that have not failed (Redis 7.0 reports a replica that has not yet
    been sent any write as ``loading``)."""
    shards = []
    for entry in reply:
        fields = dict(zip(map(scripts.text, entry[::2]), entry[1::2], strict=True))
        ranges = [int(n) for n in fields["slots"]]
        primary: Address | None = None
        replicas = []
        health: dict[Address, str] = {}
        for node in fields["nodes"]:
            info = dict(zip(map(scripts.text, node[::2]), node[1::2], strict=True))
            state = scripts.text(info.get("health", b"online"))
            if state == "fail":
                continue
            host = info.get("endpoint", info.get("ip", b""))
            address = _address(asked, host, info.get("port", info.get("tls-port", 0)))
            if scripts.text(info["role"]) == "master":
                primary = address
            else:
                replicas.append(address)
                if state != "online":
                    health[address] = state
        if primary is None or not ranges:
            continue
        shard = Shard(primary, replicas)
        shard.health = health
        shard.ranges = list(zip(ranges[::2], ranges[1::2], strict=True))
        shards.append(shard)
    return shards


class RedisClusterStore(RedisStore):
    """The store on a Redis Cluster (see the module's docstring)."""

    backend = "redis-cluster"
    shared_by_url = True

    def __init__(self, url: str, limits: Limits | None = None) -> None:
        Store.__init__(self, url, limits)
        self._scheme, self._userinfo, self._seeds, self._query = split_cluster_url(url)
        self._nodes: dict[Address, RedisStore] = {}
        template = self._node(self._seeds[0])  # checks the URL's parameters (no IO)
        self.prefix, self.timeout = template.prefix, template.timeout
        self.connect_timeout = template.connect_timeout
        self.wait_replicas, self.wait_ms = template.wait_replicas, template.wait_ms
        self._slots: list[Address | None] = [None] * SLOTS
        self.shards: list[Shard] = []
        self._refreshing: asyncio.Task[None] | None = None
        self._closed = False
        self._max_watchers = template._max_watchers
        self._watchers = asyncio.Semaphore(self._max_watchers)
        self.refreshes = 0  # slot maps fetched so far

    def _node(self, address: Address) -> RedisStore:
        """The connections to one node (made on first use)."""
        node = self._nodes.get(address)
        if node is None:
            host, port = address
            shown = f"[{host}]" if ":" in host else host
            query = f"?{self._query}" if self._query else ""
            node = RedisStore(f"{self._scheme}://{self._userinfo}{shown}:{port}/0{query}")
            self._nodes[address] = node
        return node

    @classmethod
    async def open(cls, url: str, limits: Limits | None = None) -> Self:
        store = cls(url, limits)
        try:
            async with asyncio.timeout(store.timeout + store.connect_timeout):
                await store._fetch_slots()
            await store._load_scripts()
        except TimeoutError as exc:
            await store.close()
            shown = redact_url(url)
            raise StoreUnavailable(f"redis-cluster: no slot map from {shown!r} in time") from exc
        except BaseException:
            await store.close()
            raise
        return store

    # -- the slot map ------------------------------------------------------------

    async def _fetch_slots(self) -> None:
        """Ask the known primaries, their replicas, then the URL's nodes, in that order,
        for the slot map (``CLUSTER SHARDS``, or ``CLUSTER SLOTS`` before Redis 7); the
        first answer becomes the map."""
        asked: list[Address] = []
        for shard in self.shards:
            asked += [shard.primary, *shard.replicas]
        asked += [seed for seed in self._seeds if seed not in asked]
        failures: list[str] = []
        for address in asked:
            node = self._node(address)
            try:
                try:
                    shards = _from_shards(address, await node._command("CLUSTER", "SHARDS"))
                except StoreUnavailable as exc:
                    if not isinstance(exc.__cause__, ResponseError):
                        raise
                    shards = _from_slots(address, await node._command("CLUSTER", "SLOTS"))
            except StoreUnavailable as exc:
                failures.append(f"{address[0]}:{address[1]}: {exc}")
                continue
            if shards:
                self._apply(shards)
                return
            failures.append(f"{address[0]}:{address[1]}: no slots assigned")
        raise StoreUnavailable("redis-cluster: no node gave a slot map: " + "; ".join(failures))

    def _apply(self, shards: list[Shard]) -> None:
        slots: list[Address | None] = [None] * SLOTS
        for shard in shards:
            shard.ranges.sort()
            for start, end in shard.ranges:
                slots[start : end + 1] = [shard.primary] * (end - start + 1)
            self._node(shard.primary)
        self._slots = slots
        self.shards = sorted(shards, key=lambda s: s.ranges[0])
        self.refreshes += 1

    def _refresh(self) -> asyncio.Task[None]:
        """Fetch the slot map again, in the background: one fetch at a time."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._fetch_slots())
            self._refreshing.add_done_callback(seen)
        return self._refreshing

    async def _owner(self, slot: int) -> RedisStore:
        address = self._slots[slot]
        if address is None:  # not served: the cluster is changing, or the map is old
            await asyncio.shield(self._refresh())
            address = self._slots[slot]
            if address is None:
                raise ConnectionError(f"redis-cluster: no primary serves slot {slot}")
        return self._node(address)

    def _redirected(self, slot: int, message: str) -> Address:
        """The node a ``MOVED``/``ASK`` reply names; for ``MOVED`` the slot is its now."""
        kind, _, target = message.split(" ")
        host, _, port = target.rpartition(":")
        address = (host.strip("[]") or (self._slots[slot] or self._seeds[0])[0], int(port))
        if kind == "MOVED":
            self._slots[slot] = address
            self._refresh()
        return address

    # -- routing -----------------------------------------------------------------

    async def _send(
        self, command: list[bytes], route: Arg | None = None, wait: bool = False
    ) -> Any:
        """One command on the primary that owns ``route``'s slot, following redirects
        (see the module's docstring)."""
        if route is None:
            raise RedisError("redis-cluster: a command without a key has no node")
        slot = slot_of(route)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.timeout
        ask: Address | None = None
        backoff = 0.01
        last = ""
        for _ in range(MAX_REDIRECTS + 1):
            node = self._node(ask) if ask is not None else await self._owner(slot)
            try:
                if ask is not None:
                    ask = None
                    return await self._asking(node, command, wait)
                return await node._send(command, None, wait)
            except ResponseError as exc:
                last = str(exc)
                kind = last.partition(" ")[0]
                if kind == "MOVED":
                    self._redirected(slot, last)
                elif kind == "ASK":
                    ask = self._redirected(slot, last)
                elif kind in ("TRYAGAIN", "CLUSTERDOWN"):
                    pause = min(backoff, give_up - loop.time())
                    if pause <= 0:
                        break
                    await asyncio.sleep(pause)
                    backoff *= 2
                    if kind == "CLUSTERDOWN":
                        self._refresh()
                else:
                    raise
            except OSError:  # outcome unknown; a failover may be under way
                self._refresh()
                raise
        raise RedisError(f"redis-cluster: slot {slot} still refused after redirects ({last})")

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        """``glance_rooms.lua`` per room (a script's keys share one slot), all in one
        write per node (:meth:`_run_many`)."""
        args = [len(sets), len(keys)]
        calls = [(scripts.glance_args(self.prefix, [r], keys, sets), args) for r in rooms]
        replies = await self._run_many(scripts.GLANCE_ROOMS, calls)
        return [scripts.glances([r], keys, sets, g)[0] for r, g in zip(rooms, replies, strict=True)]

    async def _scan_rooms(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[ScanPage]:
        """``scan_rooms.lua`` per room, all in one write per node (:meth:`_run_many`)."""
        calls = [scripts.scan_args(self.prefix, [r], prefix, after, limit) for r in rooms]
        replies = await self._run_many(scripts.SCAN_ROOMS, calls)
        return [scripts.scan_page(reply[1], reply[0]) for reply in replies]

    async def _scan_keys(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[KeyPage]:
        """``scan_rooms.lua`` per room without the values, all in one write per node."""
        calls = [
            scripts.scan_args(self.prefix, [r], prefix, after, limit, values=False) for r in rooms
        ]
        replies = await self._run_many(scripts.SCAN_ROOMS, calls)
        return [scripts.key_page(reply[1]) for reply in replies]

    async def _pipeline(self, commands: list[list[bytes]], routes: list[Arg]) -> list[Any]:
        """Each node's share of ``commands`` (those whose route's slot it owns, by the
        map) in one write on its wire, every node at once: one request per node. A
        redirect or refusal is returned as its error reply, for the caller to send that
        command again alone (:meth:`_send` follows it); a command whose slot has no
        primary in the map gets a ``TRYAGAIN`` reply of its own, for the same reason."""
        replies: list[Any] = [None] * len(commands)
        groups: dict[Address, list[int]] = {}
        for i, route in enumerate(routes):
            address = self._slots[slot_of(route)]
            if address is None:
                replies[i] = ResponseError("TRYAGAIN the slot map names no primary for it")
            else:
                groups.setdefault(address, []).append(i)

        async def send(address: Address, at: list[int]) -> None:
            node = self._node(address)
            got = await node._pipeline([commands[i] for i in at], [routes[i] for i in at])
            for i, reply in zip(at, got, strict=True):
                replies[i] = reply

        sent = (send(address, at) for address, at in groups.items())
        for failed in await asyncio.gather(*sent, return_exceptions=True):
            if isinstance(failed, BaseException):  # every node's is retrieved, one raised
                if isinstance(failed, OSError):  # outcome unknown; a failover may be on
                    self._refresh()
                raise failed
        return replies

    async def _asking(self, node: RedisStore, command: list[bytes], wait: bool) -> Any:
        """``ASKING`` then ``command`` (then ``WAIT``) in one write on ``node``."""
        wire = node._wire
        if wire is None or not wire.usable:
            wire = await node._redial()
        parts = [*pack_command("ASKING"), *command]
        if wait:
            parts += self._wait_command()
        futures = wire.send(parts, 3 if wait else 2)
        for future in futures:
            seen(future)
        await futures[0]
        answer = await futures[1]
        if wait:
            acked = await futures[2]
            if acked < self.wait_replicas:
                raise ReplicasBehind(
                    f"redis: the write was applied but only {acked} of {self.wait_replicas} "
                    f"replicas acknowledged it within {self.wait_ms} ms: its outcome is unknown"
                )
        return answer

    async def _block(
        self, command: list[bytes], replies: int, route: Arg | None = None
    ) -> list[Any]:
        """The blocking read on a watch wire of the primary that owns ``route``."""
        assert route is not None
        slot = slot_of(route)
        last = ""
        for _ in range(MAX_REDIRECTS + 1):
            node = await self._owner(slot)
            try:
                return await node._block(command, replies)
            except ResponseError as exc:
                last = str(exc)
                kind = last.partition(" ")[0]
                if kind == "MOVED":
                    self._redirected(slot, last)
                elif kind in ("TRYAGAIN", "CLUSTERDOWN", "ASK"):
                    await asyncio.sleep(0.05)
                    self._refresh()
                else:
                    raise
            except OSError:
                self._refresh()
                raise
        raise RedisError(f"redis-cluster: slot {slot} still refused after redirects ({last})")

    async def _load_scripts(self) -> None:
        """SCRIPT LOAD every script on every primary, all at once."""
        await asyncio.gather(*(self._node(s.primary)._load_scripts() for s in self.shards))

    async def _refuse_cluster(self) -> None:
        return None

    # -- info and close ----------------------------------------------------------

    async def _info(self) -> StoreInfo:
        await self._fetch_slots()
        primaries = [self._node(s.primary) for s in self.shards]
        settings = await asyncio.gather(*(self._call(node._settings) for node in primaries))
        durability, warnings = judge(settings[0][0])
        for shard, (config, _) in zip(self.shards[1:], settings[1:], strict=True):
            for warning in judge(config)[1]:
                if warning not in warnings:
                    warnings.append(f"{shard.primary[0]}:{shard.primary[1]}: {warning}")
        for shard in self.shards:
            if len(shard.replicas) < max(1, self.wait_replicas):
                warnings.append(
                    f"primary {shard.primary[0]}:{shard.primary[1]} has "
                    f"{len(shard.replicas)} replicas: a failure of it stops its rooms"
                    + (
                        f", and wait={self.wait_replicas} cannot be met"
                        if self.wait_replicas
                        else ""
                    )
                )
        if not self.wait_replicas:
            warnings.append(
                "replication is asynchronous and wait is off: a failover can lose acknowledged "
                "writes, fencing counters included; add ?wait=1 to the URL"
            )
        return StoreInfo(
            backend=self.backend,
            url=redact_url(self.url),
            durability=durability,
            warnings=warnings,
            details={
                "prefix": self.prefix,
                "redis_version": settings[0][1],
                "timeout": self.timeout,
                "connect_timeout": self.connect_timeout,
                "wait": (
                    f"WAIT {self.wait_replicas} replicas, {self.wait_ms} ms, after each write"
                    if self.wait_replicas
                    else "off: writes are acknowledged before any replica has them"
                ),
                "clock": "each primary's clock (TIME, read by each script)",
                "topology": [shard.describe() for shard in self.shards],
                **settings[0][0],
            },
        )

    async def _close(self) -> None:
        self._closed = True
        if self._refreshing is not None:
            self._refreshing.cancel()
        nodes = list(self._nodes.values())
        results = await asyncio.gather(*(node._close() for node in nodes), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
