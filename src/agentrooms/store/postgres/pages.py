"""The PostgreSQL backend's replies over many rooms turned into the contract's types:
``glance``, ``scan_rooms`` and ``scan_keys`` rows (see ``queries.sql``). No IO."""

from __future__ import annotations

from typing import Any

from agentrooms.store.types import Glance, KeyPage, Record, ScanPage, Snapshot
from agentrooms.store.validation import decode_json


def record(row: Any) -> Record:
    """A record from a row's ``key``, ``value``, ``version`` and ``expires_at``."""
    return Record(row["key"], decode_json(row["value"]), row["version"], row["expires_at"])


def glances(rows: list[Any], sets: list[str]) -> list[Glance]:
    """The ``glance`` rows (one per room, in order: now, room, seq, sizes, then the live
    records' keys, values, versions and expiries as parallel arrays) as glances."""
    out = []
    for now, room, seq, sizes, keys, values, versions, expires in rows:
        found: dict[str, Record] = {}
        if keys:
            for key, value, version, expires_at in zip(
                keys, values, versions, expires, strict=True
            ):
                found[key] = Record(key, decode_json(value), version, expires_at)
        out.append(Glance(room, Snapshot(found, now), seq, dict(zip(sets, sizes, strict=True))))
    return out


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
