"""The in-memory backend: the reference implementation of the store contract.

It is a real backend, not a mock: it passes the same conformance suite as the others.
State lives in one process and is lost when the process exits. Every public call runs
without awaiting in between, so each is atomic with respect to other coroutines.

``clock`` (seconds since the epoch) can be replaced, so expiry is testable without
sleeping. An expired record is absent at once; a write to its room deletes it later (up
to :data:`~agentrooms.store.types.PURGE_LIMIT` per write, oldest first), so that records
written with a TTL do not accumulate, as on the other backends.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from agentrooms.errors import CursorCompacted
from agentrooms.store.base import Store
from agentrooms.store.params import check_names
from agentrooms.store.types import (
    JSON,
    PURGE_LIMIT,
    Event,
    Glance,
    Limits,
    Prepared,
    Record,
    ScanPage,
    Snapshot,
    StoreInfo,
    TransactResult,
    stored_event,
)
from agentrooms.store.validation import check_compares, decode_json, ms_to_s, with_outcome


@dataclass(slots=True)
class _Row:
    value_json: str
    version: int
    expires_ms: int | None


@dataclass(slots=True)
class _Set:
    """Members never picked (sorted) are handed out first, then the least recently
    picked ones (in pick order)."""

    fresh: list[str] = field(default_factory=list)
    picked: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def add(self, member: str) -> None:
        i = bisect.bisect_left(self.fresh, member)
        if member in self.picked or (i < len(self.fresh) and self.fresh[i] == member):
            return
        self.fresh.insert(i, member)

    def remove(self, member: str) -> None:
        if member in self.picked:
            del self.picked[member]
            return
        i = bisect.bisect_left(self.fresh, member)
        if i < len(self.fresh) and self.fresh[i] == member:
            del self.fresh[i]

    def pick(self, count: int) -> list[str]:
        out = self.fresh[:count]
        del self.fresh[:count]
        for member in out:
            self.picked[member] = None
        while len(out) < count and self.picked:
            member = next(iter(self.picked))
            if member in out:
                break
            self.picked.move_to_end(member)
            out.append(member)
        return out

    def __len__(self) -> int:
        return len(self.fresh) + len(self.picked)


@dataclass(slots=True)
class _Room:
    rows: dict[str, _Row] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # sorted, for scan
    # seq, type, data, ms, author, addressees (stored form)
    log: list[tuple[int, str, str, int, str | None, str | None]] = field(default_factory=list)
    seq: int = 0
    low: int = 1  # first sequence number not trimmed
    sets: dict[str, _Set] = field(default_factory=dict)
    changed: asyncio.Event | None = None  # set and replaced on every append (watch)
    # (expires_ms, key) of every put with a TTL, soonest first; an entry whose row has
    # since been rewritten or deleted is dropped when it comes up
    expiring: list[tuple[int, str]] = field(default_factory=list)

    def purge(self, now_ms: int, limit: int) -> None:
        """Delete up to ``limit`` rows that expired by ``now_ms``, oldest first."""
        while limit and self.expiring and self.expiring[0][0] <= now_ms:
            expires, key = heapq.heappop(self.expiring)
            row = self.rows.get(key)
            if row is not None and row.expires_ms == expires:
                del self.rows[key]
                self.keys.pop(bisect.bisect_left(self.keys, key))
                limit -= 1


class MemoryStore(Store):
    backend = "memory"

    def __init__(
        self,
        url: str = "memory://",
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``BadRequest`` for a URL with parameters: ``memory://`` takes none (no
        timeouts either: every call completes without waiting)."""
        super().__init__(url, limits)
        check_names("memory", [k for k, _ in parse_qsl(urlsplit(url).query, True)], ())
        self.clock = clock
        self._rooms: dict[str, _Room] = {}
        self._version = 0

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _room(self, room: str) -> _Room:
        state = self._rooms.get(room)
        if state is None:
            state = self._rooms[room] = _Room()
        return state

    @staticmethod
    def _live(state: _Room, key: str, now_ms: int) -> _Row | None:
        row = state.rows.get(key)
        if row is None or (row.expires_ms is not None and row.expires_ms <= now_ms):
            return None
        return row

    @staticmethod
    def _record(key: str, row: _Row) -> Record:
        return Record(key, decode_json(row.value_json), row.version, ms_to_s(row.expires_ms))

    async def _read(self, room: str, keys: list[str]) -> Snapshot:
        now_ms = self._now_ms()
        state = self._rooms.get(room) or _Room()
        found = {}
        for key in keys:
            row = self._live(state, key, now_ms)
            if row is not None:
                found[key] = self._record(key, row)
        return Snapshot(found, now_ms / 1000.0)

    async def _glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        out = []
        for room in rooms:  # _read never suspends: one snapshot of them all
            state = self._rooms.get(room) or _Room()
            snap = await self._read(room, keys)
            sizes = {n: len(state.sets.get(n, ())) for n in sets}
            out.append(Glance(room, snap, state.seq, sizes))
        return out

    async def _transact(self, room: str, ops: Prepared) -> TransactResult:
        now_ms = self._now_ms()
        state = self._room(room)

        def current(key: str) -> tuple[int, JSON] | None:
            row = self._live(state, key, now_ms)
            return None if row is None else (row.version, decode_json(row.value_json))

        check_compares(ops.compares, current)
        versions: dict[str, int] = {}
        if ops.writes:
            state.purge(now_ms, PURGE_LIMIT)
        for w in ops.writes:
            if w.value_json is None:
                if state.rows.pop(w.key, None) is not None:
                    state.keys.pop(bisect.bisect_left(state.keys, w.key))
                continue
            self._version += 1
            expires = None if w.ttl_ms is None else now_ms + w.ttl_ms
            if w.key not in state.rows:
                bisect.insort(state.keys, w.key)
            state.rows[w.key] = _Row(w.value_json, self._version, expires)
            if expires is not None:
                heapq.heappush(state.expiring, (expires, w.key))
            versions[w.key] = self._version
        for op in ops.set_ops:
            members = state.sets.setdefault(op.name, _Set())
            if op.add:
                members.add(op.member)
            else:
                members.remove(op.member)
        seqs = []
        for a in ops.appends:
            state.seq += 1
            state.log.append((state.seq, a.type, a.data_json, now_ms, a.author, a.to_json))
            seqs.append(state.seq)
        for w in ops.writes:
            if w.outcome:
                row = state.rows[w.key]
                others = {k: v for k, v in versions.items() if k != w.key}
                row.value_json = with_outcome(row.value_json, others, seqs)
        if seqs and state.changed is not None:
            state.changed.set()
            state.changed = None
        return TransactResult(versions, seqs, now_ms / 1000.0)

    async def _scan_rooms(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[ScanPage]:
        return [await self._scan(room, prefix, after, limit) for room in rooms]  # no suspending

    async def _scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        now_ms = self._now_ms()
        state = self._rooms.get(room) or _Room()
        if after is None or after < prefix:
            i = bisect.bisect_left(state.keys, prefix)
        else:
            i = bisect.bisect_right(state.keys, after)
        out: list[Record] = []
        last: str | None = None
        while i < len(state.keys) and len(out) < limit:
            key = state.keys[i]
            if not key.startswith(prefix):
                break
            row = self._live(state, key, now_ms)
            if row is not None:
                out.append(self._record(key, row))
            last = key
            i += 1
        more = i < len(state.keys) and state.keys[i].startswith(prefix)
        return ScanPage(out, last if more else None, now_ms / 1000.0)

    async def _read_log(self, room: str, after: int, limit: int) -> list[Event]:
        state = self._rooms.get(room) or _Room()
        if after + 1 < state.low:
            raise CursorCompacted(room, after, state.low)
        # log[i] holds seq = state.low + i
        begin = max(0, after + 1 - state.low)
        return [
            stored_event(seq, kind, decode_json(data), ms / 1000.0, author, to)
            for seq, kind, data, ms, author, to in state.log[begin : begin + limit]
        ]

    async def _trim_log(self, room: str, before: int) -> int:
        state = self._room(room)
        new_low = min(before, state.seq + 1)
        if new_low > state.low:
            del state.log[: new_low - state.low]
            state.low = new_low
        return state.low

    async def _last_seq(self, room: str) -> int:
        state = self._rooms.get(room)
        return 0 if state is None else state.seq

    async def _set_pick(self, room: str, name: str, count: int) -> list[str]:
        state = self._rooms.get(room)
        members = None if state is None else state.sets.get(name)
        return [] if members is None else members.pick(count)

    async def _set_size(self, room: str, name: str) -> int:
        state = self._rooms.get(room)
        return 0 if state is None else len(state.sets.get(name, ()))

    async def _watch(self, room: str, after: int, timeout: float) -> int:
        state = self._room(room)
        if state.seq > after or timeout <= 0:
            return state.seq
        if state.changed is None:
            state.changed = asyncio.Event()
        changed = state.changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout)
        return state.seq

    async def _delete_room(self, room: str) -> None:
        state = self._rooms.get(room)
        if state is None:
            return
        state.rows.clear()
        state.keys.clear()
        state.expiring.clear()
        state.sets.clear()
        state.log.clear()
        state.low = state.seq + 1

    async def _info(self) -> StoreInfo:
        return StoreInfo(
            backend=self.backend,
            url=self.url,
            durability="none: state lives in this process and is lost when it exits",
            warnings=["memory:// keeps nothing: use it for tests, not for agents"],
            details={"clock": "this process's clock (the only process with the state)"},
        )

    async def _close(self) -> None:
        return None
