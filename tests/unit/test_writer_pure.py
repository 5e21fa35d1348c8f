"""The designated writer's pure parts: the intent codec, the apply transition, the
throughput estimate. No store."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentrooms.commit import Intent, View, Where
from agentrooms.errors import BadRequest
from agentrooms.rooms.locks import Lock
from agentrooms.store.types import (
    Append,
    Delete,
    Event,
    FenceAtMost,
    Put,
    Record,
    SetAdd,
    SetRemove,
    Snapshot,
)
from agentrooms.writer import IntentQueue, decode_intent, encode_intent
from agentrooms.writer import queue as queue_module
from agentrooms.writer.model import QueueKeys
from agentrooms.writer.transitions import _apply_batch, _apply_intent, _Limit, _Step
from agentrooms.writer.worker import _Throughput

Q = QueueKeys("main")
LOCK = Lock("r", "writer.main", "w1", "tok", 4, 0.0, 10.0)


def test_the_codec_round_trips_every_write_kind() -> None:
    intent = Intent(
        [Where("task/t", "status", "==", "done"), Where("flag", op="absent")],
        [Put("a", {"x": [1]}, ttl=5.0), Delete("b"), SetAdd("s", "m"), SetRemove("s", "n")],
        [Append("report.linked", {"uri": "s3://x"})],
    )
    assert decode_intent(encode_intent(intent)) == intent


@pytest.mark.parametrize(
    "payload",
    [
        None,
        {"when": []},
        {"when": [], "writes": [{"op": "explode"}], "appends": []},
        {"when": [{"key": "k", "op": "~"}], "writes": [], "appends": []},
        {"when": [], "writes": [{"op": "put", "key": "wq/main/cursor"}], "appends": []},
        {
            "when": [],
            "writes": [{"op": "set_add", "name": "wq:main:queued", "member": "x"}],
            "appends": [],
        },
        {"when": [], "writes": [{"op": "delete", "key": "lockfence/writer.main"}], "appends": []},
        {"when": [], "writes": [{"op": "delete", "key": "pathx/src/*r1.0"}], "appends": []},
        {"when": [], "writes": [{"op": "put", "key": "pathfence", "value": 1}], "appends": []},
        {"when": [], "writes": [{"op": "put", "key": "_archived", "value": True}], "appends": []},
    ],
)
def test_malformed_or_reserved_intents_are_bad_requests(payload: Any) -> None:
    with pytest.raises(BadRequest):
        decode_intent(payload)


def view(records: dict[str, Any], now: float = 50.0) -> View:
    snap = Snapshot({k: Record(k, v, 3) for k, v in records.items()}, now)
    return View(snap, [Q.cursor, Q.item("i1"), "counter", *records])


def step(seq: int = 9) -> _Step:
    event = Event(seq, "wq.submitted", {"queue": "main", "id": "i1", "keys": ["counter"]}, 40.0)
    return _Step(Q, event, LOCK, 60.0)


def queued(intent: Intent) -> dict[str, Any]:
    return {"id": "i1", "status": "queued", "intent": encode_intent(intent), "failures": 0}


def test_apply_writes_the_intent_its_outcome_and_the_cursor_in_one_change() -> None:
    intent = Intent([Where("counter", "n", "==", 0)], [Put("counter", {"n": 1})], [Append("x")])
    change = _apply_intent(
        view({"counter": {"n": 0}, Q.item("i1"): queued(intent)}),
        None,
        step=step(),
        stats={"rate": 2.0},
    )
    puts = {w.key: w.value for w in change.writes if isinstance(w, Put)}
    assert puts["counter"] == {"n": 1}
    assert puts[Q.cursor] == {"seq": 9, "rate": 2.0, "at": 50.0}
    assert puts[Q.item("i1")]["status"] == "applied" and puts[Q.item("i1")]["seq"] == 9
    assert SetRemove(Q.queued, "i1") in change.writes
    assert list(change.requires) == [FenceAtMost("lockfence/writer.main", 4)]
    assert [a.type for a in change.appends] == ["x", "wq.settled"]
    assert change.appends[-1].data["outcomes"] == [["i1", "applied", 9, 9, None]]
    assert change.appends[-1].data["by"] == "w1" and change.result == {
        "status": "applied",
        "at": 50.0,
    }


def test_a_failed_predicate_is_rejected_without_the_intent_writes() -> None:
    intent = Intent([Where("counter", "n", "==", 5)], [Put("counter", {"n": 6})], [Append("x")])
    change = _apply_intent(
        view({"counter": {"n": 0}, Q.item("i1"): queued(intent)}), None, step=step(), stats={}
    )
    assert "counter" not in {w.key for w in change.writes if isinstance(w, Put)}
    assert [a.type for a in change.appends] == ["wq.settled"]
    assert change.appends[0].data["outcomes"] == [["i1", "rejected", 9, 9, ["counter.n == 5"]]]


def test_a_consumed_submission_changes_nothing() -> None:
    intent = Intent([], [Put("counter", 1)])
    records = {Q.cursor: {"seq": 9}, Q.item("i1"): queued(intent)}
    change = _apply_intent(view(records), None, step=step(9), stats={})
    assert not change.writes and not change.appends and change.result is None


def test_throughput_is_intents_per_second() -> None:
    rate = _Throughput(size=3)
    assert rate.rate() == 0.0
    now = time.monotonic()
    rate._ticks.extend([(now - 2.0, 1), (now - 1.5, 1), (now - 1.0, 2)])
    assert rate.rate() == pytest.approx(2.0, rel=0.05)
    assert rate.rate(4, now) == pytest.approx(4.0, rel=0.05)


def test_a_batch_announces_its_rejections_before_its_applied_outcomes() -> None:
    """Three intents from one read of ``counter``: the first applies; the two others are
    rejected, and their outcomes come first in the batch's settling event, so their
    submitters hear first and head the next batch."""
    ids = ["i1", "i2", "i3"]
    intent = Intent([Where("counter", "n", "==", 0)], [Put("counter", {"n": 1})], [Append("x")])
    records: dict[str, Any] = {"counter": {"n": 0}}
    steps = []
    for seq, i in enumerate(ids, start=7):
        records[Q.item(i)] = {**queued(intent), "id": i}
        data = {"queue": "main", "id": i, "keys": ["counter"]}
        steps.append(_Step(Q, Event(seq, "wq.submitted", data, 40.0), LOCK, 60.0))
    snap = Snapshot({k: Record(k, v, 3) for k, v in records.items()}, 50.0)
    view = View(snap, [Q.cursor, "counter", *(Q.item(i) for i in ids)])
    limit = _Limit(10, 5000, 1 << 20)
    change = _apply_batch(view, None, steps=steps, limit=limit, stats=lambda n: {"rate": n})
    assert [a.type for a in change.appends] == ["x", "wq.settled"]  # one event per batch
    told = [(status, i) for i, status, *_ in change.appends[-1].data["outcomes"]]
    assert told == [("rejected", "i2"), ("rejected", "i3"), ("applied", "i1")]
    puts = {w.key: w.value for w in change.writes if isinstance(w, Put)}
    assert puts["counter"] == {"n": 1} and puts[Q.cursor]["seq"] == 9
    assert puts[Q.cursor]["rate"] == 3
    assert change.result["taken"] == 3
    assert [s["status"] for s in change.result["settled"]] == ["applied", "rejected", "rejected"]
    assert "intent" not in puts[Q.item("i2")]  # a settled record drops the payload


def carried(seq: int, i: str, intent: Intent, place: int | None = None) -> _Step:
    """A submission whose event carries its intent (what ``IntentQueue.submit`` appends),
    retrying the outcome at ``place`` if given."""
    data: dict[str, Any] = {"queue": "main", "id": i, "keys": ["counter"]}
    data["intent"] = encode_intent(intent)
    if place is not None:
        data["place"] = place
    return _Step(Q, Event(seq, "wq.submitted", data, 40.0), LOCK, 60.0)


def test_a_batch_evaluates_retries_at_their_original_place() -> None:
    """i7 and i8 are fresh; i9 retries the outcome whose place was 3: it is evaluated
    first and wins, though submitted last; the cursor still moves past seq 9, and
    every outcome names its place. No intent record is read."""
    intent = Intent([Where("counter", "n", "==", 0)], [Put("counter", {"n": 1})], [Append("x")])
    steps = [carried(7, "i7", intent), carried(8, "i8", intent), carried(9, "i9", intent, 3)]
    assert all(Q.item(s.id) not in s.read_keys for s in steps)
    snap = Snapshot({"counter": Record("counter", {"n": 0}, 3)}, 50.0)
    view = View(snap, [Q.cursor, "counter"])
    change = _apply_batch(
        view, None, steps=steps, limit=_Limit(10, 5000, 1 << 20), stats=lambda n: {}
    )
    told = {i: (status, place) for i, status, _, place, _ in change.appends[-1].data["outcomes"]}
    assert told == {
        "i9": ("applied", 3),
        "i7": ("rejected", 7),
        "i8": ("rejected", 8),
    }
    puts = {w.key: w.value for w in change.writes if isinstance(w, Put)}
    assert puts[Q.cursor]["seq"] == 9 and change.result["taken"] == 3
    assert puts[Q.item("i9")]["place"] == 3 and puts[Q.item("i7")]["place"] == 7
    assert all(SetRemove(Q.queued, i) in change.writes for i in ("i7", "i8", "i9"))


def test_a_place_after_the_submission_itself_is_ignored() -> None:
    intent = Intent([], [Put("counter", 1)])
    assert carried(7, "i7", intent, place=12).place == 7
    assert carried(7, "i7", intent, place=2).place == 2


def test_a_reordered_batch_that_does_not_fit_is_the_prefix_in_log_order() -> None:
    """Three intents, room for two: in place order the retry (seq 9) would come first,
    but a batch must be consecutive submissions, so the batch is seq 7 and 8 in log
    order, and the cursor stops at 8."""
    steps = [
        carried(7, "i7", Intent([], [Put("a", 1)])),
        carried(8, "i8", Intent([], [Put("b", 1)])),
        carried(9, "i9", Intent([], [Put("c", 1)]), place=1),
    ]
    view = View(Snapshot({}, 50.0), [Q.cursor, "counter"])
    limit = _Limit(3, 13, 1 << 20)  # the ops of two of them
    change = _apply_batch(view, None, steps=steps, limit=limit, stats=lambda n: {})
    assert change.result["taken"] == 2
    assert [s["id"] for s in change.result["settled"]] == ["i7", "i8"]
    puts = {w.key: w.value for w in change.writes if isinstance(w, Put)}
    assert puts[Q.cursor]["seq"] == 8 and "c" not in puts


def test_generated_ids_are_unique_and_a_new_prefix_is_drawn_for_a_forked_child() -> None:
    ids = [IntentQueue._named(None)[0] for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(i.startswith("q-") for i in ids)
    queue_module._new_prefix()  # what a forked child runs first (os.register_at_fork)
    fresh = IntentQueue._named(None)[0]
    assert fresh.startswith("q-") and fresh.rsplit("-", 1)[0] != ids[0].rsplit("-", 1)[0]
