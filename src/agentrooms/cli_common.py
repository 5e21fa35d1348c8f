"""What every command of the ``agentrooms`` command line shares: exit codes, literal
printing, ``--json`` output, the default store, the ``--url`` option and running a command
against a store, or (``--server``) against a server through :mod:`agentrooms.client`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import typer
from rich.console import Console
from rich.text import Text

from agentrooms.errors import (
    AgentroomsError,
    BadRequest,
    ContentionExhausted,
    CursorCompacted,
    Held,
    IdempotencyMismatch,
    InvalidTransition,
    NotFound,
    RateLimited,
    RequestError,
    StaleFence,
    StoreUnavailable,
    VersionConflict,
)
from agentrooms.rooms import Room, Rooms
from agentrooms.store import Store, open_store

if TYPE_CHECKING:
    from agentrooms.client import Client
    from agentrooms.client import Room as RemoteRoom

T = TypeVar("T")

# ------------------------------------------------------------------------ exit codes

EXIT_OK = 0  # the command did its job
EXIT_FINDING = 1  # it ran, and reports a problem: doctor's unsafe settings, bench's lost update
EXIT_USAGE = 2  # the command line or its input is wrong (click's usage errors too)
EXIT_CRASHED = 3  # bench: a cell crashed (a rerun with the same --out retries it)
EXIT_NOT_FOUND = 4  # no such room, task or token
EXIT_REFUSED = 5  # the store's state refuses the command: conflict, held, stale, ...
EXIT_UNAVAILABLE = 6  # the store cannot be opened, did not answer, or is busy: retry later

EXIT_CODES: dict[type[AgentroomsError], int] = {
    NotFound: EXIT_NOT_FOUND,
    RequestError: EXIT_USAGE,  # bad_request, payload_too_large, unauthorized, forbidden
    VersionConflict: EXIT_REFUSED,
    StaleFence: EXIT_REFUSED,
    InvalidTransition: EXIT_REFUSED,
    IdempotencyMismatch: EXIT_REFUSED,
    Held: EXIT_REFUSED,  # lease_held, lock_held
    CursorCompacted: EXIT_REFUSED,
    StoreUnavailable: EXIT_UNAVAILABLE,
    RateLimited: EXIT_UNAVAILABLE,
    ContentionExhausted: EXIT_UNAVAILABLE,
}
"""The exit code of each error family; a subclass takes its nearest listed ancestor's."""


def exit_code(exc: AgentroomsError) -> int:
    """The exit code for ``exc`` (:data:`EXIT_CODES`); ``LookupError`` for a kind the table
    does not cover (a bug in the table, never a silent default)."""
    for kind in type(exc).__mro__:
        if kind in EXIT_CODES:
            return EXIT_CODES[kind]
    raise LookupError(f"no exit code for {type(exc).__name__}")


# --------------------------------------------------------------------------- printing

console = Console(markup=False, emoji=False, highlight=False)
err_console = Console(stderr=True, markup=False, emoji=False, highlight=False)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def literal(value: object, style: str = "") -> Text:
    """``str(value)`` as the characters to print: never markup or emoji codes, and every
    control character but tab and newline shown as an escape (``\\x1b``), so that text an
    agent wrote can neither vanish, crash the printer nor drive the terminal."""
    return Text(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value)), style=style)


def say(*parts: str | Text) -> None:
    """One line on stdout, unwrapped; ``str`` parts are printed literally."""
    console.print(
        Text.assemble(*(literal(p) if isinstance(p, str) else p for p in parts)), soft_wrap=True
    )


def _error_line(code: str, message: object) -> None:
    """``<code>: <message>`` as one line on stderr (a newline in it shown as ``\\n``)."""
    text = str(message).replace("\n", "\\n")
    err_console.print(Text.assemble(literal(code, "red"), ": ", literal(text)), soft_wrap=True)


def fail(code: str, message: object, exit_with: int) -> NoReturn:
    """Print ``<code>: <message>`` as one line on stderr and exit with ``exit_with``."""
    _error_line(code, message)
    raise typer.Exit(exit_with)


JsonOption = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON document on stdout (and nothing else there) instead"
    ),
]


