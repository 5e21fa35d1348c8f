"""Key names of the Redis backend: pure functions, no IO.

Every key of a room lives in one hash slot, so one Lua script can touch them all and the
same code runs on Redis Cluster. The hash tag ``{<prefix>:<room>}`` is the first ``{...}``
of every key (room names and prefixes never contain braces), and every key starts with
the prefix so that ``SCAN MATCH <prefix>*`` finds all of a deployment's keys::

    <p>:{<p>:<room>}:m          hash        room meta: ``ver`` (last version given),
                                            ``seq`` (last event sequence number),
                                            ``low`` (first readable sequence number; 1),
                                            ``pick`` (last pick stamp given by set_pick);
                                            the only key delete_room keeps (with
                                            ``low`` = ``seq`` + 1)
    <p>:{<p>:<room>}:i          sorted set  scan index: one member per record key name,
                                            score 0, so ZRANGEBYLEX is UTF-8 byte order
                                            (= Unicode code point order)
    <p>:{<p>:<room>}:log        stream      event log: entry ID ``<seq>-0``, fields
                                            ``t`` (type), ``d`` (data JSON), ``ms`` (time),
                                            ``a`` (author, only when the append named one),
                                            ``r`` (addressees, stored form, only when named)
    <p>:{<p>:<room>}:r:<key>    hash        one record: ``v`` (value JSON as given),
                                            ``n`` (version), ``e`` (expiry, ms since the
                                            epoch, only with a TTL; PEXPIREAT set too),
                                            ``f`` (fencing token, only when not 0)
    <p>:{<p>:<room>}:s:<name>   sorted set  one set of the room (SetAdd / SetRemove): one
                                            member per set member, scored by pick order:
                                            0 = never picked, else the ``pick`` stamp of
                                            its last pick; (score, member) order is the
                                            order set_pick hands members out in
    <p>:{<p>:<room>}:sets       set         the key of every non-empty set of the room
                                            (added with its first member, removed with its
                                            last), so delete_room can find them

Record and set names may hold any character (a ``}`` in a key is harmless: only the first
tag counts). Record keys all contain ``:r:`` and set keys ``:s:`` right after the tag, so
they never collide with each other or with the room's own keys.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple
from urllib.parse import unquote

from agentrooms.errors import BadRequest

DEFAULT_PREFIX = "ar"
MAX_PREFIX_BYTES = 100


class RoomKeys(NamedTuple):
    """The keys of one room; ``record`` and ``set`` are the prefixes of its record and
    set keys, ``sets`` the registry of its non-empty sets."""

    meta: str
    scan: str
    log: str
    record: str
    set: str
    sets: str


def room_tag(prefix: str, room: str) -> str:
    """The hash tag shared by every key of ``room``."""
    return f"{{{prefix}:{room}}}"


@lru_cache(maxsize=4096)
def room_keys(prefix: str, room: str) -> RoomKeys:
    """The keys of ``room`` (cached: a busy room's names are built once)."""
    base = f"{prefix}:{{{prefix}:{room}}}:"
    return RoomKeys(base + "m", base + "i", base + "log", base + "r:", base + "s:", base + "sets")


def record_key(prefix: str, room: str, key: str) -> str:
    return room_keys(prefix, room).record + key


def set_key(prefix: str, room: str, name: str) -> str:
    return room_keys(prefix, room).set + name


def check_prefix(prefix: str) -> str:
    """A key prefix: non-empty, at most 100 bytes, no braces, spaces or control characters."""
    if not prefix or len(prefix.encode()) > MAX_PREFIX_BYTES:
        raise BadRequest(f"redis key prefix must be 1 to {MAX_PREFIX_BYTES} bytes: {prefix!r}")
    if any(c in "{}" or c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in prefix):
        raise BadRequest(f"redis key prefix {prefix!r} must not hold braces, spaces or controls")
    return prefix


def split_url(url: str) -> tuple[str, str]:
    """Split a store URL into the URL redis-py is given and the key prefix.

    Our own query parameter (``prefix``) is removed; every other one is kept verbatim
    for redis-py (``socket_timeout``, ``db``, ``ssl_cert_reqs``...).
    """
    base, sep, query = url.partition("?")
    kept, prefixes = [], []
    for part in query.split("&") if sep else []:
        name, _, value = part.partition("=")
        if name == "prefix":
            prefixes.append(unquote(value))
        elif part:
            kept.append(part)
    if len(prefixes) > 1:
        raise BadRequest(f"the prefix parameter is given {len(prefixes)} times in the URL")
    prefix = check_prefix(prefixes[0] if prefixes else DEFAULT_PREFIX)
    return (f"{base}?{'&'.join(kept)}" if kept else base), prefix


def redact_url(url: str) -> str:
    """``url`` without its password (in the user info or a ``password`` parameter)."""
    base, sep, query = url.partition("?")
    scheme, found, rest = base.partition("://")
    if found:
        userinfo, at, hostpart = rest.rpartition("@")
        if at and ":" in userinfo:
            rest = f"{userinfo.partition(':')[0]}:***@{hostpart}"
        base = f"{scheme}://{rest}"
    parts = ["password=***" if p.startswith("password=") else p for p in query.split("&")]
    return f"{base}{sep}{'&'.join(parts)}" if sep else base
