"""LangGraph's own conformance suite (``langgraph-checkpoint-conformance``) on every backend.

The suite is a function, ``validate``, run on a factory registered with
``checkpointer_test``: each capability gets a fresh saver, here on one room of the
backend. Every capability must be detected and pass: the base ones (put, put_writes,
get_tuple, list, delete_thread) and the extended ones (copy_thread, prune,
delete_for_runs).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.checkpoint.conformance.spec import (
    test_copy_thread,
    test_delete_for_runs,
    test_delete_thread,
    test_get_tuple,
    test_list,
    test_prune,
    test_put,
    test_put_writes,
)

from agentrooms.integrations.langgraph import AgentroomsSaver
from tests.conftest import Backend


async def test_the_conformance_suite_passes(backend: Backend, room: str) -> None:
    store = await backend.open()
    failed: list[str] = []

    @checkpointer_test(name=f"AgentroomsSaver[{backend.name}]")
    async def saver() -> AsyncIterator[AgentroomsSaver]:
        yield AgentroomsSaver(store, owner="conformance", room=room)

    def noted(capability: str, test: str, passed: bool, error: str | None) -> None:
        if not passed:
            failed.append(f"{capability}/{test}:\n{error}")

    report = await validate(saver, progress=ProgressCallbacks(on_test_result=noted))
    assert failed == []
    assert report.passed_all(), report.to_dict()
    results = [report.results[c.value] for c in ALL_CAPABILITIES]
    assert all(r.detected and r.passed for r in results)
    ran = sum(r.tests_passed for r in results)
    assert ran == len(
        test_put.ALL_PUT_TESTS
        + test_put_writes.ALL_PUT_WRITES_TESTS
        + test_get_tuple.ALL_GET_TUPLE_TESTS
        + test_list.ALL_LIST_TESTS
        + test_delete_thread.ALL_DELETE_THREAD_TESTS
        + test_copy_thread.ALL_COPY_THREAD_TESTS
        + test_prune.ALL_PRUNE_TESTS
        + test_delete_for_runs.ALL_DELETE_FOR_RUNS_TESTS
    )
