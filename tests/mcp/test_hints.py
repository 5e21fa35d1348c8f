"""Every library error becomes a tool error whose text starts with its type and says
what to do next (pure: no server)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp_types import TextContent

from agentrooms import errors
from agentrooms.server.mcp.hints import LISTS, compact, error_result, hint_for, ok_result
from agentrooms.server.mcp.server import AgentroomsMCP
from agentrooms.store.memory import MemoryStore

CASES: list[tuple[errors.AgentroomsError, str]] = [
    (errors.VersionConflict({"doc/x": 4}), "re-read|read the current state again"),
    (errors.StaleFence("lockfence/db", 2, 3), "acquire the lock again"),
    (errors.StaleFence("task/tax", 3, 4), "discard your work"),
    (errors.InvalidTransition("task 't' is done"), "do not repeat it"),
    (errors.ContentionExhausted(5, 1.0, ["task/t"]), "wait a few seconds"),
    (errors.IdempotencyMismatch("reused"), "new request_id"),
    (errors.LeaseHeld("t", "bob"), "pick other work"),
    (errors.LockHeld("db", None), "acquire_lock with wait"),
    (errors.RateLimited(2.5), "wait 2.5 s"),
    (errors.StoreUnavailable("down"), "same request_id"),
    (errors.CursorCompacted("r", 3, 10), "skip_to_latest=true"),
    (errors.BadRequest("no"), "fix the arguments"),
    (errors.PayloadTooLarge("big"), "smaller"),
    (errors.NotFound("gone"), "read_plan"),
    (errors.Forbidden("no scope"), "report it"),
]


@pytest.mark.parametrize(("exc", "advice"), CASES, ids=[type(e).__name__ for e, _ in CASES])
def test_each_error_kind_has_its_type_and_a_next_step(
    exc: errors.AgentroomsError, advice: str
) -> None:
    result = error_result(hint_for(exc))
    assert result.is_error
    block = result.content[0]
    assert isinstance(block, TextContent)
    assert block.text.startswith(f"{exc.code}: ")
    assert " — " in block.text
    assert any(part in block.text for part in advice.split("|")), block.text
    assert result.structured_content is not None
    error = result.structured_content["error"]
    assert error["type"] == exc.code and block.text == f"{exc.code}: {error['message']}"
    json.dumps(result.structured_content)


def test_success_is_compact_json_without_nulls() -> None:
    body = {"a": None, "b": [1, None, {"c": None, "d": 2}], "e": {"f": None}}
    assert compact(body) == {"b": [1, None, {"d": 2}], "e": {}}
    result = ok_result({"x": 1, "y": None})
    block = result.content[0]
    assert isinstance(block, TextContent)
    assert block.text == '{"x":1}' and result.structured_content == {"x": 1}


@pytest.mark.parametrize("missing", sorted(LISTS))
def test_each_not_found_points_to_a_tool_that_lists(missing: str) -> None:
    hint = hint_for(errors.NotFound("gone"), missing=missing)
    named = hint.next.split()[1]
    assert named in {"list_rooms", "read_plan", "list_documents", "list_locks", "join_room"}
    tools = {t.name for t in build_mcp_tools()}
    assert named in tools


def build_mcp_tools() -> list[Any]:
    server = AgentroomsMCP(MemoryStore(), principal=None)
    return list(server._tool_manager.list_tools())
