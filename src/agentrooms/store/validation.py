"""Validation and encoding of store input, before any IO.

Every public :class:`~agentrooms.store.base.Store` method checks and encodes its
arguments here, once: bad input raises :class:`~agentrooms.errors.BadRequest` (or
``PayloadTooLarge``) and nothing reaches a backend. Also the rules backends share once
the input is valid: how compares are judged (:func:`check_compares`) and how a recorded
outcome is written into its value (:func:`with_outcome`).
"""

from __future__ import annotations

import json
import json.scanner
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, cast

from agentrooms.errors import BadRequest, PayloadTooLarge, StaleFence, VersionConflict
from agentrooms.store.types import (
    JSON,
    MAX_TTL,
    OUTCOME_FIELD,
    Absent,
    Append,
    Compare,
    Delete,
    FenceAtMost,
    Limits,
    Prepared,
    PreparedAppend,
    PreparedSetOp,
    PreparedWrite,
    Present,
    Put,
    PutOutcome,
    SetAdd,
    SetRemove,
    VersionIs,
    Write,
    encode_recipients,
    fence_of,
)

_COMPARES = (VersionIs, Absent, Present, FenceAtMost)
_SET_OPS = (SetAdd, SetRemove)
_RECORD_WRITES = (Put, Delete)
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# _ENCODER's own C encoder, made once rather than on every encode() (which is all that
# encode() adds to it, with a cycle check: without one a cycle is a RecursionError).
_C_ENCODER = (
    None
    if c_make_encoder is None
    else c_make_encoder(
        None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False
    )
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def encode_json(value: JSON, what: str, limit: int) -> str:
    """Canonical JSON text of ``value``; ``BadRequest`` if it is not JSON,
    ``PayloadTooLarge`` if its UTF-8 encoding is over ``limit`` bytes."""
    try:
        if isinstance(value, str):
            text = encode_basestring(value)
        elif _C_ENCODER is not None:
            text = "".join(_C_ENCODER(value, 0))
        else:
            text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"{what} is not JSON-serialisable: {exc}") from exc
    if text.isascii():  # the common case: its length is its size, no copy needed
        size = len(text)
    else:
        try:
            size = len(text.encode())
        except UnicodeEncodeError as exc:  # a lone surrogate: no backend can store it
            raise BadRequest(f"{what} is not valid Unicode: {exc}") from exc
    if size > limit:
        raise PayloadTooLarge(f"{what} is {size} bytes, over the {limit} limit")
    return text


def _check_name(name: object, what: str, limit: int) -> str:
    if not isinstance(name, str):
        raise BadRequest(f"{what} must be a string, not {type(name).__name__}")
    if not name:
        raise BadRequest(f"{what} must not be empty")
    # The common case, checked without a copy or a regex: printable ASCII is exactly
    # ASCII without a control character.
    if name.isascii() and name.isprintable() and len(name) <= limit:
        return name
    try:
        size = len(name.encode())
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{what} is not valid Unicode: {exc}") from exc
    if size > limit:
        raise BadRequest(f"{what} is {size} bytes, over the {limit}-byte limit")
    if _CONTROL.search(name):
        raise BadRequest(f"{what} {name!r} contains a control character")
    return name


def check_room(room: object, limits: Limits) -> str:
    """Room names: non-empty, no control characters, no braces (they delimit the Redis
    hash tag), at most ``max_room_bytes``."""
    name = _check_name(room, "room name", limits.max_room_bytes)
    if "{" in name or "}" in name:
        raise BadRequest(f"room name {name!r} must not contain braces")
    return name


def check_key(key: object, limits: Limits) -> str:
    return _check_name(key, "key", limits.max_key_bytes)


def check_int(value: object, what: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{what} must be an integer, not {type(value).__name__}")
    if value < minimum:
        raise BadRequest(f"{what} must be at least {minimum}, got {value}")
    return value


def check_timeout(timeout: object) -> float:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 <= timeout <= 3600
    ):
        raise BadRequest("timeout must be a number of seconds between 0 and 3600")
    return float(timeout)


def check_limit(limit: object, limits: Limits) -> int:
    value = check_int(limit, "limit", 1)
    if value > limits.max_page:
        raise BadRequest(f"limit {value} is over the maximum page of {limits.max_page}")
    return value


def ttl_to_ms(ttl: object) -> int | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise BadRequest(f"ttl must be a number of seconds, not {type(ttl).__name__}")
    if not math.isfinite(ttl) or not 0 < ttl <= MAX_TTL:
        raise BadRequest(f"ttl must be a positive number of seconds up to {MAX_TTL:.0f}, got {ttl}")
    return max(1, math.ceil(ttl * 1000))


def _prepare_guarded_put(c: VersionIs, w: Put, limits: Limits) -> Prepared:
    """The commonest transact, a put guarded by a version, by prepare_transact's rules
    without its general loops."""
    check_key(c.key, limits)
    check_int(c.version, "compared version", 0)
    key = check_key(w.key, limits)
    text = encode_json(w.value, f"value of {key!r}", limits.max_value_bytes)
    return Prepared([c], [PreparedWrite(key, text, ttl_to_ms(w.ttl))], [], [])


