"""``agentrooms task``, ``doc``, ``presence`` and ``locks`` (``events``: cli_events.py):
one room's work from the command line, on a store (``--url``) or through a server (``--server``, the
token in ``$AGENTROOMS_TOKEN``).

Each command is written once against the room API that the library's
:class:`~agentrooms.rooms.Room` and the client's :class:`~agentrooms.client.Room` share,
so it means the same on both. On a store the acting agent is ``--agent``; through a
server it is the token's (``--agent`` may be left out; naming another is ``403``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentrooms.cli_common import (
    DEFAULT_URL,
    EXIT_USAGE,
    JsonOption,
    RoomArg,
    ServerOption,
    UrlOption,
    WaitOption,
    _in_room,
    _list_in_room,
    emit_json,
    fail,
    literal,
    say,
)
from agentrooms.rooms import Lease, Room, TaskSpec

if TYPE_CHECKING:
    from agentrooms.client import Room as RemoteRoom

task_app = typer.Typer(help="Add, claim and finish a room's tasks.", no_args_is_help=True)
doc_app = typer.Typer(help="Read and write a room's versioned documents.", no_args_is_help=True)
presence_app = typer.Typer(help="Who is in a room.", no_args_is_help=True)
locks_app = typer.Typer(help="Who holds a room's locks.", no_args_is_help=True)

AgentOption = Annotated[
    str | None,
    typer.Option(
        "--agent", help="The acting agent (on a store: required; on a server: the token's)"
    ),
]
TaskArg = Annotated[str, typer.Argument(help="Task id")]
DocArg = Annotated[str, typer.Argument(help="Document name ([partition/]name)")]


def _agent(agent: str | None, server: str | None) -> str | None:
    """The agent to name: ``--agent``; on a store it must be given."""
    if agent is None and server is None:
        fail("bad_request", "name the acting agent with --agent (or use --server)", EXIT_USAGE)
    return agent


def _value(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        fail("bad_request", f"{what} must be JSON: {exc}", EXIT_USAGE)


def _task_line(task: Any) -> None:
    owner = "" if task.owner is None else f" by {task.owner} (fence {task.fence})"
    say(literal(task.id, "bold"), f"  {task.state}{owner}")


# ------------------------------------------------------------------------------ task


@task_app.command("add")
def task_add(
    room: RoomArg,
    task: TaskArg,
    title: Annotated[str, typer.Option(help="What the task is")] = "",
    dep: Annotated[list[str] | None, typer.Option("--dep", help="A task it waits for")] = None,
    payload: Annotated[str, typer.Option(help="Its payload as JSON")] = "null",
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add one task; prints whether it is ready at once. ``--json``: ``{"ready": [...]}``."""
    spec = TaskSpec(task, title, _value(payload, "--payload"), tuple(dep or ()))

    async def work(handle: Room | RemoteRoom) -> list[str]:
        return await handle.plan.add([spec])

    ready = _in_room(url, server, room, work)
    if as_json:
        emit_json({"ready": ready})
        return
    say("added ", literal(task, "bold"), " (ready)" if task in ready else " (waiting)")


