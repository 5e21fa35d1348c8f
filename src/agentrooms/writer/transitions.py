"""The writer's transitions, pure functions of a snapshot: apply one intent, count a
failure, send a poison intent to the dead letters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrooms.commit import Change, View
from agentrooms.errors import BadRequest
from agentrooms.rooms import keys as room_keys
from agentrooms.rooms.locks import Lock
from agentrooms.store.types import JSON, Append, Event, Put, SetRemove, Write
from agentrooms.writer.model import APPLIED, DEAD, QUEUED, REJECTED, QueueKeys, decode_intent


def _field(event: Event, name: str) -> Any:
    return event.data.get(name) if isinstance(event.data, dict) else None


@dataclass(frozen=True, slots=True)
class _Step:
    """One submission, settled by one writer under one grant of the lock."""

    q: QueueKeys
    event: Event
    lock: Lock
    retention: float

    @property
    def id(self) -> str:
        """The intent id (a stray submission without a usable one gets ``seq-<n>``)."""
        try:
            return room_keys.check_name(_field(self.event, "id"), "intent id")
        except BadRequest:
            return f"seq-{self.event.seq}"

    @property
    def item(self) -> str:
        return self.q.item(self.id)

    @property
    def read_keys(self) -> list[str]:
        found = _field(self.event, "keys")
        keys = [k for k in found if isinstance(k, str)] if isinstance(found, list) else []
        return [self.q.cursor, self.item, *keys]

    def change(
        self,
        view: View,
        writes: list[Write],
        kind: str,
        *,
        appends: Sequence[Append] = (),
        stats: dict[str, Any] | None = None,
        **data: JSON,
    ) -> Change:
        """``writes`` plus the cursor's advance, under the lock's fence, with a
        ``wq.<kind>`` event naming the writer and its fence."""
        cursor = view.get(self.q.cursor) or {"seq": 0}
        moved = {**cursor, **(stats or {}), "seq": self.event.seq, "at": view.now}
        head = {"queue": self.q.name, "id": self.id, "seq": self.event.seq}
        by = {"by": self.lock.owner, "fence": self.lock.fence}
        return Change(
            writes=[*writes, Put(self.q.cursor, moved)],
            appends=[*appends, Append(f"wq.{kind}", {**head, **data, **by}, self.lock.owner)],
            requires=[self.lock.guard()],
            result={"status": kind, "at": view.now},
        )

    def consumed(self, view: View) -> bool:
        return int((view.get(self.q.cursor) or {"seq": 0})["seq"]) >= self.event.seq

    def settle(self, view: View, item: dict[str, Any], status: str, reason: JSON) -> list[Write]:
        settled = {**item, "status": status, "reason": reason, "seq": self.event.seq}
        return [
            Put(self.item, {**settled, "at": view.now}, ttl=self.retention),
            SetRemove(self.q.queued, self.id),
        ]


def _apply_intent(view: View, _: None, *, step: _Step, stats: dict[str, Any]) -> Change:
    if step.consumed(view):
        return Change()  # another writer settled it already
    item = view.get(step.item)
    if item is None or item.get("status") != QUEUED:  # a duplicate or stray submission
        skipped = step.change(view, [], "skipped", stats=stats)
        return Change(skipped.writes, skipped.appends, skipped.requires, None)
    intent = decode_intent(item["intent"])
    failed = [str(p) for p in intent.when if not p.holds(view)] or None
    status = REJECTED if failed else APPLIED
    writes = [*([] if failed else intent.writes), *step.settle(view, item, status, failed)]
    appends = [] if failed else list(intent.appends)
    return step.change(view, writes, status, reason=failed, stats=stats, appends=appends)


def _dead_letter(view: View, _: None, *, step: _Step, failures: int, error: Exception) -> Change:
    if step.consumed(view):
        return Change()
    item = view.get(step.item) or {"id": step.id, "intent": None}
    reason = _error(error)
    letter = {"id": step.id, "seq": step.event.seq, "intent": item.get("intent")}
    writes = [
        *step.settle(view, item, DEAD, reason),
        Put(step.q.dead(step.id), {**letter, "reason": reason, "failures": failures}),
    ]
    return step.change(view, writes, DEAD, reason=reason)


def _count_failure(view: View, _: None, *, step: _Step, error: Exception) -> Change:
    item = view.get(step.item)
    if item is None or item.get("status") != QUEUED:
        raise BadRequest("nothing to count the failure on")
    failures = int(item.get("failures", 0)) + 1
    data = {"queue": step.q.name, "id": step.id, "failures": failures, "error": _error(error)}
    return Change(
        writes=[Put(step.item, {**item, "failures": failures, "last_error": _error(error)})],
        appends=[Append("wq.failed", data, step.lock.owner)],
        requires=[step.lock.guard()],
        result=failures,
    )


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)[:1000]}
