"""Store input validation: the guarded-put shortcut of ``prepare_transact`` (one
``VersionIs`` and one ``Put`` in lists) prepares and refuses exactly as the general
path does, and ``encode_json`` writes what ``json.dumps`` writes, compactly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrooms.errors import BadRequest, PayloadTooLarge
from agentrooms.store import Put, PutOutcome, VersionIs
from agentrooms.store.types import Limits, Prepared
from agentrooms.store.validation import encode_json, prepare_transact

LIMITS = Limits(max_key_bytes=8, max_value_bytes=64)
CASES: list[tuple[Any, Any]] = [
    (VersionIs("k", 3), Put("k", {"a": [1, 2.5, None, True, "é"]})),
    (VersionIs("k", 0), Put("other", "text", ttl=0.0004)),
    (VersionIs("k", 3), PutOutcome("k", {})),  # not a plain Put: the general path
    (VersionIs("k", -1), Put("k", 1)),
    (VersionIs("k", True), Put("k", 1)),
    (VersionIs("", 3), Put("k", 1)),
    (VersionIs("k", 3), Put("k\x00", 1)),
    (VersionIs("k", 3), Put("é" * 5, 1)),  # 10 bytes, 5 characters
    (VersionIs("k", 3), Put("k", float("nan"))),
    (VersionIs("k", 3), Put("k", {"a": object()})),
    (VersionIs("k", 3), Put("k", "x" * 70)),
    (VersionIs("k", 3), Put("k", "\ud800")),
    (VersionIs("k", 3), Put("k", 1, ttl=-1)),
    (VersionIs(5, 3), Put("k", 1)),  # type: ignore[arg-type]
]


def _outcome(compares: Any, writes: Any) -> Prepared | tuple[type, str]:
    try:
        return prepare_transact(compares, writes, (), LIMITS)
    except (BadRequest, PayloadTooLarge) as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize(("compare", "write"), CASES)
def test_the_guarded_put_shortcut_is_the_general_path(compare: Any, write: Any) -> None:
    shortcut = _outcome([compare], [write])
    general = _outcome((compare,), (write,))  # tuples take the general path
    assert shortcut == general
    if isinstance(shortcut, Prepared):
        assert shortcut.compares == [compare] and not shortcut.appends


def test_the_guarded_put_counts_against_the_operation_limit() -> None:
    with pytest.raises(BadRequest, match="at most 1 operations"):
        prepare_transact([VersionIs("k", 1)], [Put("k", 1)], (), Limits(max_ops=1))


def test_a_prepared_transact_does_not_share_the_callers_lists() -> None:
    compares, writes = [VersionIs("k", 1)], [Put("k", 1)]
    prepared = prepare_transact(compares, writes, (), LIMITS)
    compares.append(VersionIs("j", 2))
    assert prepared.compares == [VersionIs("k", 1)]


@pytest.mark.parametrize(
    "value",
    [{"a": [1, 2.5, None, True, False, 'é\u2028"\\']}, "x\ny", 5, -0.0, None, [], {}, 10**30],
)
def test_encode_json_is_compact_json(value: Any) -> None:
    text = encode_json(value, "v", 10**6)
    assert text == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert json.loads(text) == value


def test_encode_json_refuses_what_is_not_json() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    for bad in [float("inf"), {"a": {1j}}, cycle, {(1, 2): 3}]:
        with pytest.raises(BadRequest, match="not JSON-serialisable"):
            encode_json(bad, "v", 10**6)
    with pytest.raises(BadRequest, match="not valid Unicode"):
        encode_json(["\udfff"], "v", 10**6)
    with pytest.raises(PayloadTooLarge):
        encode_json("é" * 40, "v", 64)  # 40 characters, 80 bytes
