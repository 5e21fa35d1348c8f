"""The PostgreSQL backend's replies over many rooms turned into the contract's types:
``glance``, ``scan_rooms`` and ``scan_keys`` rows (see ``queries.sql``). No IO."""

from __future__ import annotations

from typing import Any

from agentrooms.store.types import Glance, KeyPage, Record, ScanPage, Snapshot
from agentrooms.store.validation import decode_json


def record(row: Any) -> Record:
    """A record from a row's ``key``, ``value``, ``version`` and ``expires_at``."""
    return Record(row["key"], decode_json(row["value"]), row["version"], row["expires_at"])


def glances(rows: list[Any], rooms: list[str], keys: list[str], sets: list[str]) -> list[Glance]:
    """The ``glance`` rows (i, item, value, n, expires_at; see ``queries.sql``) as the
    glances of ``rooms``."""
    count, now = len(rooms), 0.0
    found: list[dict[str, Record]] = [{} for _ in range(count)]
    seqs = [0] * count
    sizes: list[dict[str, int]] = [{} for _ in range(count)]
    for i, item, value, n, expires_at in rows:
        if item > 0:
            key = keys[item - 1]
            found[i - 1][key] = Record(key, decode_json(value), n, expires_at)
        elif i == 0:
            now = expires_at
        elif item == 0:
            seqs[i - 1] = n or 0
        else:
            sizes[i - 1][sets[-item - 1]] = n
    return [
        Glance(room, Snapshot(found[at], now), seqs[at], sizes[at]) for at, room in enumerate(rooms)
    ]


def scan_pages(rows: list[Any], rooms: int, limit: int) -> list[ScanPage]:
    """The ``scan_rooms`` rows (each room's first ``limit`` + 1 records, or one row with
    a NULL key) as each room's page."""
    found: list[list[Record]] = [[] for _ in range(rooms)]
    for row in rows:
        if row["key"] is not None:
            found[row["i"] - 1].append(record(row))
    now, pages = rows[0]["now"], []
    for records in found:
        more = len(records) > limit
        del records[limit:]
        pages.append(ScanPage(records, records[-1].key if more else None, now))
    return pages


def key_pages(rows: list[Any], rooms: int, limit: int) -> list[KeyPage]:
    """The ``scan_keys`` rows (the room's place, a key: each room's first ``limit`` + 1
    keys) as each room's page."""
    found: list[list[str]] = [[] for _ in range(rooms)]
    for i, key in rows:
        found[i - 1].append(key)
    pages = []
    for keys in found:
        more = len(keys) > limit
        if more:
            del keys[limit:]
        pages.append(KeyPage(keys, keys[-1] if more else None))
    return pages
