"""The ``agentrooms`` command line: serve, inspect and operate a store.

Every command takes ``--url`` (or ``AGENTROOMS_URL``); the default is the embedded SQLite
store in ``./.agentrooms/agentrooms.db``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from agentrooms.errors import AgentroomsError, VersionConflict
from agentrooms.rooms import Rooms
from agentrooms.store import Append, Put, Store, VersionIs, open_store

DEFAULT_URL = "sqlite:///.agentrooms/agentrooms.db"
T = TypeVar("T")

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
console = Console()

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
    """Create the directory of a relative SQLite path (the default lives in .agentrooms/)."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        path = url[len("sqlite:///") :].split("?", 1)[0]
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def _run(url: str, work: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store, run ``work``, close it; typed errors become one red line."""

    async def main() -> T:
        _prepare(url)
        store = await open_store(url)
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return asyncio.run(main())
    except AgentroomsError as exc:
        console.print(f"[red]{exc.code}[/red]: {exc}")
        raise typer.Exit(1) from exc


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    delta = ts - now
    return f"in {delta:.0f}s" if delta >= 0 else f"{-delta:.0f}s ago"


# --------------------------------------------------------------------------- serving


@app.command()
def serve(
    url: UrlOption = DEFAULT_URL,
    host: Annotated[str, typer.Option(help="Interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8080,
    dev: Annotated[
        bool,
        typer.Option("--dev", help="No tokens: act as the agent in X-Agent (127.0.0.1 only)"),
    ] = False,
) -> None:
    """Serve the HTTP API (with /metrics, /healthz, /readyz) and MCP at /mcp."""
    from agentrooms.server import AuthConfig, check_bind
    from agentrooms.server import serve as run_server

    auth = AuthConfig(dev=dev)
    try:
        check_bind(host, auth)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    _prepare(url)
    shown = f"[{host}]" if ":" in host else host
    mode = "dev mode, no tokens" if dev else "bearer tokens required (agentrooms tokens mint)"
    console.print(f"agentrooms on [bold]http://{shown}:{port}[/bold]  ({mode})")
    console.print(f"  store {url}; API docs http://{shown}:{port}/docs; metrics /metrics")
    run_server(url, host, port, auth)


@app.command()
def mcp(
    agent: Annotated[str, typer.Option("--agent", help="The agent every call acts as")],
    url: UrlOption = DEFAULT_URL,
    rooms: Annotated[
        str | None, typer.Option(help="Comma-separated rooms the agent may enter (default all)")
    ] = None,
) -> None:
    """Serve the MCP server on stdin/stdout for one agent (for a local agent runtime)."""
    from agentrooms.server.mcp.stdio import run_stdio

    _prepare(url)
    run_stdio(url, agent, rooms=None if rooms is None else rooms.split(","))


@app.command()
def doctor(url: UrlOption = DEFAULT_URL) -> None:
    """Check the store connection and its durability settings, and say what is unsafe."""

    async def work(store: Store) -> int:
        info = await store.info()
        snap = await store.read("doctor", ["probe"])
        table = Table(show_header=False, box=None)
        table.add_row("backend", info.backend)
        table.add_row("url", info.url)
        table.add_row("store clock", f"{snap.now:.3f}")
        if "clock" in info.details:
            table.add_row("expiry judged by", str(info.details["clock"]))
        table.add_row("durability", info.durability)
        console.print(table)
        for warning in info.warnings:
            console.print(f"[yellow]warning:[/yellow] {warning}")
        return 1 if info.warnings else 0

    raise typer.Exit(_run(url, work))


# ----------------------------------------------------------------------------- rooms


@rooms_app.command("list")
def rooms_list(
    url: UrlOption = DEFAULT_URL,
    archived: Annotated[bool, typer.Option("--archived", help="Include archived rooms")] = False,
) -> None:
    """List rooms with their newest event and ready tasks."""
    infos = _run(url, lambda store: Rooms(store).list(include_archived=archived))
    table = Table("room", "description", "events", "ready", "archived")
    for info in infos:
        table.add_row(
            info.name,
            info.description,
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
    console.print(f"created room [bold]{room}[/bold]")


@rooms_app.command("archive")
def rooms_archive(room: RoomArg, url: UrlOption = DEFAULT_URL) -> None:
    """Make a room read-only."""
    _run(url, lambda store: Rooms(store).archive(room))
    console.print(f"archived room [bold]{room}[/bold]")


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
    console.print(f"deleted room [bold]{room}[/bold]")


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
    tree = Tree(f"[bold]{room}[/bold]: {len(tasks)} tasks")

    def label(task: Any) -> str:
        style = colour.get(task.status, "white")
        text = f"[{style}]{task.status:9}[/{style}] {task.id}"
        if task.title:
            text += f"  {task.title}"
        if task.status == "claimed":
            text += (
                f"  owner={task.owner} fence={task.fence} lease {_when(task.lease_expires, now)}"
            )
        elif task.owner:
            text += f"  by {task.owner} (fence {task.fence})"
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
    """Follow a room's events live (woken by the store; moves no agent's cursor)."""

    async def work(store: Store) -> None:
        events = Rooms(store).room(room).events
        await events.read(0, 1)  # NotFound for a room that does not exist
        position = await store.last_seq(room) if after is None else after
        shown = 0
        while count is None or shown < count:
            batch = await events.read(position, 100)
            for event in batch:
                console.print(
                    f"[dim]#{event.seq}[/dim] [bold]{event.type}[/bold] "
                    f"{json.dumps(event.data, ensure_ascii=False)}",
                    highlight=False,
                )
                position = event.seq
                shown += 1
                if count is not None and shown >= count:
                    return
            if not batch:
                await store.watch(room, position, 30)

    try:
        _run(url, work)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


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
    console.print(f"token id {minted.info.id} for agent {agent} (shown once):")
    print(minted.token)


@tokens_app.command("revoke")
def tokens_revoke(
    token: Annotated[str, typer.Argument(help="Token id or the token itself")],
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Revoke a token."""
    from agentrooms.server import revoke

    if not _run(url, lambda store: revoke(store, token)):
        console.print("[red]no such token, or already revoked[/red]")
        raise typer.Exit(1)
    console.print("revoked")


