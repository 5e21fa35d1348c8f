"""``agentrooms paths``: reserve, renew, release, check and list path reservations, and
the git pre-commit hook that refuses a commit touching paths another agent reserved."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from agentrooms.cli_common import (
    DEFAULT_URL,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    JsonOption,
    UrlOption,
    _run,
    console,
    emit_json,
    err_console,
    fail,
    literal,
    say,
)
from agentrooms.rooms import Rooms
from agentrooms.rooms.paths import DEFAULT_TTL, MAX_PATTERNS, PathConflict, Reservation
from agentrooms.store import Store

paths_app = typer.Typer(help="Reserve paths of a shared repository.", no_args_is_help=True)

RoomOption = Annotated[str, typer.Option("--room", envvar="AGENTROOMS_ROOM", help="Room name")]
AgentOption = Annotated[
    str, typer.Option("--agent", envvar="AGENTROOMS_AGENT", help="The agent you act as")
]
_UNSUPPORTED = set("*?[]{}\\")

HOOK = """#!/bin/sh
# agentrooms pre-commit hook: refuse a commit that touches paths reserved by another
# agent. Written by `agentrooms paths hook`; the environment overrides what it names.
# To commit anyway: git commit --no-verify
[ -n "$AGENTROOMS_ROOM" ] || AGENTROOMS_ROOM={room}
[ -n "$AGENTROOMS_AGENT" ] || AGENTROOMS_AGENT={agent}
[ -n "$AGENTROOMS_URL" ] || AGENTROOMS_URL={url}
export AGENTROOMS_ROOM AGENTROOMS_AGENT AGENTROOMS_URL
git diff --cached --name-only -z | {command} paths check --stdin0
"""


def _tell(r: Reservation) -> None:
    say(
        "reserved ",
        literal(r.id, "bold"),
        f" ({r.mode}, fence {r.fence}, {r.ttl:g}s): ",
        " ".join(r.patterns),
    )


@paths_app.command("reserve")
def paths_reserve(
    patterns: Annotated[list[str], typer.Argument(help="Globs: src/**, docs/*.md, a/b.py")],
    room: RoomOption,
    agent: AgentOption,
    url: UrlOption = DEFAULT_URL,
    shared: Annotated[bool, typer.Option("--shared", help="Shared, not exclusive")] = False,
    ttl: Annotated[float, typer.Option("--ttl", help="Seconds it lasts")] = DEFAULT_TTL,
    as_json: JsonOption = False,
) -> None:
    """Reserve the patterns, all or none; a conflict names the holder and its pattern
    (exit 5)."""
    mode = "shared" if shared else "exclusive"
    r = _run(url, lambda s: Rooms(s).room(room).paths.reserve(patterns, agent, mode=mode, ttl=ttl))
    emit_json(r) if as_json else _tell(r)


@paths_app.command("renew")
def paths_renew(
    reservation: Annotated[str, typer.Argument(help="The reservation's id")],
    room: RoomOption,
    agent: AgentOption,
    url: UrlOption = DEFAULT_URL,
    ttl: Annotated[float | None, typer.Option("--ttl", help="Seconds from now")] = None,
    as_json: JsonOption = False,
) -> None:
    """Extend a reservation you hold; exit 5 (paths_lost) if it is no longer held."""
    r = _run(url, lambda s: Rooms(s).room(room).paths.renew(reservation, agent, ttl))
    emit_json(r) if as_json else _tell(r)


@paths_app.command("release")
def paths_release(
    reservation: Annotated[str, typer.Argument(help="The reservation's id")],
    room: RoomOption,
    agent: AgentOption,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Release a reservation you hold (it says so if it had lapsed)."""
    done = _run(url, lambda s: Rooms(s).room(room).paths.release(reservation, agent))
    say("released " if done else "not held (lapsed, released or not yours): ", reservation)


@paths_app.command("check")
def paths_check(
    room: RoomOption,
    agent: AgentOption,
    paths: Annotated[list[str] | None, typer.Argument(help="Paths or globs")] = None,
    url: UrlOption = DEFAULT_URL,
    stdin0: Annotated[
        bool, typer.Option("--stdin0", help="Also read NUL-separated paths from stdin")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Exit 5 naming each holder if another agent's reservation overlaps a path (about
    to be written: any mode conflicts), else 0. With ``--stdin0``, the paths on stdin
    are taken literally, and those holding glob characters are skipped with a warning."""
    wanted = list(paths or [])
    if stdin0:
        for name in sys.stdin.buffer.read().decode("utf-8", "surrogateescape").split("\0"):
            if name and _UNSUPPORTED.intersection(name):
                err_console.print(literal(f"warning: not checked (glob characters): {name!r}"))
            elif name:
                wanted.append(name)
    found = _run(url, lambda s: _check(s, room, agent, wanted)) if wanted else []
    if as_json:
        emit_json({"conflicts": found})
    else:
        for c in found:
            err_console.print(
                literal(
                    f"{c.pattern}: reserved {c.mode} by {c.holder} as {c.held} "
                    f"(reservation {c.reservation})"
                )
            )
    if found:
        if not as_json:
            err_console.print(literal(f"refused: {len(found)} path(s) reserved by others"))
        raise typer.Exit(EXIT_REFUSED)


async def _check(store: Store, room: str, agent: str, paths: list[str]) -> list[PathConflict]:
    out: list[PathConflict] = []
    unique = list(dict.fromkeys(paths))
    for start in range(0, len(unique), MAX_PATTERNS):
        chunk = unique[start : start + MAX_PATTERNS]
        out += await Rooms(store).room(room).paths.check(chunk, agent)
    return out


@paths_app.command("list")
def paths_list(room: RoomOption, url: UrlOption = DEFAULT_URL, as_json: JsonOption = False) -> None:
    """The room's live reservations."""
    held = _run(url, lambda s: Rooms(s).room(room).paths.held())
    if as_json:
        emit_json({"reservations": held})
        return
    table = Table("id", "owner", "mode", "fence", "paths")
    for r in held:
        table.add_row(
            literal(r.id), literal(r.owner), r.mode, str(r.fence), literal(" ".join(r.patterns))
        )
    console.print(table)


@paths_app.command("hook")
def paths_hook(
    room: RoomOption,
    agent: AgentOption,
    url: UrlOption = DEFAULT_URL,
    install: Annotated[
        bool, typer.Option("--install", help="Write it as this repository's pre-commit hook")
    ] = False,
) -> None:
    """Print the git pre-commit hook (or ``--install`` it) that runs ``paths check`` on
    the staged paths and refuses the commit naming the holder."""
    command = f"{shlex.quote(sys.executable)} -m agentrooms"
    values = {"room": room, "agent": agent, "url": url}
    script = HOOK.format(command=command, **{k: shlex.quote(v) for k, v in values.items()})
    if not install:
        sys.stdout.write(script)
        return
    found = subprocess.run(
        ["git", "rev-parse", "--git-path", "hooks"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        fail("bad_request", "not in a git repository", EXIT_USAGE)
    hook = Path(found.stdout.strip()) / "pre-commit"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(script)
    hook.chmod(0o755)
    say("installed ", str(hook))
    raise typer.Exit(EXIT_OK)
