"""The PostgreSQL backend: ``postgresql://user@host:port/dbname?schema=agentrooms``.

Every operation is one statement in one round trip (asyncpg, over the small pool of
``pool.py``); the SQL lives in ``queries.sql``, ``migrations/`` and ``functions/``
(see ``sql.py``), where ``transact`` is a PL/pgSQL function that locks, compares and
writes in one transaction at READ COMMITTED. A put guarded by its own version, the
commonest transact, is one plain ``UPDATE`` (``compare_and_set``), followed by a read
of the record only when it did not apply (docs/why.md).

Transacts that append to a room's log are serialized by the room's append lock, held to
commit, so a room's appends take turns at the write-ahead log flush. A store therefore
keeps at most one appending transact per room in flight: the ones that arrive meanwhile
queue and are sent together, as one batch in one statement (``batches.py``;
``transact()`` applies a batch one transact after the other, each all or nothing), when
it returns. One agent
alone never waits for this; many agents of one process share the append lock's turns
and the flushes (docs/why.md).

Sets live in one table ordered for picking (``set_pick``: ``FOR UPDATE SKIP LOCKED`` on
that order, so concurrent pickers get different members). ``watch`` is woken by
LISTEN/NOTIFY over one extra connection per store (``listener.py``), opened on the first
``watch`` (to ``listen_url`` if given); behind transaction pooling without one, where
NOTIFY cannot arrive, it re-reads the room every ``poll_interval`` instead.
``delete_room`` is one transaction, excluding transacts of the room with an advisory
lock. The lock order that keeps all of these free of deadlocks is written once, above
``transact()`` in ``functions/transact.sql``.

Every statement names its schema's objects (``queries.sql``) and every function sets its
own search_path, so no statement depends on session state a connection pooler may drop.
The URL's own query parameters (``schema``, ``pool_size``, ``connect_timeout``,
``timeout``, ``pooler``, ``listen_url``, ``poll_interval``) and the session settings are
in ``config.py``; docs/scaling.md says how to run behind pgbouncer. Driver errors
become the contract's in ``errors.py``.

Durability: a transact returns after its commit, which survives a crash when the server
runs with ``fsync=on`` and ``synchronous_commit`` other than ``off`` (``info()`` warns
otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any, Self

import asyncpg

from agentrooms.errors import (
    BadRequest,
    CursorCompacted,
    StaleFence,
    StoreUnavailable,
    VersionConflict,
)
from agentrooms.store.base import Store, settle
from agentrooms.store.postgres import pages
from agentrooms.store.postgres.batches import Waiting, batch_args, lone_outcome, next_batch
from agentrooms.store.postgres.config import PostgresConfig, parse_url, redact, session_settings
from agentrooms.store.postgres.errors import check_session, driver_errors, translate
from agentrooms.store.postgres.listener import Listener
from agentrooms.store.postgres.pool import ConnectionPool
from agentrooms.store.postgres.sql import QUERIES, migrate
from agentrooms.store.types import (
    Event,
    FenceAtMost,
    Glance,
    KeyPage,
    Limits,
    Prepared,
    ScanPage,
    Snapshot,
    StoreInfo,
    TransactResult,
    VersionIs,
    stored_event,
)
from agentrooms.store.validation import decode_json

_SEQ_MAX = 2**62  # above any sequence number a room can reach; keeps arguments in bigint
_RECHECK = 10.0  # seconds a watch waits for a notification before re-reading anyway


def _prefix_end(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` in code point order,
    ``None`` when no bound is needed (the empty prefix, or one of only U+10FFFF)."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code <= 0x10FFFF:
            return "".join(chars) + chr(0xE000 if 0xD800 <= code <= 0xDFFF else code)
    return None


def _matches_no_key(prefix: str) -> bool:
    """A prefix PostgreSQL text cannot hold (NUL, lone surrogate) starts no valid key."""
    try:
        prefix.encode()
    except UnicodeEncodeError:
        return True
    return "\x00" in prefix


class PostgresStore(Store):
    backend = "postgres"
    shared_by_url = True

    def __init__(
        self,
        url: str,
        limits: Limits | None = None,
        *,
        pool: ConnectionPool,
        config: PostgresConfig,
        listener: Listener,
    ) -> None:
        super().__init__(url, limits)
        self.config = config
        self.schema = config.schema
        self._sql = {name: query.on(config.schema) for name, query in QUERIES.items()}
        self._pool = pool
        self._listener = listener
        # Rooms with an appending transact in flight -> the ones queued behind it.
        self._lines: dict[str, list[Waiting]] = {}
        self._flushers: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(cls, url: str, limits: Limits | None = None) -> Self:
        """Connect, create or migrate the schema (safe from many processes at once), then
        check the session: ``BadRequest`` if it is not at READ COMMITTED or, on a direct
        connection, if its schema is not the store's (a pooler dropped the settings)."""
        config = parse_url(url)
        schema = config.schema
        connect = functools.partial(
            asyncpg.connect,
            config.dsn,
            server_settings=session_settings(schema, config.pooler),
            timeout=config.connect_timeout,
            # No command_timeout: the pool bounds its calls, the block below its own.
            # Named prepared statements do not survive transaction pooling: a statement
            # prepared on one server connection is run on another.
            **({"statement_cache_size": 0} if config.pooler == "transaction" else {}),
        )
        pool = ConnectionPool(connect, config.pool_size, config.timeout)
        try:
            with driver_errors("connect and migrate"):
                async with pool.acquire() as conn, asyncio.timeout(config.timeout):
                    await migrate(conn, schema)
                    check = await conn.fetchrow(QUERIES["session_check"].sql)
            assert check is not None
            check_session(config, check["schema"], check["isolation"])
        except BaseException:
            with contextlib.suppress(Exception):
                await pool.close()
            raise
        listen = functools.partial(connect, command_timeout=config.timeout)
        if config.listen_dsn is not None:
            listen = functools.partial(
                asyncpg.connect,
                config.listen_dsn,
                server_settings=session_settings(schema),  # a direct connection
                timeout=config.connect_timeout,
                command_timeout=config.timeout,
            )
        listener = Listener(listen, QUERIES["notify_channel"].sql, schema)
        return cls(url, limits, pool=pool, config=config, listener=listener)

    async def _fetch(self, name: str, *args: object) -> list[Any]:
        try:  # driver_errors, inlined: the hot path
            return await self._pool.fetch(self._sql[name], *args)
        except Exception as exc:
            ours = translate(exc, name)
            if ours is None:
                raise
            raise ours from exc

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        rows = await self._fetch("read", room, keys)
        found = {row["key"]: pages.record(row) for row in rows if row["key"] is not None}
        return Snapshot({k: found[k] for k in keys if k in found}, rows[0]["now"])

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        rows = await self._fetch("glance", rooms, keys, sets)
        return pages.glances(rows, rooms, keys, sets)

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        cas = await self._compare_and_set(room, ops)
        if cas is not None:
            return cas
        if not ops.appends:
            return lone_outcome(await self._transact_batch(room, [ops]))
        line = self._lines.get(room)
        if line is not None:  # an appending transact of the room is in flight: queue
            waiting = Waiting(ops, asyncio.get_running_loop().create_future())
            line.append(waiting)
            return await waiting.future
        self._lines[room] = []
        try:
            return lone_outcome(await self._transact_batch(room, [ops]))
        finally:
            self._send_line(room)

    def _send_line(self, room: str) -> None:
        """After an appending transact of ``room`` returns: send the ones that queued
        meanwhile, together, or note that none is in flight."""
        if not self._lines[room]:
            del self._lines[room]
            return
        task = asyncio.get_running_loop().create_task(self._flush_line(room))
        self._flushers.add(task)
        task.add_done_callback(self._flushers.discard)

    async def _flush_line(self, room: str) -> None:
        """Send the room's queued appending transacts in batches, one batch in flight,
        until none is left."""
        line = self._lines[room]
        batch: list[Waiting] = []
        try:
            while line:
                batch = next_batch(line)
                for w, outcome in zip(batch, await self._outcomes(room, batch), strict=True):
                    settle(w.future, outcome)
        except BaseException as exc:  # cancelled: the event loop is closing
            for w in [*batch, *line]:  # the batch in flight: its outcome is unknown
                settle(w.future, StoreUnavailable(f"PostgreSQL transact not sent: {exc!r}"))
            raise
        finally:
            del self._lines[room]

    async def _outcomes(self, room: str, batch: list[Waiting]) -> list[TransactResult | Exception]:
        """Each queued transact's result or error, from one batch if it can be."""
        try:
            return list(await self._transact_batch(room, [w.ops for w in batch]))
        except BadRequest as exc:
            if len(batch) == 1:
                return [exc]
            # One transact's input failed the whole statement, so nothing was written:
            # send each alone, so that only its own input fails it.
            return [outcome for w in batch for outcome in await self._outcomes(room, [w])]
        except StoreUnavailable as exc:  # the outcome of each is unknown
            copies: list[TransactResult | Exception] = []
            for _ in batch:
                copy = StoreUnavailable(str(exc))
                copy.__cause__ = exc.__cause__
                copies.append(copy)
            return copies

    async def _transact_batch(
        self, room: str, batch: list[Prepared]
    ) -> list[TransactResult | VersionConflict | StaleFence]:
        """Run independent transacts of ``room`` in one statement, in order, each all or
        nothing: each one's result, or the compare failure it raises."""
        args = batch_args(batch)
        outcome_keys = [next((w.key for w in ops.writes if w.outcome), None) for ops in batch]
        recording = outcome_keys if any(outcome_keys) else None
        [row] = await self._fetch("transact", room, *args, recording)
        conflicts: dict[int, dict[str, int | None]] = {}
        for item, key, version in zip(
            row["conflict_items"] or (),
            row["conflict_keys"] or (),
            row["conflict_versions"] or (),
            strict=True,
        ):
            conflicts.setdefault(item - 1, {})[key] = version
        versions, first_seqs = row["versions"], row["first_seqs"]
        stale_at, stale_current = row["stale_at"], row["stale_current"]
        outcomes: list[TransactResult | VersionConflict | StaleFence] = []
        put_at = 0
        for i, ops in enumerate(batch):
            puts = [w.key for w in ops.writes if w.value_json is not None]
            if stale_at[i] is not None:
                stale = ops.compares[stale_at[i] - 1]
                assert isinstance(stale, FenceAtMost)
                current = stale_current[i]
                outcomes.append(
                    StaleFence(stale.key, stale.fence, None if current is None else int(current))
                )
            elif i in conflicts:
                outcomes.append(VersionConflict(conflicts[i]))
            else:
                first = first_seqs[i]
                outcomes.append(
                    TransactResult(
                        dict(zip(puts, versions[put_at : put_at + len(puts)], strict=True)),
                        list(range(first, first + len(ops.appends))) if ops.appends else [],
                        row["now"],
                    )
                )
            put_at += len(puts)
        return outcomes

    async def _compare_and_set(self, room: str, ops: Prepared) -> TransactResult | None:
        """The commonest transact, a put guarded by its own version, as one statement:
        the result when it applied, else ``None`` (the general path then finds out why).
        When it did not apply, one read of the record: ``VersionConflict`` if that
        read's snapshot holds another version (or none), as the compare failed at that
        instant, which lies within this call, and versions are never reused, so the
        failure is final; ``None`` if it holds the compared version.

        It needs no room lock: it creates no key and waits for one row only, so a
        concurrent ``delete_room`` either deletes what it wrote or makes it fail."""
        if ops.appends or ops.set_ops or len(ops.compares) != 1 or len(ops.writes) != 1:
            return None
        [c], [w] = ops.compares, ops.writes
        if not (isinstance(c, VersionIs) and c.key == w.key and w.value_json is not None):
            return None
        if c.version > _SEQ_MAX:  # no version is that high, and it would overflow bigint
            return None
        rows = await self._fetch("compare_and_set", room, w.key, w.value_json, w.ttl_ms, c.version)
        if rows:
            return TransactResult({w.key: rows[0]["version"]}, [], rows[0]["now"])
        current = (await self._read(room, [c.key])).version(c.key)
        if current != c.version:
            raise VersionConflict({c.key: current})
        return None

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        if _matches_no_key(prefix):
            return ScanPage([], None, (await self._fetch("read", room, []))[0]["now"])
        end = _prefix_end(prefix)
        if end is None:
            rows = await self._fetch("scan_to_end", room, prefix, after or "", limit)
        else:
            rows = await self._fetch("scan", room, prefix, end, after or "", limit)
        records = [pages.record(row) for row in rows if row["key"] is not None]
        more = rows[0]["more"] and records
        return ScanPage(records, records[-1].key if more else None, rows[0]["now"])

    async def _scan_rooms(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[ScanPage]:
        """Every room's page from one statement (``scan_rooms``): one round trip."""
        if _matches_no_key(prefix):
            now = (await self._fetch("read", rooms[0], []))[0]["now"]
            return [ScanPage([], None, now) for _ in rooms]
        end = _prefix_end(prefix)
        if end is None:
            rows = await self._fetch("scan_rooms_to_end", rooms, prefix, after or "", limit)
        else:
            rows = await self._fetch("scan_rooms", rooms, prefix, end, after or "", limit)
        return pages.scan_pages(rows, len(rooms), limit)

    async def _scan_keys(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[KeyPage]:
        """Every room's keys from one statement (``scan_keys``): no value is sent."""
        if _matches_no_key(prefix):
            return [KeyPage([], None) for _ in rooms]
        end = _prefix_end(prefix)
        if end is None:
            rows = await self._fetch("scan_keys_to_end", rooms, prefix, after or "", limit)
        else:
            rows = await self._fetch("scan_keys", rooms, prefix, end, after or "", limit)
        return pages.key_pages(rows, len(rooms), limit)

    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]:
        rows = await self._fetch("read_log", room, min(after, _SEQ_MAX), limit)
        low = rows[0]["low"]
        if after + 1 < low:
            raise CursorCompacted(room, after, low)
        return [
            stored_event(
                row["seq"],
                row["type"],
                decode_json(row["data"]),
                row["time"],
                row["author"],
                row["recipients"],
            )
            for row in rows
            if row["seq"] is not None
        ]

    async def _trim_log(self, room: str, before: int) -> int:
        [row] = await self._fetch("trim_log", room, min(before, _SEQ_MAX))
        low: int = row[0]
        return low

    async def _last_seq(self, room: str) -> int:
        [row] = await self._fetch("last_seq", room)
        seq: int = row[0]
        return seq

    async def _set_pick(self, room: str, name: str, count: int) -> list[str]:
        rows = await self._fetch("set_pick", room, name, count)
        return [row["member"] for row in sorted(rows, key=lambda row: row["pick"])]

    async def _set_size(self, room: str, name: str) -> int:
        [row] = await self._fetch("set_size", room, name)
        size: int = row[0]
        return size

    async def _delete_room(self, room: str) -> None:
        await self._fetch("delete_room", room)

    async def _watch(self, room: str, after: int, timeout: float) -> int:
        if timeout <= 0:
            return await self._last_seq(room)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.config.polls:
            return await self._poll(room, after, deadline)
        trust = True  # the listener's record of the room may stand for a read of it
        while True:  # one round per wake-up: see listener.py for why this order
            waiter = self._listener.add(room, after)
            try:
                with driver_errors("watch"):
                    await self._listener.listen()
                known = self._listener.newest(room) if trust else None
                remaining = deadline - loop.time()
                if known is not None and known > after:
                    return known  # committed, as a notified number is
                if known is None or remaining <= 0:  # else: nothing new yet, no query
                    generation = self._listener.generation
                    seq = await self._last_seq(room)
                    self._listener.learned(room, seq, generation)
                    remaining = deadline - loop.time()
                    if seq > after or remaining <= 0:
                        return seq
                # A bounded wait, then a re-read anyway: a connection that died without
                # the client noticing delays a wake-up by at most this long.
                await asyncio.wait([waiter.future], timeout=min(remaining, _RECHECK))
                if waiter.future.done():
                    notified = waiter.future.result()  # StoreUnavailable if it closed
                    if notified is not None:
                        return notified  # committed, and past after: no need to re-read
                else:
                    trust = False  # no notification: read, in case the connection died
            finally:
                self._listener.discard(waiter)

    async def _poll(self, room: str, after: int, deadline: float) -> int:
        """``watch`` without notifications: read the room's last seq every
        ``poll_interval`` until it passes ``after`` or the deadline passes."""
        loop = asyncio.get_running_loop()
        while True:
            seq = await self._last_seq(room)
            remaining = deadline - loop.time()
            if seq > after or remaining <= 0:
                return seq
            await asyncio.sleep(min(remaining, self.config.poll_interval))

    async def _info(self) -> StoreInfo:
        [row] = await self._fetch("settings")
        settings = dict(row.items())
        warnings = []
        if settings["fsync"] != "on":
            warnings.append("fsync is off: a crash of the server can lose or corrupt data")
        if settings["synchronous_commit"] == "off":
            warnings.append(
                "synchronous_commit is off: a crash can lose recently acknowledged transacts"
            )
        if settings["full_page_writes"] != "on":
            warnings.append("full_page_writes is off: a crash can corrupt data pages")
        durable = settings["fsync"] == "on" and settings["synchronous_commit"] != "off"
        durability = (
            "commit: a transact returns once its commit is flushed to the write-ahead log"
            if durable
            else "weak: a transact may be acknowledged before its commit is on disk"
        )
        details = {
            **settings,
            "schema": self.schema,
            "pool_size": self._pool.size,
            "connect_timeout": self.config.connect_timeout,
            "timeout": self.config.timeout,
            "pooler": self.config.pooler,
            "watch": (
                f"polls every {self.config.poll_interval:g} s"
                if self.config.polls
                else "LISTEN/NOTIFY" + (" over listen_url" if self.config.listen_dsn else "")
            ),
            "clock": "the PostgreSQL server's clock",
            "listening": self._listener.listening,
        }
        return StoreInfo(self.backend, redact(self.url), durability, warnings, details)

    async def _close(self) -> None:
        with driver_errors("close"):
            await self._listener.close()
            await self._pool.close()
        # Queued transacts fail once the pool is closed; let their senders finish.
        await asyncio.gather(*self._flushers, return_exceptions=True)