def plain(value: Any) -> Any:
    """``value`` as JSON data: dataclasses as objects of their fields, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def emit_json(document: Any) -> None:
    """Print ``document`` (made :func:`plain`) as one JSON document and a newline on
    stdout: ASCII only, so no terminal encoding can break it, and never through Rich
    (no wrapping, no markup)."""
    sys.stdout.write(json.dumps(plain(document), ensure_ascii=True, allow_nan=False) + "\n")
    sys.stdout.flush()


def shown_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))


# ---------------------------------------------------------------------- default store


def default_store() -> Path:
    """The default store's file: ``$XDG_DATA_HOME/agentrooms/agentrooms.db`` where
    ``XDG_DATA_HOME`` is an absolute path, else ``~/.local/share/agentrooms/agentrooms.db``
    (the XDG base directory rule); ``RuntimeError`` if the home folder is unknown."""
    base = os.environ.get("XDG_DATA_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "agentrooms" / "agentrooms.db"


def _default_url() -> str:
    try:
        return "sqlite:///" + quote(str(default_store()), safe="/")
    except RuntimeError:  # no HOME and no password entry: there is no per-user folder
        return NO_DEFAULT


NO_DEFAULT = "(none: set XDG_DATA_HOME or HOME, or give --url)"
DEFAULT_URL = _default_url()


UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="AGENTROOMS_URL",
        help="Store URL: sqlite:///path.db, redis://host:6379/0, postgresql://..., memory://",
    ),
]
RoomArg = Annotated[str, typer.Argument(help="Room name")]
TOKEN_ENV = "AGENTROOMS_TOKEN"
ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        envvar="AGENTROOMS_SERVER",
        help="An agentrooms server's URL (http://host:port): act through its HTTP API, "
        f"with the bearer token in ${TOKEN_ENV}, instead of opening a store (--url)",
    ),
]

WaitOption = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        max=86_400,
        help="Seconds to wait for one when there is none, woken by the store (on a store)",
    ),
]


def _prepare(url: str) -> None:
    """Check a SQLite URL and make its file's folder; a URL that is wrong exits with
    ``EXIT_USAGE`` and a folder that cannot be made or written ``EXIT_UNAVAILABLE``,
    each with one line on stderr."""
    if url == NO_DEFAULT:
        fail(
            "bad_request",
            "there is no default store: set XDG_DATA_HOME or HOME, or give --url",
            EXIT_USAGE,
        )
    if urlsplit(url).scheme.lower() != "sqlite":
        return
    from agentrooms.store.sqlite.config import parse_url

    try:
        config = parse_url(url)
    except BadRequest as exc:
        fail(exc.code, exc, exit_code(exc))
    if config.in_memory:
        return
    path = Path(config.path).absolute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        fail(
            "store_unavailable",
            f"cannot create the folder {path.parent} of the store {path}: {why}",
            EXIT_UNAVAILABLE,
        )
    if not path.exists() and not os.access(path.parent, os.W_OK | os.X_OK):
        why = "its folder is not writable"
        fail("store_unavailable", f"cannot create the store {path}: {why}", EXIT_UNAVAILABLE)


def _report(exc: AgentroomsError, url: str | None = None) -> int:
    """Print ``exc`` as one line on stderr (naming the store it could not reach) and
    return its exit code."""
    message = str(exc)
    if isinstance(exc, StoreUnavailable) and url is not None:
        message += f" (store {shown_url(url)})"
    _error_line(exc.code, message)
    return exit_code(exc)


def _need_extra(extra: str, command: str) -> None:
    """Exit with a usage error naming ``extra`` if it is not installed."""
    from agentrooms.extras import MissingExtra, require

    try:
        require(extra, command)
    except MissingExtra as exc:
        fail("not_installed", exc, EXIT_USAGE)


def _run(url: str, work: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store, run ``work``, close it; a typed error becomes one line on stderr
    and the exit code of its family."""

    async def main() -> T:
        store = await open_store(url)
        try:
            return await work(store)
        finally:
            await store.close()

    _prepare(url)
    try:
        return asyncio.run(main())
    except AgentroomsError as exc:
        raise typer.Exit(_report(exc, url)) from exc


def _remote(server: str, work: Callable[[Client], Awaitable[T]]) -> T:
    """Run ``work`` with a :class:`~agentrooms.client.Client` of ``server`` (token from
    ``$AGENTROOMS_TOKEN``), close it; a typed error (the server's ``403`` too) becomes
    one line on stderr naming the server, and the exit code of its family."""
    _need_extra("client", "--server")
    from agentrooms.client import Client, RemoteError

    async def main() -> T:
        async with Client(server, os.environ.get(TOKEN_ENV) or None) as client:
            return await work(client)

    try:
        return asyncio.run(main())
    except AgentroomsError as exc:
        message = f"{exc} (server {shown_url(server)})"
        if exc.code == "unauthorized" and not os.environ.get(TOKEN_ENV):
            message += f"; set {TOKEN_ENV} to a token minted for you"
        code = EXIT_UNAVAILABLE
        with contextlib.suppress(LookupError):
            code = exit_code(exc)
        remote = exc.remote_code if isinstance(exc, RemoteError) else exc.code
        _error_line(remote, message)
        raise typer.Exit(code) from exc


def _in_room(
    url: str,
    server: str | None,
    room: str,
    work: Callable[[Room | RemoteRoom], Awaitable[T]],
) -> T:
    """Run ``work`` on room ``room``: the library's handle on the store at ``url``, or with
    ``server`` the client's handle on that server's room (the same methods)."""
    if server is not None:
        return _remote(server, lambda client: work(client.room(room)))
    return _run(url, lambda store: work(Rooms(store).room(room)))


def _list_in_room(
    url: str,
    server: str | None,
    room: str,
    fetch: Callable[[Room | RemoteRoom], Awaitable[Iterable[Any]]],
    key: str,
    as_json: bool,
    line: Callable[[Any], None],
) -> None:
    """Print what ``fetch`` reads from room ``room`` (as :func:`_in_room`): with
    ``as_json`` one document ``{key: [...]}``, else ``line(item)`` for each item."""

    async def work(handle: Room | RemoteRoom) -> list[Any]:
        return list(await fetch(handle))

    items = _in_room(url, server, room, work)
    if as_json:
        emit_json({key: items})
        return
    for item in items:
        line(item)


def span(seconds: float) -> str:
    """A length of time as a person reads it, in one unit rounded: ``42 s``, ``12 min``,
    ``3 h``, ``30 d`` (seconds up to 90, minutes up to 90, hours up to 36)."""
    seconds = abs(seconds)
    for unit, size, upto in (("s", 1, 90), ("min", 60, 90 * 60), ("h", 3600, 36 * 3600)):
        if seconds < upto:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds / 86_400:.0f} d"


def _when(ts: float | None, now: float) -> str:
    """``ts`` (store clock) from ``now``: ``in 3 h``, ``2 d ago``, or ``-`` for none."""
    if ts is None:
        return "-"
    return f"in {span(ts - now)}" if ts >= now else f"{span(now - ts)} ago"
