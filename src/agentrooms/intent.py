"""Conditional intents: writes and appends that apply only while predicates hold.

An :class:`Intent` is plain data (it can be queued and sent over the wire): predicates
(:class:`Where`) over records, and what to write if they all hold.
:func:`agentrooms.commit.apply_intent` commits it, so the predicates are checked
atomically with the write: the versions of the records they read are compared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrooms.errors import BadRequest, InvalidTransition
from agentrooms.store.types import JSON, Append, Write
from agentrooms.view import Change, View

__all__ = ["Intent", "Where", "intent_payload", "intent_transition"]

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: bool(a == b),
    "!=": lambda a, b: bool(a != b),
    "<": lambda a, b: bool(a < b),
    "<=": lambda a, b: bool(a <= b),
    ">": lambda a, b: bool(a > b),
    ">=": lambda a, b: bool(a >= b),
    "in": lambda a, b: bool(a in b),
}
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Where:
    """A predicate over one record: ``Where("task/tax", "status", "==", "done")``.

    ``path`` is a dotted path into the value (``None``: the whole value). ``op`` is one
    of ``== != < <= > >= in`` or ``exists`` / ``absent`` (the record, or the field when
    a path is given). Plain data, so intents can be queued and sent over the wire.
    """

    key: str
    path: str | None = None
    op: str = "exists"
    value: JSON = None

    def __post_init__(self) -> None:
        if self.op not in _OPS and self.op not in ("exists", "absent"):
            raise BadRequest(f"unknown predicate operator {self.op!r}")

    def holds(self, view: View) -> bool:
        found: Any = _MISSING if not view.exists(self.key) else view.get(self.key)
        for part in self.path.split(".") if self.path else []:
            found = found.get(part, _MISSING) if isinstance(found, dict) else _MISSING
        if self.op in ("exists", "absent"):
            return (found is not _MISSING) == (self.op == "exists")
        if found is _MISSING:
            return False
        try:
            return _OPS[self.op](found, self.value)
        except TypeError:
            return False

    def __str__(self) -> str:
        target = self.key + (f".{self.path}" if self.path else "")
        tail = "" if self.op in ("exists", "absent") else f" {self.value!r}"
        return f"{target} {self.op}{tail}"


@dataclass(frozen=True, slots=True)
class Intent:
    """Writes and appends that apply only while every predicate holds, checked
    atomically with the write (the versions of the predicate records are compared)."""

    when: Sequence[Where]
    writes: Sequence[Write] = ()
    appends: Sequence[Append] = ()


def intent_transition(view: View, intent: Intent) -> Change:
    failed = [str(p) for p in intent.when if not p.holds(view)]
    if failed:
        raise InvalidTransition(f"precondition failed: {', '.join(failed)}")
    return Change(writes=intent.writes, appends=intent.appends, result=None)


def intent_payload(intent: Intent) -> JSON:
    """A JSON form of the intent, so a reused command id with another intent is caught."""
    return {
        "when": [[p.key, p.path, p.op, p.value] for p in intent.when],
        "writes": [{"op": type(w).__name__, **dataclasses.asdict(w)} for w in intent.writes],
        "appends": [[a.type, a.data] for a in intent.appends],
    }
