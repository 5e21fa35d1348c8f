"""Event types, upcasters, aggregate definitions and the fold, without a store."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrooms.errors import BadRequest, InvalidTransition
from agentrooms.sourcing import Aggregate, DomainEvent, EventType, Rows, Upcasters, domain_event
from agentrooms.store import Event
from tests.conformance import sourcing_workers as w

names = st.from_regex(r"[A-Za-z][A-Za-z0-9_.:-]{0,20}", fullmatch=True)


@given(names, st.integers(1, 10**9 - 1))
def test_event_type_text_round_trips(name: str, version: int) -> None:
    kind = EventType(name, version)
    assert EventType.parse(str(kind)) == kind
    assert str(kind) == f"{name}/v{version}"


@pytest.mark.parametrize(
    "text", ["", "Name", "Name/v0", "Name/v-1", "Name/2", "1Name/v1", "Na me/v1", "A/B/v1", 3]
)
def test_bad_event_types(text: Any) -> None:
    with pytest.raises(BadRequest):
        EventType.parse(text)


def test_upcasters_chain_and_report_what_is_missing() -> None:
    old = DomainEvent.of("TaskPriorityChanged/v1", {"priority": "high"})
    assert w.UPCASTERS.upcast(old, 3) == DomainEvent.of(
        "TaskPriorityChanged/v3", {"priority": 3, "reason": "unknown"}
    )
    assert w.UPCASTERS.upcast(old, 2).data == {"priority": 3}
    assert w.UPCASTERS.upcast(old) == w.UPCASTERS.upcast(old, 3)  # as far as the chain goes
    assert old.data == {"priority": "high"}  # the stored event is untouched
    assert w.UPCASTERS.latest("TaskPriorityChanged") == 3
    with pytest.raises(InvalidTransition, match="newer"):
        w.UPCASTERS.upcast(DomainEvent.of("TaskPriorityChanged/v3", {}), 2)
    with pytest.raises(InvalidTransition, match="no upcaster from X/v1"):
        Upcasters().upcast(DomainEvent.of("X/v1"), 2)
    with pytest.raises(BadRequest, match="already registered"):
        w.UPCASTERS.add("TaskPriorityChanged", 1, lambda d: d)


def test_aggregate_definitions_are_checked() -> None:
    def fold(state: int, event: DomainEvent) -> int:
        return state

    bad: list[dict[str, Any]] = [
        {"name": "has/slash"},
        {"events": {}},
        {"events": {"A": 0}},
        {"upcasters": Upcasters({("A", 2): lambda d: d})},  # past the version read (v2)
        {"snapshot_every": -1},
        {"snapshot_every": True},
        {"schema": 0},
    ]
    for override in bad:
        spec: dict[str, Any] = {"name": "agg", "initial": int, "fold": fold, "events": {"A": 2}}
        with pytest.raises(BadRequest):
            Aggregate(**{**spec, **override})


def test_aggregate_reads_stored_events_as_the_fold_knows_them() -> None:
    stored = {"type": "TaskPriorityChanged/v1", "data": {"priority": "low"}}
    assert w.TASK.read(stored).data == {"priority": 1, "reason": "unknown"}
    for broken in ({"type": "Nope/v1", "data": 1}, {"type": "TaskNoted/v1"}, "x"):
        with pytest.raises(InvalidTransition):
            w.TASK.read(broken)


events = st.lists(
    st.one_of(
        st.builds(w.noted, st.integers() | st.text(max_size=3)),
        st.builds(
            lambda p, r: DomainEvent.of("TaskPriorityChanged/v3", {"priority": p, "reason": r}),
            st.integers(1, 3),
            st.text(max_size=3),
        ),
        st.builds(lambda a: DomainEvent.of("TaskAssigned/v1", {"agent": a}), st.text(max_size=3)),
    ),
    max_size=40,
)


@given(events, st.data())
def test_snapshot_at_any_point_plus_tail_equals_full_replay(
    history: list[DomainEvent], data: st.DataObject
) -> None:
    history = [w.created("t"), *history]
    cut = data.draw(st.integers(0, len(history)))
    snapshot = json.loads(json.dumps(w.TASK.encode(w.TASK.replay(history[:cut]))))
    resumed = w.TASK.replay(history[cut:], w.TASK.decode(snapshot))
    assert resumed == w.TASK.replay(history)


def test_domain_events_are_recognised_in_the_room_log() -> None:
    data = {"aggregate": "task", "id": "t1", "n": 4, "data": {"x": 1}}
    found = domain_event(Event(9, "TaskNoted/v1", data, 1.5))
    assert found is not None and (found.seq, found.n, found.id) == (9, 4, "t1")
    assert found.event == DomainEvent.of("TaskNoted/v1", {"x": 1})
    for other in (
        Event(1, "room.created", data, 0),
        Event(1, "TaskNoted/v1", {"aggregate": "task"}, 0),
        Event(1, "TaskNoted/v1", {**data, "n": 0}, 0),
        Event(1, "TaskNoted/v1", "text", 0),
    ):
        assert domain_event(other) is None


def test_rows_see_their_own_writes() -> None:
    stored = {"p/a": 1}
    rows = Rows(stored.get, "p/")
    assert rows.get("a") == 1 and rows.get("b", 0) == 0
    rows.put("b", 2)
    rows.delete("a")
    assert rows.get("a") is None and rows.get("b") == 2
    assert [type(x).__name__ for x in rows.writes()] == ["Put", "Delete"]
    with pytest.raises(BadRequest):
        rows.put("c", None)
    with pytest.raises(BadRequest):
        rows.get("")
