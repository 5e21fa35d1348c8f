"""The Redis backend's Lua scripts, the arguments they take and the replies they give.

Each script's KEYS, ARGV and reply are documented at the top of its ``.lua`` file; here
they are read once per process, and the values of the contract are encoded into their
arguments and decoded from their replies (and from those of the blocking ``XREAD`` that
``watch`` and ``follow_log`` send). No IO.
"""

from __future__ import annotations

import hashlib
import json
import math
from importlib import resources
from typing import Any

from agentrooms.errors import StaleFence, VersionConflict
from agentrooms.store.redis.keys import RoomKeys, room_keys
from agentrooms.store.redis.wire import Arg, pack_command
from agentrooms.store.types import (
    Absent,
    Compare,
    Event,
    FenceAtMost,
    Glance,
    KeyPage,
    PreparedWrite,
    Record,
    ScanPage,
    Snapshot,
    VersionIs,
    fence_of,
    stored_event,
)
from agentrooms.store.validation import decode_json

MAX_SEQ = 2**53
"""No sequence number gets this far (Lua numbers are doubles): larger ``after`` and
``before`` arguments are clamped to it, which changes no answer."""


class Script:
    """One ``.lua`` file of this package: its text and SHA1, read once per process."""

    __slots__ = ("name", "sha", "text")

    def __init__(self, name: str) -> None:
        self.name = name
        self.text = resources.files(__package__).joinpath(f"{name}.lua").read_text("utf-8")
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()


TRANSACT = Script("transact")
READ = Script("read")
READ_LOG = Script("read_log")
TRIM_LOG = Script("trim_log")
SET_PICK = Script("set_pick")
DELETE_ROOM = Script("delete_room")
# over many rooms on one server, over one room per call on a cluster (a script's keys
# share a slot there), and ``scan`` over one room everywhere
GLANCE_ROOMS = Script("glance_rooms")
SCAN_ROOMS = Script("scan_rooms")
SCRIPTS = (
    TRANSACT,
    READ,
    READ_LOG,
    TRIM_LOG,
    SET_PICK,
    DELETE_ROOM,
    GLANCE_ROOMS,
    SCAN_ROOMS,
)
WRITES = frozenset({TRANSACT, TRIM_LOG, SET_PICK, DELETE_ROOM})
"""The scripts that may write: with ``?wait=N`` each is followed by ``WAIT``."""


def compare_arg(c: Compare) -> str:
    """One compare as ``transact.lua`` takes it."""
    if isinstance(c, VersionIs):
        return f"v{c.version}"
    if isinstance(c, FenceAtMost):
        return f"f{c.fence}"
    return "a" if isinstance(c, Absent) else "p"


def put_options(w: PreparedWrite) -> str:
    """A put's options as ``transact.lua`` takes them: ``t<ttl ms>``, ``f<fence>`` and
    ``o`` (a :class:`~agentrooms.store.types.PutOutcome`).

    The fence is decoded only from a top-level object with a ``"fence":`` member; for
    any other value this is a substring test.
    """
    assert w.value_json is not None
    text = w.value_json
    fence = 0
    if text.startswith("{") and '"fence":' in text:
        fence = fence_of(json.loads(text))
    options = [f"t{w.ttl_ms}"] if w.ttl_ms is not None else []
    if fence:
        options.append(f"f{fence}")
    if w.outcome:
        options.append("o")
    return " ".join(options)


def set_op_arg(add: bool, member: str) -> str:
    """One set op as ``transact.lua`` takes it: ``+member`` (add) or ``-member`` (remove)."""
    return ("+" if add else "-") + member


def watch_command(keys: RoomKeys, after: int, block_ms: int) -> list[bytes]:
    """What a waiting ``watch`` sends, pipelined: ``XREAD COUNT 1 BLOCK <ms> STREAMS <log>
    <after>-0`` (returns once the log has an entry above ``after``, or after ``block_ms``)
    then ``HGET <meta> seq``, which the server runs only when the XREAD has returned, so
    its reply is the newest sequence number at wake-up (the meta hash is the truth: the
    log may have been trimmed or deleted). ``after`` is clamped to :data:`MAX_SEQ`."""
    assert block_ms > 0  # BLOCK 0 would wait forever
    return [
        *pack_command(
            "XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", keys.log, f"{min(after, MAX_SEQ)}-0"
        ),
        *pack_command("HGET", keys.meta, "seq"),
    ]


def follow_command(keys: RoomKeys, after: int, limit: int, block_ms: int) -> list[bytes]:
    """What ``follow_log`` sends, pipelined: ``XREAD COUNT <limit> BLOCK <ms> STREAMS
    <log> <after>-0`` (the entries above ``after`` as soon as there is one, or nothing
    after ``block_ms``), then ``HMGET <meta> seq low``, run once the XREAD has returned."""
    assert block_ms > 0  # BLOCK 0 would wait forever
    return [
        *pack_command(
            "XREAD",
            "COUNT",
            limit,
            "BLOCK",
            block_ms,
            "STREAMS",
            keys.log,
            f"{min(after, MAX_SEQ)}-0",
        ),
        *pack_command("HMGET", keys.meta, "seq", "low"),
    ]


