"""Tool results for a model: compact JSON on success, and on failure a typed error whose
text starts with the error's ``code`` and says what to do next.

Every failure is an MCP *tool error* (``isError: true``, so the model reads it and the
call is not mistaken for a protocol fault) with two faces:

* text: ``"<type>: <what happened> — <what to do next>"``, e.g. ``version_conflict: the
  document changed, it is now version 8 — read it again, re-apply your change, and write
  with version 8``;
* structured content: ``{"error": {"type", "message", "details"}}``, the envelope the HTTP
  surface answers with (``type`` is :attr:`AgentroomsError.code`).
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_types import CallToolResult, TextContent
from pydantic import ValidationError

from agentrooms.errors import (
    AgentroomsError,
    ContentionExhausted,
    CursorCompacted,
    Forbidden,
    Held,
    IdempotencyMismatch,
    InvalidTransition,
    LeaseHeld,
    LockHeld,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RequestError,
    StaleFence,
    StoreUnavailable,
    VersionConflict,
)

__all__ = [
    "Hint",
    "Verbatim",
    "compact",
    "document_conflict",
    "dumps",
    "error_result",
    "hint_for",
    "lost_lock",
    "ok_result",
    "validation_hint",
    "verbatim",
]


@dataclass(frozen=True, slots=True)
class Verbatim:
    """A value of the caller's (a payload, a document, event data) that :func:`compact`
    passes through untouched, its nulls included."""

    value: Any


def verbatim(value: Any) -> Verbatim | None:
    """``value`` kept as it is, or ``None`` (the member is left out) when it is null."""
    return None if value is None else Verbatim(value)


def compact(value: Any) -> Any:
    """``value`` without ``None`` members of objects (lists keep their items); what is
    wrapped in :class:`Verbatim` is returned as it is."""
    if isinstance(value, Verbatim):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): compact(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [compact(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def ok_result(value: Mapping[str, Any]) -> CallToolResult:
    """A successful call: the same compact JSON as text and as structured content."""
    body = compact(value)
    text = TextContent(type="text", text=dumps(body))
    return CallToolResult(content=[text], structured_content=body)


@dataclass(frozen=True, slots=True)
class Hint:
    """A typed failure as the model sees it."""

    type: str
    what: str  # what happened
    next: str  # what to do next
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def message(self) -> str:
        return f"{self.what} — {self.next}"

    @property
    def text(self) -> str:
        return f"{self.type}: {self.message}"


def error_result(hint: Hint) -> CallToolResult:
    body = {"error": {"type": hint.type, "message": hint.message, "details": compact(hint.details)}}
    return CallToolResult(
        content=[TextContent(type="text", text=hint.text)], structured_content=body, is_error=True
    )


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def _subject(key: str) -> tuple[str, str]:
    """``("task", "tax")`` for ``task/tax``; ``("lock", "deploy")`` for ``lockfence/deploy``."""
    kind, _, name = key.partition("/")
    return {"lockfence": "lock", "doc": "document"}.get(kind, kind), name


#: what to call to see what exists, by what a ``not_found`` is missing
LISTS = {
    "room": "call list_rooms to see the rooms you may enter",
    "task": "call read_plan to see the tasks and their ids",
    "document": "call list_documents to see the documents (write_document with version 0 "
    "creates one)",
    "lock": "call list_locks to see the held locks",
    "events": "call join_room to see where you stand in the log",
}


def hint_for(
    exc: AgentroomsError,
    *,
    expires_in: float | None = None,
    yours: bool = False,
    missing: str = "task",
) -> Hint:
    """The hint for a library error. ``expires_in``: seconds until a held lease or lock
    expires (when the caller looked it up); ``yours``: the caller itself holds it;
    ``missing``: what a ``not_found`` is missing (a key of :data:`LISTS`)."""
    details = dict(exc.details())
    what = str(exc)
    if isinstance(exc, VersionConflict):
        return Hint(
            exc.code,
            f"another write won ({what})",
            "read the current state again, recompute your change from it, and retry",
            details,
        )
    if isinstance(exc, StaleFence):
        kind, name = _subject(exc.key)
        current = "unknown" if exc.current is None else str(exc.current)
        if kind == "task":
            return Hint(
                exc.code,
                f"your lease on task {name!r} was taken over or ended "
                f"(your fence {exc.fence}, current {current})",
                "discard your work on it (do not complete it) and claim another task",
                details,
            )
        return Hint(
            exc.code,
            f"your grant of {kind} {name!r} is no longer current "
            f"(your fence {exc.fence}, current {current})",
            f"discard what you did under it; acquire the {kind} again before writing",
            details,
        )
    if isinstance(exc, Held):
        return _held(exc, details, expires_in, yours)
    if isinstance(exc, RateLimited):
        return Hint(
            exc.code,
            "too many calls",
            f"wait {_seconds(exc.retry_after)}, then repeat the same call (do not re-read first)",
            details,
        )
    if isinstance(exc, InvalidTransition):
        return Hint(
            exc.code,
            what,
            "this call cannot succeed in the current state, so do not repeat it: "
            "read_plan to see the state, then report it or pick other work",
            details,
        )
    if isinstance(exc, ContentionExhausted):
        return Hint(
            exc.code,
            "too many agents wrote the same records at once",
            "wait a few seconds and retry, or pick other work",
            details,
        )
    if isinstance(exc, StoreUnavailable):
        return Hint(
            exc.code,
            f"the store did not answer ({what}); the outcome is unknown",
            "retry the same call with the same request_id (it will not apply twice)",
            details,
        )
    if isinstance(exc, CursorCompacted):
        return Hint(
            exc.code,
            f"events before #{exc.first_available} were trimmed from the log",
            "re-read what you depend on (read_plan, read_document), then call "
            "read_new_events with skip_to_latest=true",
            details,
        )
    if isinstance(exc, IdempotencyMismatch):
        return Hint(
            exc.code,
            "this request_id was already used for a different call",
            "use a new request_id for a new call (reuse one only to repeat the same call)",
            details,
        )
    if isinstance(exc, NotFound):
        return Hint(exc.code, what, LISTS[missing], details)
    if isinstance(exc, Forbidden):
        return Hint(exc.code, what, "you may not do this; report it to whoever runs you", details)
    if isinstance(exc, PayloadTooLarge):
        return Hint(exc.code, what, "send a smaller value", details)
    if isinstance(exc, RequestError):
        return Hint(exc.code, what, "fix the arguments and call again", details)
    return Hint(exc.code, what, "retry once; if it fails again, report it", details)


def _held(exc: Held, details: dict[str, Any], expires_in: float | None, yours: bool) -> Hint:
    holder = "another agent" if exc.holder is None else repr(exc.holder)
    until = "" if expires_in is None else f", expiring in {_seconds(max(0.0, expires_in))}"
    if expires_in is not None:
        details["expires_in"] = round(max(0.0, expires_in), 3)
    if yours and isinstance(exc, LeaseHeld):
        return Hint(
            exc.code,
            f"you already hold task {exc.name!r}{until}",
            "keep working on it with the fence your claim returned (renew_lease to keep it)",
            details,
        )
    if yours:
        return Hint(
            exc.code,
            f"you already hold lock {exc.name!r}{until}",
            "use the token your acquire_lock returned, or release_lock it first",
            details,
        )
    if isinstance(exc, LeaseHeld):
        return Hint(
            exc.code,
            f"task {exc.name!r} is leased by {holder}{until}",
            "pick other work (claim_task without task_id), or try again after the lease expires",
            details,
        )
    assert isinstance(exc, LockHeld)
    return Hint(
        exc.code,
        f"lock {exc.name!r} is held by {holder}{until}",
        "do other work and try later, or call acquire_lock with wait (seconds) to queue for it",
        details,
    )


def lost_lock(name: str) -> Hint:
    """An ``extend_lock`` whose grant had already expired or changed hands."""
    return Hint(
        "stale_fence",
        f"your grant of lock {name!r} expired or changed hands",
        "discard what you did under it; acquire_lock again before writing",
        {"lock": name},
    )


def document_conflict(name: str, wrote: int, current: int | None) -> Hint:
    """A ``write_document`` that lost: name the version to write with next."""
    details: dict[str, Any] = {"document": name, "your_version": wrote, "current_version": current}
    if current is None:
        return Hint(
            "version_conflict",
            f"document {name!r} does not exist (any more)",
            "write it with version 0 to create it",
            details,
        )
    if wrote == 0:
        return Hint(
            "version_conflict",
            f"document {name!r} already exists, at version {current}",
            f"read it, merge your change into it, and write with version {current}",
            details,
        )
    return Hint(
        "version_conflict",
        f"the document changed, it is now version {current}",
        f"read it again, re-apply your change, and write with version {current}",
        details,
    )


_JSON_TYPES: dict[type, str] = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def validation_hint(tool: str, exc: ValidationError, arguments: Sequence[str] = ()) -> Hint:
    """``bad_request`` naming each argument the call got wrong: an unknown one with the
    closest of the tool's ``arguments`` (or all of them), a value of the wrong JSON type
    with the type it was."""
    problems = []
    for error in exc.errors():
        loc = error.get("loc", ())
        where = ".".join(str(part) for part in loc) or "arguments"
        problem = error.get("msg", "invalid")
        if error.get("type") == "extra_forbidden":
            problem = "unknown argument" if len(loc) == 1 else "unknown field"
            close = difflib.get_close_matches(str(loc[-1]), arguments, n=1, cutoff=0.6)
            if len(loc) == 1 and close:
                problem += f" (did you mean {close[0]}?)"
            elif len(loc) == 1 and arguments:
                problem += f" ({tool} takes {', '.join(arguments)})"
        elif str(error.get("type", "")).endswith("_type"):
            got = _JSON_TYPES.get(type(error.get("input")))
            if got is not None:
                problem += f", not {got}"
        problems.append({"argument": where, "problem": problem})
    listed = "; ".join(f"{p['argument']}: {p['problem']}" for p in problems)
    return Hint(
        "bad_request",
        f"invalid arguments for {tool} ({listed})",
        "fix those arguments and call again",
        {"errors": problems},
    )