def prepare_transact(
    compares: Iterable[Compare],
    writes: Iterable[Write],
    appends: Iterable[Append],
    limits: Limits,
) -> Prepared:
    """Validate and encode one transact's operations (raising before any IO)."""
    if type(compares) is list and type(writes) is list and len(compares) == len(writes) == 1:
        c, w = compares[0], writes[0]
        if type(c) is VersionIs and type(w) is Put and appends == () and limits.max_ops >= 2:
            return _prepare_guarded_put(c, w, limits)
    cmp_list, write_list, append_list = list(compares), list(writes), list(appends)
    if len(cmp_list) + len(write_list) + len(append_list) > limits.max_ops:
        raise BadRequest(f"a transact holds at most {limits.max_ops} operations")
    for c in cmp_list:
        if not isinstance(c, _COMPARES):
            raise BadRequest(f"not a compare: {c!r}")
        check_key(c.key, limits)
        if isinstance(c, VersionIs):
            check_int(c.version, "compared version", 0)
        elif isinstance(c, FenceAtMost):
            check_int(c.fence, "fence", 0)
    prepared: list[PreparedWrite] = []
    set_ops: list[PreparedSetOp] = []
    seen: set[str] = set()
    outcome = False
    for w in write_list:
        if isinstance(w, _SET_OPS):
            name = check_key(w.name, limits)
            member = _check_name(w.member, "set member", limits.max_key_bytes)
            set_ops.append(PreparedSetOp(name, member, isinstance(w, SetAdd)))
            continue
        if not isinstance(w, _RECORD_WRITES):
            raise BadRequest(f"not a write: {w!r}")
        key = check_key(w.key, limits)
        if key in seen:
            raise BadRequest(f"key {key!r} is written twice in one transact")
        seen.add(key)
        if isinstance(w, PutOutcome):
            if outcome:
                raise BadRequest("a transact holds at most one PutOutcome")
            if not isinstance(w.value, dict) or OUTCOME_FIELD in w.value:
                raise BadRequest(f"a PutOutcome value is an object without {OUTCOME_FIELD!r}")
            outcome = True
        if isinstance(w, Put):
            text = encode_json(w.value, f"value of {key!r}", limits.max_value_bytes)
            flag = isinstance(w, PutOutcome)
            prepared.append(PreparedWrite(key, text, ttl_to_ms(w.ttl), flag))
        else:
            prepared.append(PreparedWrite(key, None))
    events: list[PreparedAppend] = []
    for a in append_list:
        if not isinstance(a, Append):
            raise BadRequest(f"not an append: {a!r}")
        kind = _check_name(a.type, "event type", limits.max_event_type_bytes)
        author = None
        if a.author is not None:
            author = _check_name(a.author, "event author", limits.max_author_bytes)
        data = encode_json(a.data, "event data", limits.max_value_bytes)
        events.append(PreparedAppend(kind, data, author, _recipients(a, limits)))
    return Prepared(cmp_list, prepared, events, set_ops)


def _recipients(a: Append, limits: Limits) -> str | None:
    """The stored form of an append's addressees, each a name, none twice, at most
    ``limits.max_recipients`` in all."""
    if a.to == () and a.to_roles == ():  # the defaults: addressed to nobody
        return None
    lists: list[list[str]] = []
    for given, what in ((a.to, "addressee"), (a.to_roles, "addressed role")):
        if isinstance(given, str) or not isinstance(given, Sequence):
            raise BadRequest(f"an event's {what}s must be a list of names, not {given!r}")
        names = [_check_name(n, what, limits.max_author_bytes) for n in given]
        lists.append(list(dict.fromkeys(names)))
    if len(lists[0]) + len(lists[1]) > limits.max_recipients:
        raise BadRequest(f"an event is addressed to at most {limits.max_recipients} names")
    return encode_recipients(lists[0], lists[1])


def check_compares(
    compares: Iterable[Compare], current: Callable[[str], tuple[int, JSON] | None]
) -> None:
    """Evaluate compares against ``current(key) -> (version, value) | None`` (``None``:
    absent or expired). Raises ``StaleFence`` for the first stale fence, else
    ``VersionConflict`` naming every failing key; returns when all hold.

    Backends that evaluate compares in Python (memory, SQLite, PostgreSQL) call this
    with the rows they have locked, so the rule is written once.
    """
    conflicts: dict[str, int | None] = {}
    for c in compares:
        found = current(c.key)
        version = None if found is None else found[0]
        if isinstance(c, FenceAtMost):
            held = None if found is None else fence_of(found[1])
            if held is None or held > c.fence:
                raise StaleFence(c.key, c.fence, held)
            continue
        ok = (
            (isinstance(c, VersionIs) and version == c.version)
            or (isinstance(c, Absent) and version is None)
            or (isinstance(c, Present) and version is not None)
        )
        if not ok:
            conflicts[c.key] = version
    if conflicts:
        raise VersionConflict(conflicts)


def with_outcome(value_json: str, versions: Mapping[str, int], seqs: Sequence[int]) -> str:
    """The JSON text of a :class:`PutOutcome` value (``value_json``, an object) with the
    transact's outcome added: the versions of its puts other than the outcome record's
    own, and the sequence numbers of its appends."""
    done = json.dumps({"versions": dict(versions), "seqs": list(seqs)}, ensure_ascii=False)
    rest = "}" if value_json == "{}" else "," + value_json[1:]
    return f'{{"{OUTCOME_FIELD}":{done}{rest}'


# typeshed types make_scanner's argument as a scanner; it takes the decoder it scans for
_scan_json: Callable[[str, int], tuple[JSON, int]] = json.scanner.make_scanner(
    cast(Any, json.JSONDecoder())
)


def decode_json(text: str | bytes) -> JSON:
    """A stored value's JSON text decoded, as ``json.loads`` decodes it (UTF-8 bytes or
    text; ``JSONDecodeError`` when it is not JSON). Stored texts are the store's own
    encoding, one value with no surrounding whitespace: those go straight to the
    decoder's scanner, skipping ``json.loads``'s checks (several times its cost for a
    small value); anything else to ``json.loads``."""
    if isinstance(text, bytes):
        text = text.decode()
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        return json.loads(text)  # raises, or skips leading whitespace
    return value if end == len(text) else json.loads(text)


def ms_to_s(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000.0