@tokens_app.command("list")
def tokens_list(url: UrlOption = DEFAULT_URL) -> None:
    """List tokens (never their secrets)."""
    from agentrooms.server import list_tokens

    async def work(store: Store) -> tuple[list[Any], float]:
        return await list_tokens(store), (await store.read("_auth", [])).now

    tokens, now = _run(url, work)
    table = Table("id", "agent", "rooms", "scopes", "role", "expires", "revoked")
    for t in tokens:
        table.add_row(
            t.id,
            t.agent,
            t.rooms if isinstance(t.rooms, str) else ",".join(t.rooms),
            ",".join(t.scopes),
            t.role or "",
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
        console.print(f"[red]unknown step {step!r}[/red]")
        raise typer.Exit(2)
    status = _run(url, lambda store: migrate_projection(store, room, old, new, step=step))  # type: ignore[arg-type]
    console.print(
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
    console.print(f"room [bold]{room}[/bold] on [cyan]{store.backend}[/cyan]: report v{version}")

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
        console.print("  " + line)
    final = (await store.read(room, ["report"])).get("report")
    assert final is not None
    console.print(f"report v{final.version}: {final.value}")
    last = await store.last_seq(room)
    for event in await store.read_log(room, after=max(0, last - 3)):
        console.print(f"  event #{event.seq} {event.type} {event.data}")


@app.command()
def demo(url: UrlOption = DEFAULT_URL) -> None:
    """Let two agents race one compare-and-set on the store, and read back the result."""
    _run(url, _demo)


# ----------------------------------------------------------------------------- bench

QUICK = {"writers": "1,4,16", "think": "0,5", "repetitions": 1, "duration": 0.3, "warmup": 0.1}
FULL = {"writers": "1,2,4,8,16,32,64", "think": "0,5,50", "repetitions": 3, "duration": 2.0}


def _numbers(text: str, what: str, kind: Callable[[str], T]) -> tuple[T, ...]:
    try:
        values = tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{what} must be a comma-separated list of numbers") from exc
    if not values:
        raise typer.BadParameter(f"{what} must not be empty")
    return values


@app.command()
def bench(
    url: Annotated[
        str | None,
        typer.Option("--url", help="Measure this one store (rooms unique to each cell)"),
    ] = None,
    backends: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: memory,sqlite,redis,postgres on their default local "
            "servers, each isolated to the run (default: sqlite)"
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", help="Output directory; rerun with it to resume")
    ] = Path("bench-results/agentrooms-bench"),
    quick: Annotated[
        bool, typer.Option("--quick", help="Writers 1,4,16, think 0,5 ms, 1 repetition, short")
    ] = False,
    policies: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated, default all: cas-none, cas-exp, cas-full, cas-decorrelated, "
            "lock, lease, writer, log, crdt, raw"
        ),
    ] = None,
    writers: Annotated[
        str | None, typer.Option(help="Writer counts (default 1,2,4,8,16,32,64)")
    ] = None,
    think: Annotated[
        str | None, typer.Option(help="Think times in ms between read and write (default 0,5,50)")
    ] = None,
    repetitions: Annotated[
        int | None, typer.Option(help="Repetitions per cell (default 3; --quick: 1)")
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(help="Seconds of closed loop, and of open loop, per cell (default 2)"),
    ] = None,
    open_duration: Annotated[float | None, typer.Option(hidden=True)] = None,
    warmup: Annotated[float | None, typer.Option(hidden=True)] = None,
    load: Annotated[
        float, typer.Option(help="Open-loop arrival rate as a share of closed-loop goodput")
    ] = 0.5,
    rate: Annotated[
        float | None,
        typer.Option(help="Fixed open-loop arrival rate (updates/s) for every cell instead"),
    ] = None,
    budget: Annotated[float, typer.Option(help="Seconds an update may take before giving up")] = (
        10.0
    ),
    lock_agents: Annotated[int, typer.Option(help="Agents in the lock fairness test")] = 48,
    peers: Annotated[
        bool,
        typer.Option(
            "--peers/--no-peers",
            help="Also the peer libraries: python-redis-lock, pottery, eventsourcing, LangGraph",
        ),
    ] = True,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write PNG plots")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="A line per cell")] = False,
) -> None:
    """Benchmark the write policies against the raw client and peer libraries.

    Policies x writer counts x think times, closed loop (goodput) and open loop (latency
    at a fixed arrival rate), every cell checked for lost or duplicated updates (exit
    code 1 if any). Results go to --out as JSON lines; a rerun with the same --out skips
    finished cells. Then summary.md, summary.csv and plots/*.png.
    """
    from agentrooms.bench import HIDDEN, POLICIES, Settings, run_bench
    from agentrooms.bench import loop as bench_loop

    if url is not None and backends is not None:
        raise typer.BadParameter("give --url or --backends, not both")
    preset: dict[str, Any] = QUICK if quick else FULL
    chosen = tuple(p.strip() for p in (policies or ",".join(POLICIES)).split(",") if p.strip())
    unknown = [p for p in chosen if p not in POLICIES and p not in HIDDEN]
    if unknown:
        raise typer.BadParameter(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    counts = _numbers(writers or preset["writers"], "--writers", int)
    thinks = _numbers(think or preset["think"], "--think", float)
    if min(counts) < 1 or min(thinks) < 0:
        raise typer.BadParameter("writers must be >= 1 and think times >= 0")
    if repetitions is not None and repetitions < 1:
        raise typer.BadParameter("--repetitions must be at least 1")
    seconds = duration if duration is not None else float(preset["duration"])
    settings = Settings(
        policies=chosen,
        writers=counts,
        think_ms=thinks,
        repetitions=repetitions if repetitions is not None else int(preset["repetitions"]),
        duration=seconds,
        open_duration=open_duration if open_duration is not None else seconds,
        warmup=warmup if warmup is not None else float(preset.get("warmup", min(1.0, seconds / 4))),
        load=load,
        rate=rate,
        budget=budget,
        lock_agents=lock_agents,
        peers=peers,
        quick=quick,
    )
    names = None if backends is None else [b.strip() for b in backends.split(",") if b.strip()]
    code = bench_loop.run(
        run_bench(
            settings, out, backends=names, url=url, console=console, verbose=verbose, plots=plots
        )
    )
    raise typer.Exit(code)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()
