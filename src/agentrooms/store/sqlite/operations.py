"""The store primitives as SQL, each run inside a transaction the engine has opened.

Read operations (``read``, ``scan``, ``read_log``, ``last_seq``, ``set_size``,
``settings``) run in a read transaction, so every statement of one operation sees one
snapshot; the write operations (``transact``, ``trim_log``, ``set_pick``, ``delete_room``)
run under ``BEGIN IMMEDIATE``, i.e. while this connection holds the database's single
write lock. ``data_version`` and ``seqs`` serve the watch poll and run outside any
transaction.

Every operation reads the store clock once, inside its transaction. An operation raises
an :class:`~agentrooms.errors.AgentroomsError` (a failed compare, a compacted cursor)
only before it writes anything: the other operations of its batch commit regardless
(the engine checks this rule and rolls the whole batch back if it is ever broken).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

from agentrooms.errors import CursorCompacted
from agentrooms.store.sqlite.sql import QUERIES
from agentrooms.store.types import (
    JSON,
    PURGE_LIMIT,
    Compare,
    Event,
    FenceAtMost,
    Glance,
    KeyPage,
    Prepared,
    PreparedAppend,
    PreparedSetOp,
    PreparedWrite,
    Record,
    ScanPage,
    Snapshot,
    TransactResult,
    stored_event,
)
from agentrooms.store.validation import check_compares, decode_json, ms_to_s, with_outcome

_PRAGMAS = ("journal_mode", "synchronous", "busy_timeout", "user_version")
_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
_MAX_CHAR = 0x10FFFF
_NO_UPPER_BOUND = b""  # a BLOB sorts after every TEXT value in SQLite


def prefix_end(prefix: str) -> str | bytes:
    """The least string greater than every string that starts with ``prefix`` (code
    point order), or an empty BLOB when there is none (``prefix`` is empty or all
    U+10FFFF): keys starting with ``prefix`` are exactly ``prefix <= key < prefix_end``."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code <= _MAX_CHAR:
            if 0xD800 <= code <= 0xDFFF:  # surrogates are not characters of UTF-8 text
                code = 0xE000
            return "".join(chars) + chr(code)
    return _NO_UPPER_BOUND


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _keys_json(keys: list[str]) -> str:
    return json.dumps(keys, ensure_ascii=False)


