"""``agentrooms rooms``, ``plan``, ``tail`` and ``tokens``: the commands that look at and
change what a store holds."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from agentrooms.cli_common import (
    DEFAULT_URL,
    EXIT_NOT_FOUND,
    EXIT_OK,
    JsonOption,
    RoomArg,
    ServerOption,
    UrlOption,
    _remote,
    _run,
    _when,
    console,
    emit_json,
    fail,
    literal,
    say,
    shown_url,
)
from agentrooms.rooms import RoomList, Rooms
from agentrooms.store import Store

if TYPE_CHECKING:
    from agentrooms.client import Client

rooms_app = typer.Typer(help="Create, list, archive and delete rooms.", no_args_is_help=True)
plan_app = typer.Typer(help="Look at a room's plan.", no_args_is_help=True)
tokens_app = typer.Typer(help="Mint, revoke and list API tokens.", no_args_is_help=True)


# ----------------------------------------------------------------------------- rooms


@rooms_app.command("list")
def rooms_list(
    url: UrlOption = DEFAULT_URL,
    archived: Annotated[bool, typer.Option("--archived", help="Include archived rooms")] = False,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most this many rooms (one page)")
    ] = None,
    after: Annotated[
        str | None, typer.Option("--after", help="Rooms whose name sorts after this one")
    ] = None,
    as_json: JsonOption = False,
    server: ServerOption = None,
) -> None:
    """List rooms with their newest event and ready tasks (or say which store has none).
    With ``--server``: the rooms the token may enter.

    ``--limit``/``--after``: one page of rooms by name; the next page's ``--after`` is
    printed (``next_after`` with ``--json``, ``null`` at the end). ``--json``:
    ``{"rooms": [...]}`` (and ``next_after`` when paged), each room's name, description, metadata,
    created_at, archived, last_seq and ready."""
    paged = limit is not None or after is not None
    if server is not None:

        async def remote(client: Client) -> RoomList:
            if paged:
                return await client.rooms.page(limit or 100, after, include_archived=archived)
            return RoomList(await client.rooms.list(include_archived=archived), None)

        page = _remote(server, remote)
    else:
        page = _run(
            url,
            lambda store: (
                Rooms(store).page(
                    limit if limit is not None else store.limits.max_page,
                    after,
                    include_archived=archived,
                )
                if paged
                else _everything(store, archived)
            ),
        )
    infos = page.rooms
    if as_json:
        emit_json({"rooms": infos, "next_after": page.next_after} if paged else {"rooms": infos})
        return
    if not infos:
        where = f"on the server {shown_url(server)}" if server else f"in the store {shown_url(url)}"
        say("no rooms ", where)
        return
    table = Table("room", "description", "events", "ready", "archived")
    for info in infos:
        table.add_row(
            literal(info.name),
            literal(info.description),
            str(info.last_seq),
            str(info.ready),
            "yes" if info.archived else "",
        )
    console.print(table)
    if page.next_after is not None:
        say("more rooms follow: --after ", page.next_after)


async def _everything(store: Store, archived: bool) -> RoomList:
    return RoomList(await Rooms(store).list(include_archived=archived), None)


@rooms_app.command("create")
def rooms_create(
    room: RoomArg,
    url: UrlOption = DEFAULT_URL,
    description: Annotated[str, typer.Option(help="What the room is for")] = "",
    server: ServerOption = None,
) -> None:
    """Create a room."""
    if server is not None:
        _remote(server, lambda client: client.rooms.create(room, description))
        say("created room ", literal(room, "bold"), " on the server ", shown_url(server))
        return
    _run(url, lambda store: Rooms(store).create(room, description))
    say("created room ", literal(room, "bold"), " in the store ", shown_url(url))


@rooms_app.command("archive")
def rooms_archive(room: RoomArg, url: UrlOption = DEFAULT_URL, server: ServerOption = None) -> None:
    """Make a room read-only."""
    if server is not None:
        _remote(server, lambda client: client.rooms.archive(room))
    else:
        _run(url, lambda store: Rooms(store).archive(room))
    say("archived room ", literal(room, "bold"))


@rooms_app.command("delete")
def rooms_delete(
    room: RoomArg,
    url: UrlOption = DEFAULT_URL,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask")] = False,
    server: ServerOption = None,
) -> None:
    """Delete a room and everything in it."""
    if not yes:
        typer.confirm(f"delete room {room!r} and everything in it?", abort=True)
    if server is not None:
        _remote(server, lambda client: client.rooms.delete(room))
    else:
        _run(url, lambda store: Rooms(store).delete(room))
    say("deleted room ", literal(room, "bold"))


# ------------------------------------------------------------------------------ plan


@plan_app.command("show")
def plan_show(
    room: RoomArg,
    url: UrlOption = DEFAULT_URL,
    as_json: JsonOption = False,
    server: ServerOption = None,
) -> None:
    """The plan as a DAG of dependencies, with owners, leases and fencing tokens: each
    task is drawn once, under the first task it waits for; a dependent already drawn
    is named on one ``also ... (shown above)`` line instead of being drawn again. A
    claimed task whose lease ran out (by the store's clock) shows as expired, not held.

    ``--json``: ``{"room", "now", "tasks": [...]}``, every task's stored fields with its
    ``version``, ``state``, ``lease_state`` and ``lease_remaining`` (seconds by the
    store's clock, or null)."""

    async def work(store: Store) -> tuple[list[Any], float]:
        tasks = await Rooms(store).room(room).plan.tasks()
        return tasks, (await store.read(room, [])).now

    if server is not None:
        tasks = _remote(server, lambda client: client.room(room).plan.tasks())
        now = _read_time(tasks)
    else:
        tasks, now = _run(url, work)
    if as_json:
        emit_json({"room": room, "now": now, "tasks": [_task_json(t, now) for t in tasks]})
        return
    console.print(plan_tree(room, tasks, now))


def _read_time(tasks: list[Any]) -> float:
    """The store time the server read ``tasks`` at, from a claimed task's lease (its
    expiry less the seconds it had left); this machine's clock when none is claimed (then
    no time is shown)."""
    for task in tasks:
        if task.lease_expires is not None and task.lease_remaining:
            return float(task.lease_expires - task.lease_remaining)
    return time.time()


def _task_json(task: Any, now: float) -> dict[str, Any]:
    remaining = task.lease_remaining
    if remaining is None and task.lease_expires is not None:
        remaining = task.lease_expires - now
    return {
        "id": task.id,
        **task.to_value(),
        "version": task.version,
        "state": task.state,
        "lease_state": task.lease_state,
        "lease_remaining": remaining,
    }


_COLOUR = {"done": "green", "claimed": "yellow", "ready": "cyan", "failed": "red"}
MAX_DEPTH = 12
"""Levels ``plan show`` nests before it draws a task's dependents as new top-level
entries (``then ... (continued below)``), so a long chain stays within a terminal."""


def plan_tree(room: str, tasks: list[Any], now: float) -> Tree:
    """The DAG as a tree that draws each task once (see ``plan show``): as many nodes as
    tasks, a back-reference line for dependents drawn before, and at most
    :data:`MAX_DEPTH` levels (deeper dependents go on as new top-level entries)."""
    by_id = {t.id: t for t in tasks}
    tree = Tree(Text.assemble(literal(room, "bold"), f": {len(tasks)} tasks"))

    def label(task: Any) -> Text:
        expired = task.state != task.status
        shown = _COLOUR.get("failed" if expired else task.status, "")
        text = Text.assemble(literal(f"{task.state:9}", shown), " ")
        text.append_text(literal(task.id))
        if task.title:
            text.append_text(literal(f"  {task.title}"))
        if task.status == "claimed":
            lease = _when(task.lease_expires, now)
            since = _when(task.lease_granted_at, now)
            text.append_text(
                literal(f"  owner={task.owner} fence={task.fence} lease {lease} (since {since})")
            )
        elif task.owner:
            text.append_text(literal(f"  by {task.owner} (fence {task.fence})"))
        return text

    drawn: set[str] = set()
    roots = [t for t in tasks if not any(dep in by_id for dep in t.deps)]
    pending: list[tuple[Tree, Any, int]] = []  # (parent node, task, depth): a stack
    for root in reversed(roots):
        pending.append((tree, root, 0))
    while pending:  # depth first, in the order a recursive walk would draw
        parent, task, depth = pending.pop()
        if task.id in drawn:  # drawn since it was put on the stack, by another parent
            parent.add(literal(f"also {task.id} (shown above)", "dim"))
            continue
        drawn.add(task.id)
        node = parent.add(label(task))
        shown = [d for d in task.dependents if d in by_id and d in drawn]
        if shown:
            node.add(literal(f"also {', '.join(shown)} (shown above)", "dim"))
        fresh = [d for d in task.dependents if d in by_id and d not in drawn]
        if fresh and depth + 1 >= MAX_DEPTH:  # too deep for a terminal: a new root
            node.add(literal(f"then {', '.join(fresh)} (continued below)", "dim"))
            pending[:0] = [(tree, by_id[d], 0) for d in reversed(fresh)]
            continue
        pending += [(node, by_id[d], depth + 1) for d in reversed(fresh)]
    return tree


# ------------------------------------------------------------------------------ tail


def tail(
    room: RoomArg,
    url: UrlOption = DEFAULT_URL,
    after: Annotated[
        int | None, typer.Option("--after", help="Start after this sequence (default: now)")
    ] = None,
    count: Annotated[int | None, typer.Option("--count", help="Stop after N events")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per line (seq, type, data, time, ...)")
    ] = False,
    server: ServerOption = None,
) -> None:
    """Follow a room's events live (woken by the store; moves no agent's cursor).

    One line per event, ``#<seq> <type> [by <author>] <data as JSON>``, never wrapped.
    ``--json``: a stream, so one JSON document per line and event (``seq``, ``type``,
    ``data``, ``time``, ``author``, ``to``, ``to_roles``), each printed as it arrives."""

    def show(event: Any) -> None:
        if as_json:
            emit_json(event)  # seq, type, data, time, author, to, to_roles
            return
        data = json.dumps(event.data, ensure_ascii=False)
        by = "" if event.author is None else f" by {event.author}"
        say(literal(f"#{event.seq}", "dim"), " ", literal(event.type, "bold"), by, " ", data)

    async def work(store: Store) -> None:
        events = Rooms(store).room(room).events
        await events.read(0, 1)  # NotFound for a room that does not exist
        position = await store.last_seq(room) if after is None else after
        shown = 0
        while count is None or shown < count:
            batch = await events.read(position, 100)
            for event in batch:
                show(event)
                position = event.seq
                shown += 1
                if count is not None and shown >= count:
                    return
            if not batch:
                await store.watch(room, position, 30)

    async def remote(client: Client) -> None:
        handle = client.room(room)
        position = (await handle.describe()).last_seq if after is None else after
        if count == 0:
            return
        shown = 0
        async for event in handle.events.stream(position):  # the server's SSE stream
            show(event)
            shown += 1
            if count is not None and shown >= count:
                return

    try:
        if server is not None:
            _remote(server, remote)
        else:
            _run(url, work)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_OK) from None


# ---------------------------------------------------------------------------- tokens


@tokens_app.command("mint")
def tokens_mint(
    agent: Annotated[str, typer.Argument(help="The agent the token acts as")],
    url: UrlOption = DEFAULT_URL,
    rooms: Annotated[str, typer.Option(help="Comma-separated rooms, or *")] = "*",
    scopes: Annotated[str, typer.Option(help="Comma-separated scopes")] = (
        "plan:read,plan:write,lease:acquire,docs:read,docs:write,events:read,events:write,"
        "presence:write,locks:write"
    ),
    role: Annotated[str | None, typer.Option(help="Role owning a document partition")] = None,
    ttl: Annotated[float, typer.Option(help="Lifetime in seconds")] = 30 * 86_400.0,
    server: ServerOption = None,
) -> None:
    """Mint a bearer token; it is printed once and stored only hashed. With ``--server``
    the token in $AGENTROOMS_TOKEN needs ``tokens:admin`` and may mint nothing beyond
    its own rooms, scopes, role and expiry (``forbidden``, exit 2, naming what exceeds)."""
    from agentrooms.server import mint

    room_list: list[str] | str = "*" if rooms.strip() == "*" else rooms.split(",")
    scope_list = scopes.split(",")
    if server is not None:
        from agentrooms.client.tokens import Tokens

        minted = _remote(
            server,
            lambda client: Tokens(client).mint(
                agent, rooms=room_list, scopes=scope_list, role=role, ttl=ttl
            ),
        )
    else:
        minted = _run(
            url,
            lambda store: mint(
                store, agent, rooms=room_list, scopes=scope_list, role=role, ttl=ttl
            ),
        )
    say(f"token id {minted.info.id} for agent ", agent, " (shown once):")
    print(minted.token)


@tokens_app.command("revoke")
def tokens_revoke(
    token: Annotated[str, typer.Argument(help="Token id or the token itself")],
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
) -> None:
    """Revoke a token; ``not_found`` (exit 4) if there is no such live token (with
    ``--server``: none within the reach of the token in $AGENTROOMS_TOKEN)."""
    from agentrooms.server import revoke

    if server is not None:
        from agentrooms.client.tokens import Tokens

        done = _remote(server, lambda client: Tokens(client).revoke(token))
    else:
        done = _run(url, lambda store: revoke(store, token))
    if not done:
        fail("not_found", "no such token, or already revoked", EXIT_NOT_FOUND)
    say("revoked")


@tokens_app.command("list")
def tokens_list(
    url: UrlOption = DEFAULT_URL, as_json: JsonOption = False, server: ServerOption = None
) -> None:
    """List tokens (never their secrets): per token a line with its full id and expiry
    ("expires in 3 h", "expired 2 d ago", "revoked ... ago, ..."), then its agent, rooms,
    role and scopes, wrapped to the terminal and never cut. With ``--server``: the tokens
    within the reach of the token in $AGENTROOMS_TOKEN (which needs ``tokens:admin``).

    ``--json``: ``{"now", "tokens": [...]}``, each token's id, agent, rooms, scopes, role,
    created_at, expires_at and revoked_at (store clock)."""
    from agentrooms.server import list_tokens

    async def work(store: Store) -> tuple[list[Any], float]:
        return await list_tokens(store), (await store.read("_auth", [])).now

    if server is not None:
        from agentrooms.client.tokens import Tokens

        tokens, now = _remote(server, lambda client: Tokens(client).list())
    else:
        tokens, now = _run(url, work)
    if as_json:
        emit_json({"now": now, "tokens": tokens})
        return
    if not tokens:
        where = f"on the server {shown_url(server)}" if server else f"in the store {shown_url(url)}"
        say("no tokens ", where)
        return
    # a heading line and indented details per token: whole at 80 columns, ids never cut
    for t in tokens:
        expiry = _when(t.expires_at, now)
        state = f"expires {expiry}" if t.expires_at >= now else f"expired {expiry}"
        if t.revoked_at is not None:
            state = f"revoked {_when(t.revoked_at, now)}, {state}"
        say(literal(t.id, "bold"), "  ", state)
        rooms = t.rooms if isinstance(t.rooms, str) else ", ".join(t.rooms)
        for label, value in (
            ("agent", t.agent),
            ("rooms", rooms),
            ("role", t.role or "-"),
            ("scopes", " ".join(sorted(t.scopes))),
        ):
            lines = literal(value).wrap(console, max(console.width - 12, 20), overflow="fold")
            for i, line in enumerate(lines):
                line.rstrip()
                say(f"    {label if i == 0 else '':<8}", line)
