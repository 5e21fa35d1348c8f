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

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from agentrooms.cli_torture import torture
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
from agentrooms.rooms import Rooms
from agentrooms.store import Append, Put, Store, VersionIs, open_store

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


app = typer.Typer(
    help="Shared state for teams of agents: rooms, plans, leases, documents, events.",
    no_args_is_help=True,
    add_completion=False,
)
rooms_app = typer.Typer(help="Create, list, archive and delete rooms.", no_args_is_help=True)
plan_app = typer.Typer(help="Look at a room's plan.", no_args_is_help=True)
tokens_app = typer.Typer(help="Mint, revoke and list API tokens.", no_args_is_help=True)
app.add_typer(rooms_app, name="rooms")
app.add_typer(plan_app, name="plan")
app.add_typer(tokens_app, name="tokens")
app.command()(torture)  # agentrooms/cli_torture.py

UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="AGENTROOMS_URL",
        help="Store URL: sqlite:///path.db, redis://host:6379/0, postgresql://..., memory://",
    ),
]
RoomArg = Annotated[str, typer.Argument(help="Room name")]


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


def _need_server(command: str) -> None:
    """Exit with a usage error naming the ``server`` extra if it is not installed."""
    from agentrooms.extras import MissingExtra, require

    try:
        require("server", command)
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


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    delta = ts - now
    return f"in {delta:.0f}s" if delta >= 0 else f"{-delta:.0f}s ago"


# --------------------------------------------------------------------------- serving


def _banner(url: str, host: str, port: int, dev: bool) -> list[Text]:
    """What ``serve`` prints before it serves: where, how, the store, and its paths."""
    shown = f"[{host}]" if ":" in host else host
    mode = "dev mode, no tokens" if dev else "bearer tokens required (agentrooms tokens mint)"
    return [
        Text.assemble("agentrooms on ", literal(f"http://{shown}:{port}", "bold"), f"  ({mode})"),
        Text.assemble(
            "  store ",
            literal(shown_url(url)),
            "; API /v1, described at /openapi.json; ",
            "MCP /mcp; metrics /metrics",
        ),
    ]


