"""``agentrooms events``: post an event (addressed or not), read an agent's new events or
its inbox through its cursor, acknowledge, and read the log without a cursor; on a store
(``--url``, the acting agent ``--as``) or through a server (``--server``, the token in
``$AGENTROOMS_TOKEN``, the acting agent and its role the token's). ``tail`` follows the
log without any cursor."""

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
from agentrooms.rooms import Room
from agentrooms.rooms.events import Ack, InboxPage
from agentrooms.store import Event

if TYPE_CHECKING:
    from agentrooms.client import Room as RemoteRoom

events_app = typer.Typer(
    help="Post events, read an agent's new events or inbox, acknowledge, read the log.",
    no_args_is_help=True,
)

AgentOption = Annotated[
    str | None,
    typer.Option(
        "--as",
        "--agent",
        help="The agent acting: the author, whose cursor moves (on a server: the token's)",
    ),
]
InboxOption = Annotated[
    bool, typer.Option("--inbox", help="Only events addressed to the agent or its --role")
]


def _agent(agent: str | None, server: str | None) -> str | None:
    if agent is None and server is None:
        fail("bad_request", "name the acting agent with --as (or use --server)", EXIT_USAGE)
    return agent


def _line(event: Event) -> None:
    """``#<seq> <type> [by <author>] [to <names>] <data as JSON>``, roles as ``role:NAME``."""
    data = json.dumps(event.data, ensure_ascii=False)
    by = "" if event.author is None else f" by {event.author}"
    names = [*event.to, *(f"role:{r}" for r in event.to_roles)]
    to = f" to {','.join(names)}" if names else ""
    say(literal(f"#{event.seq}", "dim"), " ", literal(event.type, "bold"), by, to, " ", data)


@events_app.command("post")
def events_post(
    room: RoomArg,
    type: Annotated[str, typer.Argument(help="Event type, e.g. note")],
    agent: AgentOption = None,
    data: Annotated[str, typer.Option("--data", help="The event's data as JSON")] = "null",
    to: Annotated[
        list[str] | None, typer.Option("--to", help="Address it to this agent (repeatable)")
    ] = None,
    to_role: Annotated[
        list[str] | None,
        typer.Option("--to-role", help="Address it to every agent with this role (repeatable)"),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Append an event to ROOM's log as agent ``--as``, optionally addressed (``--to``,
    ``--to-role``: it is then in those agents' inboxes, and in the log for every reader).

    Prints its sequence number; ``--json``: ``{"seq": N}``."""
    try:
        value: Any = json.loads(data)
    except json.JSONDecodeError as exc:
        fail("bad_request", f"--data is not JSON: {exc}", EXIT_USAGE)
    who = _agent(agent, server)

    async def work(handle: Room | RemoteRoom) -> int:
        if isinstance(handle, Room):
            return await handle.events.post(
                type, value, author=who, to=to or [], to_roles=to_role or []
            )
        handle.client.acting(who)
        return await handle.events.post(type, value, to=to or [], to_roles=to_role or [])

    seq = _in_room(url, server, room, work)
    if as_json:
        emit_json({"seq": seq})
    else:
        say(f"posted #{seq}")


@events_app.command("read")
def events_read(
    room: RoomArg,
    agent: AgentOption = None,
    inbox: InboxOption = False,
    role: Annotated[
        list[str] | None,
        typer.Option(
            "--role", help="A role the agent holds (repeatable; on a server: the token's)"
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most N")] = 100,
    explicit: Annotated[
        bool, typer.Option("--explicit", help="Keep the cursor until `events ack`")
    ] = False,
    wait: WaitOption = 0.0,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Read agent ``--as``'s new events in ROOM (``--inbox``: only those addressed to it
    or to one of its ``--role``, through its inbox cursor), moving its cursor past them
    (``--explicit``: only on ``events ack``). ``--wait S``: when there is none, wait up to
    S seconds for one.

    One line per event, ``#<seq> <type> [by <author>] [to <names>] <data>``. ``--json``:
    ``{"events": [...]}`` (each event's seq, type, data, time, author, to, to_roles), with
    ``scanned`` and ``more`` for ``--inbox`` (``more``: read again)."""
    ack: Ack = "explicit" if explicit else "auto"
    who = _agent(agent, server)
    if role and server is not None:
        fail("bad_request", "through a server the role is the token's: drop --role", EXIT_USAGE)

    async def work(handle: Room | RemoteRoom) -> dict[str, Any]:
        page: InboxPage
        if isinstance(handle, Room):
            assert who is not None
            if not inbox:
                return {"events": await handle.events.read_new(who, limit, ack=ack, wait=wait)}
            page = await handle.events.read_inbox(who, role or [], limit, ack=ack, wait=wait)
        else:
            if not inbox:
                return {"events": await handle.events.read_new(who, limit, ack=ack, wait=wait)}
            page = await handle.events.read_inbox(who, limit, ack=ack, wait=wait)
        return {"events": page.events, "scanned": page.scanned, "more": page.more}

    out = _in_room(url, server, room, work)
    if as_json:
        emit_json(out)
        return
    for event in out["events"]:
        _line(event)
    if not out["events"]:
        say("no new events" if not inbox else "inbox empty")
    if out.get("more"):
        say("more: read again")


@events_app.command("ack")
def events_ack(
    room: RoomArg,
    seq: Annotated[int, typer.Argument(min=0, help="The last event handled")],
    agent: AgentOption = None,
    inbox: Annotated[bool, typer.Option("--inbox", help="Move the inbox cursor")] = False,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move agent ``--as``'s cursor (``--inbox``: its inbox cursor) forward to SEQ.

    Prints the cursor; ``--json``: ``{"cursor": N}``."""
    who = _agent(agent, server)

    async def work(handle: Room | RemoteRoom) -> int:
        if isinstance(handle, Room):
            assert who is not None
            return await handle.events.ack(who, seq, inbox=inbox)
        return await handle.events.ack(who, seq, inbox=inbox)

    cursor = _in_room(url, server, room, work)
    if as_json:
        emit_json({"cursor": cursor})
    else:
        say(f"cursor at #{cursor}")


@events_app.command("log")
def events_log(
    room: RoomArg,
    after: Annotated[int, typer.Option(help="Events after this sequence number")] = 0,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many")] = 100,
    url: UrlOption = DEFAULT_URL,
    server: ServerOption = None,
    as_json: JsonOption = False,
) -> None:
    """Events after ``--after``, no cursor moves (``tail`` follows the log).
    ``--json``: ``{"events": [...]}``."""

    _list_in_room(
        url, server, room, lambda handle: handle.events.read(after, limit), "events", as_json, _line
    )