def stream_entries(reply: Any) -> list[Any]:
    """The entries of the one stream an XREAD asked for (RESP2: [[name, entries]];
    RESP3: {name: entries}); [] when it timed out (None)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(next(iter(reply.values())))
    return list(reply[0][1])


def event(eid: bytes, fields: list[bytes]) -> Event:
    """A log entry as transact.lua writes it: ID ``<seq>-0``, fields ('t', type, 'd',
    data JSON, 'ms', time in ms), then ('a', author) when the append named one and ('r',
    addressees in their stored form) when it named some; an entry without them (also one
    written before they were stored) has none."""
    extra = {fields[i]: fields[i + 1] for i in range(6, len(fields) - 1, 2)}
    author = extra.get(b"a")
    return stored_event(
        int(eid[: eid.index(b"-")]),
        fields[1].decode(),
        decode_json(fields[3]),
        int(fields[5]) / 1000.0,
        None if author is None else author.decode(),
        extra.get(b"r"),
    )


def block_ms(seconds: float) -> int:
    """A positive timeout in seconds as a BLOCK argument: whole milliseconds, rounded up
    (never 0, which means "forever" to Redis)."""
    return max(1, math.ceil(seconds * 1000))


def record(key: str, version: bytes, expires: bytes | None, value: bytes) -> Record:
    expires_at = None if expires is None else int(expires) / 1000.0
    return Record(key, decode_json(value), int(version), expires_at)


def failure(compares: list[Compare], reply: list[Any]) -> Exception:
    """The error a failed ``transact.lua`` reply stands for."""
    if reply[0] == 1:
        c = compares[reply[1] - 1]
        assert isinstance(c, FenceAtMost)
        return StaleFence(c.key, c.fence, None if reply[2] is None else int(reply[2]))
    return VersionConflict(
        {
            compares[reply[i] - 1].key: None if reply[i + 1] is None else int(reply[i + 1])
            for i in range(1, len(reply), 2)
        }
    )


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def glance_args(prefix: str, rooms: list[str], keys: list[str], sets: list[str]) -> list[Arg]:
    """``glance_rooms.lua``'s KEYS for ``rooms`` (its ARGV: ``[len(sets), len(keys)]``)."""
    names: list[Arg] = []
    add = names.append
    for room in rooms:
        rk = room_keys(prefix, room)
        add(rk.meta)
        names += [rk.set + n for n in sets]
        names += [rk.record + k for k in keys]
    return names


def glances(rooms: list[str], keys: list[str], sets: list[str], reply: Any) -> list[Glance]:
    """``rooms``' glances from a ``glance_rooms.lua`` reply over them (in their order)."""
    now, sized, at = reply[0] / 1000.0, len(sets), 1
    out = []
    for room in rooms:
        seq = reply[at]
        sizes = dict(zip(sets, reply[at + 1 : at + 1 + sized], strict=True)) if sized else {}
        at += 1 + sized
        found = {}
        for key in keys:
            version = reply[at]
            if version is not None:
                found[key] = record(key, version, reply[at + 1], reply[at + 2])
            at += 3
        out.append(Glance(room, Snapshot(found, now), seq, sizes))
    return out


def scan_bounds(key_prefix: str, after: str | None) -> tuple[bytes, bytes]:
    """The ZRANGEBYLEX bounds of the keys under ``key_prefix`` after ``after``."""
    low = b"[" + key_prefix.encode() if key_prefix else b"-"
    if after is not None and after >= key_prefix:
        low = b"(" + after.encode()
    high = b"(" + key_prefix.encode() + b"\xff" if key_prefix else b"+"
    return low, high


def scan_args(
    prefix: str,
    rooms: list[str],
    key_prefix: str,
    after: str | None,
    limit: int,
    values: bool = True,
) -> tuple[list[Arg], list[Arg]]:
    """``scan_rooms.lua``'s KEYS and ARGV for ``rooms`` (``values``: the records, else
    their keys alone)."""
    index: list[Arg] = []
    bases: list[Arg] = []
    for room in rooms:
        rk = room_keys(prefix, room)
        index.append(rk.scan)
        bases.append(rk.record)
    return index, [*scan_bounds(key_prefix, after), limit, "r" if values else "k", *bases]


def scan_page(page: Any, now_ms: int) -> ScanPage:
    """One page of a ``scan_rooms.lua`` reply as a :class:`ScanPage` (``now_ms``: the
    reply's time)."""
    records = [
        record(page[i].decode(), page[i + 1], page[i + 2], page[i + 3])
        for i in range(1, len(page), 4)
    ]
    next_after = None if page[0] is None else page[0].decode()
    return ScanPage(records, next_after, now_ms / 1000.0)


def key_page(page: Any) -> KeyPage:
    """One page of a ``scan_rooms.lua`` reply without values as a :class:`KeyPage`."""
    next_after = page[0]
    return KeyPage(
        [key.decode() for key in page[1:]], None if next_after is None else next_after.decode()
    )