@task_app.command("claim")
def task_claim(
    room: RoomArg,
    task: Annotated[str | None, typer.Argument(help="Task id (default: the next ready)")] = None,
    agent: AgentOption = None,
    ttl: Annotated[float, typer.Option(help="Lease length in seconds")] = 60.0,
    wait: WaitOption = 0.0,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Claim a task under a lease; prints the lease (its fence completes the task).
    ``--json``: ``{"lease": {...}}`` (``null`` when no task is ready). ``--wait S``: wait
    up to S seconds for one (a named task: for it to be claimable)."""
    who = _agent(agent, server)

    async def work(handle: Room | RemoteRoom) -> Lease | None:
        if isinstance(handle, Room):
            assert who is not None
            if task is None:
                return await handle.plan.claim_next(who, ttl=ttl, wait=wait)
            return await handle.plan.claim(task, who, ttl=ttl, wait=wait)
        if task is None:
            return await handle.plan.claim_next(who, ttl=ttl, wait=wait)
        return await handle.plan.claim(task, who, ttl=ttl, wait=wait)

    lease = _in_room(url, server, room, work)
    if as_json:
        emit_json({"lease": lease})
        return
    if lease is None:
        say("no task is ready")
        return
    say("claimed ", literal(lease.task_id, "bold"), f" as {lease.agent}, fence {lease.fence}")


@task_app.command("complete")
def task_complete(
    room: RoomArg,
    task: TaskArg,
    fence: Annotated[int, typer.Option(help="The lease's fencing token")],
    result: Annotated[str, typer.Option(help="The result as JSON")] = "null",
    agent: AgentOption = None,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Record the result of a task held under the lease with ``--fence``
    (``stale_fence``, exit 5, if that lease is no longer current)."""
    value = _value(result, "--result")

    async def work(handle: Room | RemoteRoom) -> Any:
        lease = Lease(room, task, _agent(agent, server) or "", fence, 0.0)
        return await handle.plan.complete(lease, value)

    done = _in_room(url, server, room, work)
    if as_json:
        emit_json({"task": done})
        return
    _task_line(done)


@task_app.command("list")
def task_list(
    room: RoomArg,
    status: Annotated[str | None, typer.Option(help="Only tasks with this status")] = None,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """The room's tasks in id order. ``--json``: ``{"tasks": [...]}``."""

    _list_in_room(
        url, server, room, lambda handle: handle.plan.tasks(status), "tasks", as_json, _task_line
    )


# ------------------------------------------------------------------------------- doc


@doc_app.command("get")
def doc_get(
    room: RoomArg,
    name: DocArg,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print a document's value (JSON) and version. ``--json``: ``{"name", "value",
    "version"}``."""

    async def work(handle: Room | RemoteRoom) -> Any:
        return await handle.docs.get(name)

    doc = _in_room(url, server, room, work)
    if as_json:
        emit_json(doc)
        return
    say(f"version {doc.version}: ", json.dumps(doc.value, ensure_ascii=False))


@doc_app.command("put")
def doc_put(
    room: RoomArg,
    name: DocArg,
    value: Annotated[str, typer.Argument(help="The new value as JSON")],
    if_match: Annotated[
        int | None, typer.Option("--if-match", help="Write only over this version")
    ] = None,
    create: Annotated[bool, typer.Option("--create", help="Write only if absent")] = False,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write a document under a condition: ``--if-match VERSION`` or ``--create``
    (``version_conflict``, exit 5, when it does not hold)."""
    if (if_match is None) == (not create):
        fail("bad_request", "give exactly one of --if-match VERSION or --create", EXIT_USAGE)
    data = _value(value, "the value")

    async def work(handle: Room | RemoteRoom) -> Any:
        return await handle.docs.put(name, data, if_match=if_match, create_only=create)

    doc = _in_room(url, server, room, work)
    if as_json:
        emit_json(doc)
        return
    say("wrote ", literal(name, "bold"), f" at version {doc.version}")


@doc_app.command("list")
def doc_list(
    room: RoomArg,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """The room's documents by name. ``--json``: ``{"documents": [...]}``."""

    def line(d: Any) -> None:
        say(literal(d.name, "bold"), f"  version {d.version}")

    _list_in_room(url, server, room, lambda h: h.docs.list(), "documents", as_json, line)


# ----------------------------------------------------------------- presence, locks


@presence_app.command("list")
def presence_list(
    room: RoomArg,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Members whose heartbeat has not expired. ``--json``: ``{"members": [...]}``."""

    def line(m: Any) -> None:
        say(literal(m.agent, "bold"), "  ", m.status)

    _list_in_room(
        url, server, room, lambda handle: handle.presence.who_is_online(), "members", as_json, line
    )


@locks_app.command("show")
def locks_show(
    room: RoomArg,
    name: Annotated[str, typer.Argument(help="Lock name")],
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Who holds the lock and who waits. ``--json``: ``{"name", "holder", "waiters"}``."""

    async def work(handle: Room | RemoteRoom) -> tuple[Any, list[Any]]:
        return await handle.locks.holder(name), list(await handle.locks.waiters(name))

    holder, waiters = _in_room(url, server, room, work)
    if as_json:
        emit_json({"name": name, "holder": holder, "waiters": waiters})
        return
    if holder is None:
        say(literal(name, "bold"), "  free")
    else:
        say(literal(name, "bold"), f"  held by {holder.owner} (fence {holder.fence})")
    for w in waiters:
        say("  waiting: ", w.owner)