class Operations:
    """The store primitives over one connection (used by the engine's thread only)."""

    def __init__(self, conn: sqlite3.Connection, clock: Callable[[], float]) -> None:
        self._conn = conn
        self._clock = clock
        self._q = QUERIES
        self._revision: int | None = None  # the last version handed out, while writing
        self._stored_revision: int | None = None  # ... and the one in the table
        self._appended: dict[str, int] = {}  # room -> last seq appended, while writing
        self._purged: set[str] = set()  # rooms purged in this write transaction

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _all(self, name: str, params: dict[str, Any]) -> list[Any]:
        return self._conn.execute(self._q[name], params).fetchall()

    def _one(self, name: str, params: dict[str, Any]) -> Any:
        """The first column of the statement's only row, or ``None`` without a row. The
        statement is run to completion (``RETURNING`` must finish before ``COMMIT``)."""
        rows = self._conn.execute(self._q[name], params).fetchall()
        return rows[0][0] if rows else None

    # -- reads ----------------------------------------------------------------------

    def read(self, room: str, keys: list[str]) -> Snapshot:
        now_ms = self._now_ms()
        if len(keys) == 1:
            rows = self._all("read_one", {"room": room, "key": keys[0], "now_ms": now_ms})
        elif keys:
            rows = self._all(
                "read_many", {"room": room, "keys": _keys_json(keys), "now_ms": now_ms}
            )
        else:
            rows = []
        found = {row[0]: row for row in rows}
        records = {k: _record(*found[k]) for k in keys if k in found}
        return Snapshot(records, now_ms / 1000.0)

    def scan(self, room: str, prefix: str, after: str | None, limit: int) -> ScanPage:
        now_ms = self._now_ms()
        if not _encodable(prefix):  # a lone surrogate: no key can start with it
            return ScanPage([], None, now_ms / 1000.0)
        low, skip = (prefix, None) if after is None or after < prefix else (after, after)
        params = {"room": room, "low": low, "high": prefix_end(prefix), "skip": skip}
        rows = self._all("scan_records", {**params, "now_ms": now_ms, "limit": limit + 1})
        records = [_record(*row) for row in rows[:limit]]
        next_after = records[-1].key if len(rows) > limit else None
        return ScanPage(records, next_after, now_ms / 1000.0)

    def scan_keys(
        self, rooms: list[str], prefix: str, after: str | None, limit: int
    ) -> list[KeyPage]:
        """Each room's :meth:`scan` page, the keys only: a statement per room."""
        if not _encodable(prefix):
            return [KeyPage([], None) for _ in rooms]
        low, skip = (prefix, None) if after is None or after < prefix else (after, after)
        params: dict[str, Any] = {"low": low, "high": prefix_end(prefix), "skip": skip}
        params |= {"now_ms": self._now_ms(), "limit": limit + 1}
        execute, query, out = self._conn.execute, self._q["scan_keys"], []
        for room in rooms:
            params["room"] = room
            keys = [key for (key,) in execute(query, params)]
            more = len(keys) > limit
            if more:
                del keys[limit:]
            out.append(KeyPage(keys, keys[-1] if more else None))
        return out

    def read_log(self, room: str, after: int, limit: int) -> list[Event]:
        low = self._one("read_log_low", {"room": room}) or 1
        if after + 1 < low:
            raise CursorCompacted(room, after, low)
        rows = self._all("read_log_events", {"room": room, "after": after, "limit": limit})
        return [
            stored_event(seq, kind, decode_json(data), ms / 1000.0, author, to)
            for seq, kind, data, ms, author, to in rows
        ]

    def last_seq(self, room: str) -> int:
        seq: int | None = self._one("last_seq", {"room": room})
        return seq or 0

    def set_size(self, room: str, name: str) -> int:
        size: int = self._one("set_size", {"room": room, "name": name})
        return size

    def glance(self, rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
        """Each room's records, last sequence number and set sizes: three statements for
        all the rooms, in the job's read transaction (one snapshot)."""
        now_ms = self._now_ms()
        params = {"rooms": _keys_json(rooms)}
        found: dict[str, dict[str, Record]] = {room: {} for room in rooms}
        if keys:
            query = {**params, "keys": _keys_json(keys), "now_ms": now_ms}
            for room, key, value, version, expires_ms in self._all("glance_records", query):
                found[room][key] = _record(key, value, version, expires_ms)
        seqs: dict[str, int] = dict(self._all("glance_seqs", params))
        sizes: dict[str, dict[str, int]] = {room: {} for room in rooms}
        if sets:
            query = {**params, "names": _keys_json(sets)}
            for room, name, size in self._all("glance_set_sizes", query):
                sizes[room][name] = size
        now = now_ms / 1000.0
        return [
            Glance(room, Snapshot(found[room], now), seqs.get(room, 0), sizes[room])
            for room in rooms
        ]

    # -- the watch poll (outside any transaction) -------------------------------------

    def data_version(self) -> int:
        """A number that changes when another connection has committed since the last
        call (this connection's own commits leave it unchanged)."""
        version: int = self._one("watch_data_version", {})
        return version

    def seqs(self, rooms: list[str]) -> dict[str, int]:
        """The last sequence number of each of ``rooms`` that has a log."""
        return dict(self._all("watch_seqs", {"rooms": _keys_json(rooms)}))

    def settings(self) -> dict[str, Any]:
        """The connection's durability-relevant settings, for ``info``."""
        pragma = {n: self._conn.execute(f"PRAGMA {n}").fetchone()[0] for n in _PRAGMAS}
        return {
            "journal_mode": pragma["journal_mode"],
            "synchronous": _SYNCHRONOUS.get(pragma["synchronous"], str(pragma["synchronous"])),
            "busy_timeout_ms": pragma["busy_timeout"],
            "schema_version": pragma["user_version"],
        }

    # -- writes ---------------------------------------------------------------------

    def transact(self, room: str, ops: Prepared) -> TransactResult:
        now_ms = self._now_ms()
        if ops.compares:
            check_compares(ops.compares, self._current(room, ops.compares, now_ms))
        # nothing is written above this line: a failed compare leaves no trace
        versions: dict[str, int] = {}
        if ops.writes:
            if room not in self._purged:
                self._purge_expired(room, now_ms)
            versions = self._write(room, ops.writes, now_ms)
        if ops.set_ops:
            self._set_ops(room, ops.set_ops)
        seqs = self._append(room, ops.appends, now_ms) if ops.appends else []
        for w in ops.writes:
            if w.outcome:  # written with its final value once the seqs are known
                others = {k: v for k, v in versions.items() if k != w.key}
                text = with_outcome(w.value_json or "{}", others, seqs)
                self._put(room, w.key, text, w.ttl_ms, now_ms, versions)
        return TransactResult(versions, seqs, now_ms / 1000.0)

    def _current(
        self, room: str, compares: list[Compare], now_ms: int
    ) -> Callable[[str], tuple[int, JSON] | None]:
        """``key -> (version, value)`` of the compared records that are live now (the
        value is decoded only when a fence is compared)."""
        params: dict[str, Any] = {"room": room, "now_ms": now_ms}
        if len(compares) == 1:
            params["with_value"] = with_value = isinstance(compares[0], FenceAtMost)
            params["key"] = compares[0].key
            rows = self._all("transact_compare_one", params)
        else:
            params["with_value"] = with_value = any(isinstance(c, FenceAtMost) for c in compares)
            params["keys"] = _keys_json(list(dict.fromkeys(c.key for c in compares)))
            rows = self._all("transact_compare_many", params)
        found: dict[str, tuple[int, JSON]] = {
            key: (version, decode_json(value) if with_value else None)
            for key, version, value in rows
        }
        return found.get

    def _write(self, room: str, writes: list[PreparedWrite], now_ms: int) -> dict[str, int]:
        execute, q = self._conn.execute, self._q
        versions: dict[str, int] = {}
        for w in writes:
            if w.value_json is None:
                execute(q["transact_delete"], {"room": room, "key": w.key})
            elif not w.outcome:
                self._put(room, w.key, w.value_json, w.ttl_ms, now_ms, versions)
        return versions

    def _put(
        self,
        room: str,
        key: str,
        value_json: str,
        ttl_ms: int | None,
        now_ms: int,
        versions: dict[str, int],
    ) -> None:
        version = versions[key] = self._next_version()
        expires_ms = None if ttl_ms is None else now_ms + ttl_ms
        row = {"room": room, "key": key, "value": value_json, "version": version}
        self._conn.execute(self._q["transact_put"], {**row, "expires_ms": expires_ms})

    def _purge_expired(self, room: str, now_ms: int) -> None:
        """Delete a few rows of the room that have expired, once per write transaction
        (every query treats them as absent already, so this changes nothing a caller can
        see, only the file's size; a group commit of many transacts pays for it once)."""
        params = {"room": room, "now_ms": now_ms, "limit": PURGE_LIMIT}
        self._conn.execute(self._q["transact_purge_expired"], params)
        self._purged.add(room)

    def _set_ops(self, room: str, set_ops: list[PreparedSetOp]) -> None:
        add, remove = self._q["transact_set_add"], self._q["transact_set_remove"]
        for op in set_ops:  # in order: add-then-remove of one member differs from the reverse
            params = {"room": room, "name": op.name, "member": op.member}
            self._conn.execute(add if op.add else remove, params)

    def _append(self, room: str, appends: list[PreparedAppend], now_ms: int) -> list[int]:
        last: int = self._one("transact_next_seqs", {"room": room, "count": len(appends)})
        first = last - len(appends) + 1
        rows = [
            {
                "room": room,
                "seq": first + i,
                "type": a.type,
                "data": a.data_json,
                "time_ms": now_ms,
                "author": a.author,
                "recipients": a.to_json,
            }
            for i, a in enumerate(appends)
        ]
        self._conn.executemany(self._q["transact_append"], rows)
        self._appended[room] = last
        return list(range(first, last + 1))

    def set_pick(self, room: str, name: str, count: int) -> list[str]:
        """Up to ``count`` members in pick order, marked picked in that order (after every
        member picked before): O(count * log n) through the index set_members_pick."""
        params: dict[str, Any] = {"room": room, "name": name}
        rows = self._all("set_pick_members", {**params, "limit": count})
        members: list[str] = [member for (member,) in rows]
        if not members:
            return members
        last: int = self._one("set_pick_last", params) or 0
        marks = [{**params, "member": m, "picked_at": last + i} for i, m in enumerate(members, 1)]
        self._conn.executemany(self._q["set_pick_mark"], marks)
        return members

    def delete_room(self, room: str) -> None:
        """Every record, set member and event of the room; its ``rooms`` row stays, with
        the whole log trimmed (``low = seq + 1``), and the version counter is untouched."""
        execute, q, params = self._conn.execute, self._q, {"room": room}
        execute(q["delete_room_records"], params)
        execute(q["delete_room_sets"], params)
        execute(q["delete_room_events"], params)
        execute(q["delete_room_low"], params)

    # -- the store-wide version counter, kept in memory during one write transaction --

    def begin_write(self) -> None:
        """A write transaction began: the counter will be read when first needed."""
        self._revision = self._stored_revision = None
        self._appended = {}
        self._purged = set()

    def _next_version(self) -> int:
        if self._revision is None:
            self._revision = self._stored_revision = self._one("transact_revision_read", {})
        self._revision += 1
        return self._revision

    def end_write(self) -> None:
        """Store the counter before COMMIT. Holding the write lock, this transaction is
        the only one handing out versions. If it rolls back instead, the versions it
        handed out were never acknowledged, so handing them out again reuses nothing."""
        if self._revision != self._stored_revision:
            self._conn.execute(self._q["transact_revision_write"], {"last": self._revision})
        self._revision = self._stored_revision = None

    def appended(self) -> dict[str, int]:
        """``room -> last sequence number`` of the rooms the current (or just committed)
        write transaction appended to: read after ``COMMIT`` to wake watchers."""
        return self._appended

    def trim_log(self, room: str, before: int) -> int:
        state = self._all("trim_log_state", {"room": room})
        if not state:
            return 1  # nothing was ever appended: nothing to trim, and low stays 1
        seq: int = state[0][0]
        low: int = state[0][1]
        new_low = min(before, seq + 1)
        if new_low <= low:
            return low
        self._conn.execute(self._q["trim_log_events"], {"room": room, "low": new_low})
        self._conn.execute(self._q["trim_log_low"], {"room": room, "low": new_low})
        return new_low


def _record(key: str, value: str, version: int, expires_ms: int | None) -> Record:
    return Record(key, decode_json(value), version, ms_to_s(expires_ms))
