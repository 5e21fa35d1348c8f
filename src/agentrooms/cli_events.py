"""``agentrooms events``: post an event (addressed or not), read an agent's new events or
its inbox through its cursor, and acknowledge, straight on the store as the library does
(``tail`` follows the log without any cursor)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from agentrooms.cli_common import (
    DEFAULT_URL,
    EXIT_USAGE,
    JsonOption,
    RoomArg,
    UrlOption,
    _run,
    emit_json,
    fail,
    literal,
    say,
)
from agentrooms.rooms import Rooms
from agentrooms.rooms.events import Ack
from agentrooms.store import Event, Store

events_app = typer.Typer(
    help="Post events, read an agent's new events or inbox, acknowledge.", no_args_is_help=True
)

AgentOption = Annotated[
    str, typer.Option("--as", help="The agent acting (the author; whose cursor moves)")
]
InboxOption = Annotated[
    bool, typer.Option("--inbox", help="Only events addressed to the agent or its --role")
]


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
    agent: AgentOption,
    data: Annotated[str, typer.Option("--data", help="The event's data as JSON")] = "null",
    to: Annotated[
        list[str] | None, typer.Option("--to", help="Address it to this agent (repeatable)")
    ] = None,
    to_role: Annotated[
        list[str] | None,
        typer.Option("--to-role", help="Address it to every agent with this role (repeatable)"),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    as_json: JsonOption = False,
) -> None:
    """Append an event to ROOM's log as agent ``--as``, optionally addressed (``--to``,
    ``--to-role``: it is then in those agents' inboxes, and in the log for every reader).

    Prints its sequence number; ``--json``: ``{"seq": N}``."""
    try:
        value: Any = json.loads(data)
    except json.JSONDecodeError as exc:
        fail("bad_request", f"--data is not JSON: {exc}", EXIT_USAGE)

    async def work(store: Store) -> int:
        events = Rooms(store).room(room).events
        return await events.post(type, value, author=agent, to=to or [], to_roles=to_role or [])

    seq = _run(url, work)
    if as_json:
        emit_json({"seq": seq})
    else:
        say(f"posted #{seq}")


@events_app.command("read")
def events_read(
    room: RoomArg,
    agent: AgentOption,
    inbox: InboxOption = False,
    role: Annotated[
        list[str] | None, typer.Option("--role", help="A role the agent holds (repeatable)")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most N")] = 100,
    explicit: Annotated[
        bool, typer.Option("--explicit", help="Keep the cursor until `events ack`")
    ] = False,
    url: UrlOption = DEFAULT_URL,
    as_json: JsonOption = False,
) -> None:
    """Read agent ``--as``'s new events in ROOM (``--inbox``: only those addressed to it
    or to one of its ``--role``, through its inbox cursor), moving its cursor past them
    (``--explicit``: only on ``events ack``).

    One line per event, ``#<seq> <type> [by <author>] [to <names>] <data>``. ``--json``:
    ``{"events": [...]}`` (each event's seq, type, data, time, author, to, to_roles), with
    ``scanned`` and ``more`` for ``--inbox`` (``more``: read again)."""
    ack: Ack = "explicit" if explicit else "auto"

    async def work(store: Store) -> dict[str, Any]:
        events = Rooms(store).room(room).events
        if inbox:
            page = await events.read_inbox(agent, role or [], limit, ack=ack)
            return {"events": page.events, "scanned": page.scanned, "more": page.more}
        return {"events": await events.read_new(agent, limit, ack=ack)}

    out = _run(url, work)
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
    agent: AgentOption,
    inbox: Annotated[bool, typer.Option("--inbox", help="Move the inbox cursor")] = False,
    url: UrlOption = DEFAULT_URL,
    as_json: JsonOption = False,
) -> None:
    """Move agent ``--as``'s cursor (``--inbox``: its inbox cursor) forward to SEQ.

    Prints the cursor; ``--json``: ``{"cursor": N}``."""
    cursor = _run(url, lambda store: Rooms(store).room(room).events.ack(agent, seq, inbox=inbox))
    if as_json:
        emit_json({"cursor": cursor})
    else:
        say(f"cursor at #{cursor}")