@app.command()
def serve(
    url: UrlOption = DEFAULT_URL,
    host: Annotated[str, typer.Option(help="Interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8080,
    dev: Annotated[
        bool,
        typer.Option("--dev", help="No tokens: act as the agent in X-Agent (127.0.0.1 only)"),
    ] = False,
    max_header_bytes: Annotated[
        int, typer.Option(help="Request line and headers, bytes (431 past it)")
    ] = 32 * 1024,
    header_timeout: Annotated[
        float, typer.Option(help="Seconds to send the request line and headers (408)")
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds to send a body once the headers are in (408)")
    ] = 30.0,
    max_connections: Annotated[
        int, typer.Option(help="Requests served at once by this process (503 past it)")
    ] = 1000,
    max_streams_per_agent: Annotated[
        int, typer.Option(help="Open event streams, and MCP listen streams, per agent (429)")
    ] = 8,
    auth_failures: Annotated[
        int, typer.Option(help="Failed authentications per client address before 429")
    ] = 20,
    auth_failure_rate: Annotated[
        float, typer.Option(help="Per second, refilling an address's failed-auth allowance")
    ] = 1.0,
) -> None:
    """Serve the HTTP API (with /metrics, /healthz, /readyz) and MCP at /mcp."""
    _need_server("agentrooms serve")
    from agentrooms.server import AuthConfig, HttpLimits, check_bind
    from agentrooms.server import serve as run_server

    auth = AuthConfig(dev=dev)
    try:
        limits = HttpLimits(
            max_header_bytes=max_header_bytes,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            max_connections=max_connections,
            max_streams_per_agent=max_streams_per_agent,
            auth_failures=auth_failures,
            auth_failure_rate=auth_failure_rate,
        )
        check_bind(host, auth)
    except ValueError as exc:
        fail("bad_request", exc, EXIT_USAGE)
    _prepare(url)
    for line in _banner(url, host, port, dev):
        console.print(line, soft_wrap=True)
    run_server(url, host, port, auth, limits)


@app.command()
def mcp(
    agent: Annotated[str, typer.Option("--agent", help="The agent every call acts as")],
    url: UrlOption = DEFAULT_URL,
    rooms: Annotated[
        str | None, typer.Option(help="Comma-separated rooms the agent may enter (default all)")
    ] = None,
) -> None:
    """Serve the MCP server on stdin/stdout for one agent (for a local agent runtime).

    stdout carries only the protocol: the store it serves and any error go to stderr."""
    _need_server("agentrooms mcp")
    from agentrooms.server.mcp.stdio import run_stdio

    _prepare(url)
    err_console.print(
        Text.assemble(
            "agentrooms mcp: agent ", literal(agent), " on store ", literal(shown_url(url))
        ),
        soft_wrap=True,
    )
    try:
        run_stdio(url, agent, rooms=None if rooms is None else rooms.split(","))
    except AgentroomsError as exc:
        raise typer.Exit(_report(exc, url)) from exc


@app.command()
def doctor(url: UrlOption = DEFAULT_URL) -> None:
    """Check the store connection and its durability settings, and say what is unsafe."""

    async def work(store: Store) -> int:
        info = await store.info()
        snap = await store.read("doctor", ["probe"])
        table = Table(show_header=False, box=None)
        table.add_row("backend", info.backend)
        table.add_row("url", literal(info.url))
        table.add_row("store clock", f"{snap.now:.3f}")
        if "clock" in info.details:
            table.add_row("expiry judged by", literal(str(info.details["clock"])))
        table.add_row("durability", literal(info.durability))
        console.print(table)
        for warning in info.warnings:
            say(literal("warning:", "yellow"), " ", warning)
        return EXIT_FINDING if info.warnings else EXIT_OK

    raise typer.Exit(_run(url, work))


# ----------------------------------------------------------------------------- rooms


@rooms_app.command("list")
def rooms_list(
    url: UrlOption = DEFAULT_URL,
    archived: Annotated[bool, typer.Option("--archived", help="Include archived rooms")] = False,
) -> None:
    """List rooms with their newest event and ready tasks (or say which store has none)."""
    infos = _run(url, lambda store: Rooms(store).list(include_archived=archived))
    if not infos:
        say("no rooms in the store ", shown_url(url))
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


@rooms_app.command("create")
def rooms_create(
    room: RoomArg,
    url: UrlOption = DEFAULT_URL,
    description: Annotated[str, typer.Option(help="What the room is for")] = "",
) -> None:
    """Create a room."""
    _run(url, lambda store: Rooms(store).create(room, description))
    say("created room ", literal(room, "bold"), " in the store ", shown_url(url))


@rooms_app.command("archive")
def rooms_archive(room: RoomArg, url: UrlOption = DEFAULT_URL) -> None:
    """Make a room read-only."""
    _run(url, lambda store: Rooms(store).archive(room))
    say("archived room ", literal(room, "bold"))


@rooms_app.command("delete")
def rooms_delete(
    room: RoomArg,
    url: UrlOption = DEFAULT_URL,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask")] = False,
) -> None:
    """Delete a room and everything in it."""
    if not yes:
        typer.confirm(f"delete room {room!r} and everything in it?", abort=True)
    _run(url, lambda store: Rooms(store).delete(room))
    say("deleted room ", literal(room, "bold"))


# ------------------------------------------------------------------------------ plan


@plan_app.command("show")
def plan_show(room: RoomArg, url: UrlOption = DEFAULT_URL) -> None:
    """The plan as a tree of dependencies, with owners, leases and fencing tokens."""

    async def work(store: Store) -> tuple[list[Any], float]:
        tasks = await Rooms(store).room(room).plan.tasks()
        return tasks, (await store.read(room, [])).now

    tasks, now = _run(url, work)
    by_id = {t.id: t for t in tasks}
    colour = {"done": "green", "claimed": "yellow", "ready": "cyan", "failed": "red"}
    tree = Tree(Text.assemble(literal(room, "bold"), f": {len(tasks)} tasks"))

    def label(task: Any) -> Text:
        text = Text.assemble(literal(f"{task.status:9}", colour.get(task.status, "")), " ")
        text.append_text(literal(task.id))
        if task.title:
            text.append_text(literal(f"  {task.title}"))
        if task.status == "claimed":
            lease = _when(task.lease_expires, now)
            text.append_text(literal(f"  owner={task.owner} fence={task.fence} lease {lease}"))
        elif task.owner:
            text.append_text(literal(f"  by {task.owner} (fence {task.fence})"))
        return text

    def add(node: Tree, task: Any, path: frozenset[str]) -> None:
        child = node.add(label(task))
        for dependent in task.dependents:
            if dependent in by_id and dependent not in path:
                add(child, by_id[dependent], path | {dependent})

    for task in tasks:
        if not any(dep in by_id for dep in task.deps):
            add(tree, task, frozenset({task.id}))
    console.print(tree)


# ------------------------------------------------------------------------------ tail


@app.command()
def tail(
    room: RoomArg,
    url: UrlOption = DEFAULT_URL,
    after: Annotated[
        int | None, typer.Option("--after", help="Start after this sequence (default: now)")
    ] = None,
    count: Annotated[int | None, typer.Option("--count", help="Stop after N events")] = None,
) -> None:
    """Follow a room's events live (woken by the store; moves no agent's cursor).

    One line per event, ``#<seq> <type> <data as JSON>``, never wrapped."""

    async def work(store: Store) -> None:
        events = Rooms(store).room(room).events
        await events.read(0, 1)  # NotFound for a room that does not exist
        position = await store.last_seq(room) if after is None else after
        shown = 0
        while count is None or shown < count:
            batch = await events.read(position, 100)
            for event in batch:
                data = json.dumps(event.data, ensure_ascii=False)
                say(literal(f"#{event.seq}", "dim"), " ", literal(event.type, "bold"), " ", data)
                position = event.seq
                shown += 1
                if count is not None and shown >= count:
                    return
            if not batch:
                await store.watch(room, position, 30)

    try:
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
) -> None:
    """Mint a bearer token; it is printed once and stored only hashed."""
    from agentrooms.server import mint

    room_list: list[str] | str = "*" if rooms.strip() == "*" else rooms.split(",")
    minted = _run(
        url,
        lambda store: mint(
            store, agent, rooms=room_list, scopes=scopes.split(","), role=role, ttl=ttl
        ),
    )
    say(f"token id {minted.info.id} for agent ", agent, " (shown once):")
    print(minted.token)


@tokens_app.command("revoke")
def tokens_revoke(
    token: Annotated[str, typer.Argument(help="Token id or the token itself")],
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Revoke a token; ``not_found`` (exit 4) if there is no such live token."""
    from agentrooms.server import revoke

    if not _run(url, lambda store: revoke(store, token)):
        fail("not_found", "no such token, or already revoked", EXIT_NOT_FOUND)
    say("revoked")


@tokens_app.command("list")
def tokens_list(url: UrlOption = DEFAULT_URL) -> None:
    """List tokens (never their secrets)."""
    from agentrooms.server import list_tokens

    async def work(store: Store) -> tuple[list[Any], float]:
        return await list_tokens(store), (await store.read("_auth", [])).now

    tokens, now = _run(url, work)
    if not tokens:
        say("no tokens in the store ", shown_url(url))
        return
    table = Table("id", "agent", "rooms", "scopes", "role", "expires", "revoked")
    for t in tokens:
        table.add_row(
            literal(t.id),
            literal(t.agent),
            literal(t.rooms if isinstance(t.rooms, str) else ",".join(t.rooms)),
            literal(",".join(t.scopes)),
            literal(t.role or ""),
            _when(t.expires_at, now),
            _when(t.revoked_at, now) if t.revoked_at else "",
        )
    console.print(table)


# ------------------------------------------------------------------------- migrating


@app.command()
def migrate(
    room: RoomArg,
    old: Annotated[str, typer.Argument(help="Old projection, as module:attribute")],
    new: Annotated[str, typer.Argument(help="New projection, as module:attribute")],
    url: UrlOption = DEFAULT_URL,
    step: Annotated[
        str, typer.Option(help="expand | migrate | contract | all | rollback | status")
    ] = "status",
) -> None:
    """Expand / migrate / contract a projection to a new version without stopping readers."""
    from agentrooms.sourcing.migration import migrate_projection

    if step not in ("expand", "migrate", "contract", "all", "rollback", "status"):
        fail("bad_request", f"unknown step {step!r}", EXIT_USAGE)
    status = _run(url, lambda store: migrate_projection(store, room, old, new, step=step))  # type: ignore[arg-type]
    say(
        f"{status.name}: v{status.old} -> v{status.new}, phase {status.phase or 'not started'}, "
        f"readers on v{status.active}; positions old {status.old_position}, "
        f"new {status.new_position}, log head {status.head}"
    )


# ------------------------------------------------------------------------------ demo


async def _demo(store: Store) -> None:
    room = "demo"
    snap = await store.read(room, ["report"])
    version = snap.version("report")
    if version is None:
        created = await store.transact(room, writes=[Put("report", {"sections": []})])
        version = created.versions["report"]
    say(
        "room ",
        literal(room, "bold"),
        " on ",
        literal(store.backend, "cyan"),
        f": report v{version}",
    )

    async def agent(name: str) -> str:
        # both agents computed their change from the same version; only one may commit
        sections = (await store.read(room, ["report"])).value("report")["sections"]
        try:
            await store.transact(
                room,
                compares=[VersionIs("report", version)],
                writes=[Put("report", {"sections": [*sections, name]})],
                appends=[Append("section_written", {"agent": name})],
            )
        except VersionConflict as exc:
            return f"{name}: conflict, report is now v{exc.conflicts['report']}: re-read and retry"
        return f"{name}: committed"

    for line in await asyncio.gather(agent("agent-risk"), agent("agent-vendor")):
        say("  " + line)
    final = (await store.read(room, ["report"])).get("report")
    assert final is not None
    say(f"report v{final.version}: {final.value}")
    last = await store.last_seq(room)
    for event in await store.read_log(room, after=max(0, last - 3)):
        say(f"  event #{event.seq} {event.type} {event.data}")


@app.command()
def demo(url: UrlOption = DEFAULT_URL) -> None:
    """Let two agents race one compare-and-set on the store, and read back the result."""
    _run(url, _demo)


# ----------------------------------------------------------------------------- bench

BENCH_MISSING = (
    "agentrooms bench needs the agentrooms-bench distribution (the benchmark suite and its "
    "peer libraries): `pip install ./benchmarks` from a clone of the repository, or "
    "`python3 dev.py cli bench` there"
)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench(ctx: typer.Context) -> None:
    """Benchmark the write policies against the raw client and peer libraries (needs the
    agentrooms-bench distribution; `agentrooms bench --help` lists its options)."""
    try:
        from agentrooms_bench.cli import app as bench_app
    except ModuleNotFoundError as exc:
        if exc.name != "agentrooms_bench":
            raise
        fail("not_installed", BENCH_MISSING, EXIT_USAGE)
    bench_app(args=list(ctx.args), prog_name="agentrooms bench")


def main() -> None:
    """The console script: a typed error that escapes a command (``serve`` opening its
    store) is one line on stderr and its exit code, as inside every command."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        app()
    except AgentroomsError as exc:
        raise SystemExit(_report(exc)) from None
