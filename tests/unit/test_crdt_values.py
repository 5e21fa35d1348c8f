"""CRDT values: what each operation does, their JSON forms, and bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentrooms.crdt import (
    GCounter,
    HybridClock,
    LWWRegister,
    ORSet,
    PNCounter,
    Text,
    Timestamp,
    decode,
    merge_json,
)
from agentrooms.errors import BadRequest


def test_counters() -> None:
    g = GCounter().increment("a").increment("a", 2).increment("b")
    assert g.value == 4 and g.to_json() == {"crdt": "g-counter", "counts": {"a": 3, "b": 1}}
    pn = PNCounter().increment("a", 5).decrement("b", 2).increment("a", -1)
    assert pn.value == 2
    assert decode(pn.to_json()) == pn
    assert GCounter({"a": 0}) == GCounter()  # zero slots are not kept


def test_register_keeps_the_greater_stamp() -> None:
    clock = HybridClock("a", lambda: 100)
    first = LWWRegister().set({"v": 1}, clock)
    second = first.set({"v": 2}, clock)
    assert second.stamp is not None and first.stamp is not None
    assert second.stamp > first.stamp
    assert first.merge(second).value == {"v": 2} == second.merge(first).value
    assert LWWRegister.from_json(second.to_json()) == second
    assert second.to_json()["stamp"] == [100, 1, "a"]


def test_or_set() -> None:
    s = ORSet().add("a", "x").add("a", "y").remove("x")
    assert s.value == {"y"} and "y" in s and len(s) == 1 and list(s) == ["y"]
    assert s.remove("absent") is s
    assert ORSet.from_json(s.to_json()) == s
    assert s.to_json()["clock"] == {"a": 2}  # the removed add is remembered by the clock only


def test_text_edits_in_code_points() -> None:
    text = Text.of("a", "héllo 😀 world")
    assert text.insert("b", 7, "X").value == "héllo 😀X world"
    assert text.delete("b", 0, 2).value == "llo 😀 world"

    def several(editor: Any) -> None:
        editor.insert(0, ">> ")
        editor.delete(3, 1)
        editor.insert(len(str(editor)), "!")

    assert text.edit("c", several).value == ">> éllo 😀 world!"
    assert Text.from_json(text.to_json()) == text


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {"crdt": "nope"},
        {"crdt": "g-counter"},
        {"crdt": "g-counter", "counts": {"a": -1}},
        {"crdt": "g-counter", "counts": {"a": True}},
        {"crdt": "g-counter", "counts": {"": 1}},
        {"crdt": "g-counter", "counts": {"a": 1}, "extra": 1},
        {"crdt": "pn-counter", "p": {}, "n": []},
        {"crdt": "lww-register", "value": 1, "stamp": None},
        {"crdt": "lww-register", "value": 1, "stamp": [1, 2]},
        {"crdt": "lww-register", "value": 1, "stamp": [1, -2, "a"]},
        {"crdt": "or-set", "clock": {"a": 1}, "entries": {"x": [["a", 2]]}},
        {"crdt": "or-set", "clock": {"a": 1}, "entries": {"x": [["a", 1]], "y": [["a", 1]]}},
        {"crdt": "or-set", "clock": {"a": 1}, "entries": {"x": [["a", 0]]}},
        {"crdt": "or-set", "clock": {}, "entries": {"x": 3}},
        {"crdt": "text", "update": "not base64!"},
        {"crdt": "text", "update": "////"},
        {"crdt": "text", "update": 5},
    ],
)
def test_malformed_json_is_a_bad_request(data: Any) -> None:
    with pytest.raises(BadRequest):
        decode(data)


def test_bad_operations_are_bad_requests() -> None:
    bad: list[Callable[[], object]] = [
        lambda: GCounter().increment("a", -1),
        lambda: GCounter().increment("a", 1.5),  # type: ignore[arg-type]
        lambda: GCounter().increment("", 1),
        lambda: PNCounter().increment("a\n", 1),
        lambda: LWWRegister().set(float("nan"), HybridClock("a")),
        lambda: ORSet().add("a", 3),  # type: ignore[arg-type]
        lambda: Text().insert("a", 1, "x"),
        lambda: Text.of("a", "xy").delete("a", 1, 5),
        lambda: Timestamp(-1, 0, "a"),
        lambda: merge_json(GCounter().to_json(), PNCounter().to_json()),
    ]
    for call in bad:
        with pytest.raises(BadRequest):
            call()
