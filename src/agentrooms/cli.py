"""The ``agentrooms`` command line: serve, inspect and operate a store.

Every command takes ``--url`` (or ``AGENTROOMS_URL``); the default is the embedded SQLite
store at one absolute path per user, :func:`default_store`
(``$XDG_DATA_HOME/agentrooms/agentrooms.db``, else ``~/.local/share/agentrooms/agentrooms.db``),
so every working directory opens the same store.

Output: whatever agents or users wrote (room names, descriptions, task titles, event
data, error messages) is printed literally through :func:`literal`: never read as Rich
markup or emoji codes, control characters shown as escapes. Results go to stdout;
errors go to stderr as one line ``<error code>: <message>``, and the process exits with
the code of the error's family (:data:`EXIT_CODES`, also in docs/surfaces.md).
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from agentrooms import __version__
from agentrooms.cli_common import (
    DEFAULT_URL,
    EXIT_CODES,
    EXIT_CRASHED,
    EXIT_FINDING,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    NO_DEFAULT,
    _default_url,
    _report,
    console,
    default_store,
    err_console,
    exit_code,
    fail,
    literal,
    say,
    shown_url,
)
from agentrooms.cli_events import events_app
from agentrooms.cli_paths import paths_app
from agentrooms.cli_rooms import plan_app, rooms_app, tail, tokens_app
from agentrooms.cli_serve import _banner, bench, demo, doctor, mcp, migrate, serve
from agentrooms.cli_status import status
from agentrooms.cli_torture import torture
from agentrooms.cli_work import doc_app, locks_app, presence_app, task_app
from agentrooms.errors import AgentroomsError

__all__ = [
    "DEFAULT_URL",
    "EXIT_CODES",
    "EXIT_CRASHED",
    "EXIT_FINDING",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "NO_DEFAULT",
    "_banner",
    "_default_url",
    "_report",
    "app",
    "console",
    "default_store",
    "err_console",
    "exit_code",
    "fail",
    "literal",
    "main",
    "say",
    "shown_url",
]

app = typer.Typer(
    help="Shared state for teams of agents: rooms, plans, leases, documents, events.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(shown: bool) -> None:
    if shown:
        print(f"agentrooms {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    del version  # handled by its eager callback


app.add_typer(rooms_app, name="rooms")
app.add_typer(plan_app, name="plan")
app.add_typer(tokens_app, name="tokens")
app.add_typer(task_app, name="task")  # agentrooms/cli_work.py: also remotely, --server
app.add_typer(doc_app, name="doc")
app.add_typer(events_app, name="events")  # agentrooms/cli_events.py: also remotely
app.add_typer(presence_app, name="presence")
app.add_typer(locks_app, name="locks")
app.add_typer(paths_app, name="paths")
app.command()(torture)  # agentrooms/cli_torture.py
app.command()(serve)
app.command()(mcp)
app.command()(doctor)
app.command()(tail)
app.command()(status)  # agentrooms/cli_status.py
app.command()(migrate)
app.command()(demo)
app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)(bench)


def main() -> None:
    """The console script: a typed error that escapes a command (``serve`` opening its
    store) is one line on stderr and its exit code, as inside every command."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        app()
    except AgentroomsError as exc:
        raise SystemExit(_report(exc)) from None
