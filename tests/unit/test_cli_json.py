"""``--json`` on every read command, and ``plan show`` drawing a DAG without repeating
shared dependencies (in-process with typer's runner, against a real SQLite store)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrooms.cli import app
from agentrooms.cli_rooms import MAX_DEPTH
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.store import open_store

runner = CliRunner()
MODULE = "tests.conformance.sourcing_workers"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def seed(url: str, room: str, specs: list[TaskSpec], claim: str | None = None) -> None:
    async def work() -> None:
        store = await open_store(url)
        try:
            r = await Rooms(store).create(room, "for the tests")
            await r.plan.add(specs)
            if claim is not None:
                await r.plan.claim(claim, "agent-a", ttl=600)
            await r.events.post("note", {"text": "héllo"})
        finally:
            await store.close()

    asyncio.run(work())


def parse(stdout: str) -> Any:
    """The one JSON document stdout holds (``json.loads`` refuses anything around it)."""
    return json.loads(stdout)


# ---------------------------------------------------------------------------- the DAG

DIAMOND = [
    TaskSpec("a"),
    TaskSpec("b", deps=["a"]),
    TaskSpec("c", deps=["a"]),
    TaskSpec("d", deps=["b", "c"]),
]


def nodes(out: str, task_id: str) -> int:
    """How many times ``task_id`` is drawn as a node (a status, then the id)."""
    return len(re.findall(rf"(ready|pending|claimed|done|failed|cancelled)\s+{task_id}\b", out))


def test_plan_show_draws_a_diamond_once_per_task(url: str) -> None:
    seed(url, "diamond", DIAMOND)
    code, out, err = run("plan", "show", "diamond", "--url", url)
    assert (code, err) == (0, "")
    assert all(nodes(out, t) == 1 for t in "abcd"), out
    assert out.count("also d (shown above)") == 1
    assert len(out.splitlines()) == 6  # the header, four tasks, one back-reference


def test_plan_show_of_a_wide_shared_dependency_plan_stays_short(url: str) -> None:
    """Three layers of five, each task waiting for every task of the layer before: drawn
    as a tree this is 155 lines; as a DAG, 15 nodes and one back-reference line for
    each task whose dependents were drawn before."""
    layers = [[f"l{n}t{i}" for i in range(5)] for n in range(3)]
    specs = [TaskSpec(t) for t in layers[0]]
    for before, layer in itertools.pairwise(layers):
        specs += [TaskSpec(t, deps=before) for t in layer]
    seed(url, "wide", specs)
    code, out, err = run("plan", "show", "wide", "--url", url)
    assert (code, err) == (0, "")
    assert all(nodes(out, t) == 1 for layer in layers for t in layer), out
    lines = out.splitlines()
    assert len(lines) == 1 + 15 + 8, out  # header, tasks, back-references of 8 of them
    assert sum("(shown above)" in line for line in lines) == 8


def test_plan_show_json_lists_every_task_once(url: str) -> None:
    seed(url, "diamond", DIAMOND, claim="a")
    code, out, err = run("plan", "show", "diamond", "--url", url, "--json")
    assert (code, err) == (0, "")
    doc = parse(out)
    assert doc["room"] == "diamond" and [t["id"] for t in doc["tasks"]] == list("abcd")
    a = doc["tasks"][0]
    assert a["status"] == "claimed" and a["owner"] == "agent-a" and a["fence"] == 1
    assert 590 < a["lease_remaining"] <= 600 and a["lease_expires"] > doc["now"]
    assert doc["tasks"][3]["deps"] == ["b", "c"] and doc["tasks"][3]["lease_remaining"] is None


# ------------------------------------------------------------ --json on every read command


def test_every_read_command_prints_one_json_document(url: str) -> None:
    """Each read command in ``agentrooms --help`` (rooms list, plan show, tail, tokens
    list, doctor, migrate's status) with ``--json``: stdout parses as JSON and carries
    what the store holds."""
    seed(url, "r1", DIAMOND, claim="a")
    assert run("tokens", "mint", "agent-a", "--url", url, "--rooms", "r1")[0] == 0

    code, out, _ = run("rooms", "list", "--url", url, "--json")
    rooms = parse(out)["rooms"]
    assert code == 0 and [r["name"] for r in rooms] == ["r1"]
    assert rooms[0]["description"] == "for the tests" and rooms[0]["archived"] is False

    code, out, _ = run("plan", "show", "r1", "--url", url, "--json")
    assert code == 0 and len(parse(out)["tasks"]) == 4

    code, out, _ = run("tail", "r1", "--url", url, "--after", "0", "--count", "3", "--json")
    events = [json.loads(line) for line in out.splitlines()]  # a stream: one per line
    assert code == 0 and [e["seq"] for e in events] == [1, 2, 3]
    assert events[0]["type"] == "room.created" and set(events[0]) == {
        "seq",
        "type",
        "data",
        "time",
        "author",
        "to",
        "to_roles",
    }

    code, out, _ = run("tokens", "list", "--url", url, "--json")
    tokens = parse(out)["tokens"]
    assert code == 0 and [t["agent"] for t in tokens] == ["agent-a"]
    assert tokens[0]["rooms"] == ["r1"] and "secret" not in out and "hash" not in out

    code, out, _ = run("doctor", "--url", url, "--json")
    doctor = parse(out)
    assert code == 0 and doctor["backend"] == "sqlite" and doctor["warnings"] == []
    code, out, _ = run("doctor", "--url", url + "?synchronous=NORMAL", "--json")
    assert code == 1 and parse(out)["warnings"]  # same exit code as without --json

    old, new = f"{MODULE}:COUNTS_V1", f"{MODULE}:PRIORITIES_V2"
    code, out, _ = run("migrate", "r1", old, new, "--url", url, "--json")
    status = parse(out)
    assert (
        code == 0 and status["phase"] is None and status["head"] == 7
    )  # created, 4 added, granted, note


def test_json_read_of_an_empty_store_is_still_json(url: str) -> None:
    for args in (("rooms", "list"), ("tokens", "list")):
        code, out, err = run(*args, "--url", url, "--json")
        assert (code, err) == (0, "")
        assert parse(out) in ({"rooms": []}, {"now": parse(out).get("now"), "tokens": []})


def test_json_errors_stay_on_stderr(url: str) -> None:
    code, out, err = run("plan", "show", "nowhere", "--url", url, "--json")
    assert (code, out) == (4, "") and err.startswith("not_found: ")


def test_plan_show_of_a_long_chain_stays_within_a_terminal(url: str) -> None:
    """A chain deeper than ``MAX_DEPTH`` goes on as new top-level entries: every task
    once, no line indented past the limit (and no recursion to run out of)."""
    chain = [TaskSpec("c0000")] + [
        TaskSpec(f"c{i:04d}", deps=[f"c{i - 1:04d}"]) for i in range(1, 1200)
    ]
    for start in range(0, len(chain), 500):
        part = chain[start : start + 500]
        if start == 0:
            seed(url, "chain", part)
        else:
            add(url, "chain", part)
    code, out, err = run("plan", "show", "chain", "--url", url)
    assert (code, err) == (0, "")
    assert all(nodes(out, f"c{i:04d}") == 1 for i in range(1200))
    indents = [len(line) - len(line.lstrip("│├└─ ")) for line in out.splitlines()]
    assert max(indents) <= 4 * (MAX_DEPTH + 1)
    assert out.count("(continued below)") == 1200 // MAX_DEPTH - (1200 % MAX_DEPTH == 0)


def add(url: str, room: str, specs: list[TaskSpec]) -> None:
    async def work() -> None:
        store = await open_store(url)
        try:
            await Rooms(store).room(room).plan.add(specs)
        finally:
            await store.close()

    asyncio.run(work())
