"""``agentrooms serve``, ``mcp``, ``doctor``, ``migrate``, ``demo`` and ``bench``: the
commands that serve a store, check it, migrate its projections, or measure it."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_type_hints

import typer
from rich.table import Table
from rich.text import Text

from agentrooms.cli_common import (
    DEFAULT_URL,
    EXIT_FINDING,
    EXIT_OK,
    EXIT_USAGE,
    JsonOption,
    RoomArg,
    ServerOption,
    UrlOption,
    _need_extra,
    _prepare,
    _remote,
    _report,
    _run,
    _when,
    console,
    emit_json,
    err_console,
    fail,
    literal,
    plain,
    say,
    shown_url,
)
from agentrooms.errors import (
    AgentroomsError,
    VersionConflict,
)
from agentrooms.server.limits import HttpLimits
from agentrooms.store import Append, Put, Store, VersionIs

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
            "MCP /mcp; metrics /metrics; dashboard /ui",
        ),
    ]


LIMIT_HELP: dict[str, str] = {
    "max_body_bytes": "Request body, bytes (413 past it)",
    "max_json_depth": "Nesting depth of a JSON body (400 past it)",
    "max_string_bytes": "One JSON string or key, bytes (400 past it)",
    "max_items": "Items of one JSON array or members of one object (400 past it)",
    "max_batch": "Tasks added in one request (400 past it)",
    "max_result_bytes": "Bytes of one MCP tool result: lists shorten, large values come in parts",
    "rate": "Requests per second per agent, refilled continuously (429 past the burst)",
    "burst": "Requests an idle agent may send at once",
    "max_stream_seconds": "Seconds an event stream lasts before it ends (clients resume)",
    "keepalive_seconds": "Seconds between keep-alive comments on an idle event stream",
    "max_lock_wait": "Longest queue wait of one lock acquire request, seconds",
    "max_wait": "Longest wait of one task claim or read of new events, seconds (at most 30)",
    "max_header_bytes": "Request line and headers, bytes (431 past it)",
    "header_timeout": "Seconds to send the request line and headers (408)",
    "body_timeout": "Seconds to send a body once the headers are in (408)",
    "max_connections": "Requests served at once by this process (503 past it)",
    "max_streams_per_agent": "Open event streams, and MCP listen streams, per agent (429)",
    "max_dashboard_streams": "Open dashboard (/ui) change streams per agent, apart (429)",
    "auth_failures": "Failed authentications per client address before 429",
    "auth_failure_rate": "Per second, refilling an address's failed-auth allowance",
}


_LIMIT_TYPES = get_type_hints(HttpLimits)


def _off_at_zero(name: str) -> bool:
    """Whether the ``HttpLimits`` field ``name`` takes ``None`` (off), given as 0 here."""
    return type(None) in get_args(_LIMIT_TYPES[name])


def limit_envvar(name: str) -> str:
    """The environment variable of the ``HttpLimits`` field ``name`` (``AGENTROOMS_RATE``)."""
    return f"AGENTROOMS_{name.upper()}"


def _with_limit_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` one option per :class:`HttpLimits` field, passed in its ``**limits``:
    ``--max-body-bytes`` or ``AGENTROOMS_MAX_BODY_BYTES`` (a flag beats the variable), the
    field's default as the option's; a field that ``None`` turns off takes 0 for off. A
    field without help in :data:`LIMIT_HELP` is a ``KeyError`` here, at import."""
    params = [
        p
        for p in inspect.signature(command, eval_str=True).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    for field in dataclasses.fields(HttpLimits):
        off = _off_at_zero(field.name)
        kind = (
            next(t for t in get_args(_LIMIT_TYPES[field.name]) if t is not type(None))
            if off
            else _LIMIT_TYPES[field.name]
        )
        option = typer.Option(
            envvar=limit_envvar(field.name),
            help=LIMIT_HELP[field.name] + ("; 0 turns it off" if off else ""),
            rich_help_panel="Limits",
        )
        params.append(
            inspect.Parameter(
                field.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=0 if field.default is None else field.default,
                annotation=Annotated[kind, option],
            )
        )
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command


@_with_limit_options
def serve(
    url: UrlOption = DEFAULT_URL,
    host: Annotated[
        str, typer.Option(envvar="AGENTROOMS_HOST", help="Interface to bind")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="AGENTROOMS_PORT", help="TCP port")] = 8080,
    dev: Annotated[
        bool,
        typer.Option("--dev", help="No tokens: act as the agent in X-Agent (127.0.0.1 only)"),
    ] = False,
    log_format: Annotated[
        str,
        typer.Option(
            envvar="AGENTROOMS_LOG_FORMAT",
            help="text, or json: one JSON object per line on stderr, with request ids",
        ),
    ] = "text",
    **limits: Any,
) -> None:
    """Serve the HTTP API (with /metrics, /healthz, /readyz) and MCP at /mcp.

    Every limit (the Limits panel of --help) is a flag or its AGENTROOMS_* environment
    variable; a value out of range is a usage error (exit 2)."""
    _need_extra("server", "agentrooms serve")
    from agentrooms.server import AuthConfig, check_bind
    from agentrooms.server import serve as run_server

    auth = AuthConfig(dev=dev)
    given: dict[str, Any] = {
        k: None if v == 0 and _off_at_zero(k) else v for k, v in limits.items()
    }
    try:
        http_limits = HttpLimits(**given)
        check_bind(host, auth)
        if log_format not in ("text", "json"):
            raise ValueError(f"--log-format must be text or json, not {log_format!r}")
    except ValueError as exc:
        fail("bad_request", exc, EXIT_USAGE)
    _prepare(url)
    for line in _banner(url, host, port, dev):
        console.print(line, soft_wrap=True)
    run_server(url, host, port, auth, http_limits, log_format=log_format)


def mcp(
    agent: Annotated[str, typer.Option("--agent", help="The agent every call acts as")],
    url: UrlOption = DEFAULT_URL,
    rooms: Annotated[
        str | None, typer.Option(help="Comma-separated rooms the agent may enter (default all)")
    ] = None,
    profile: Annotated[
        str, typer.Option(help="Tool set: full (default) or worker (the claim-work loop only)")
    ] = "full",
) -> None:
    """Serve the MCP server on stdin/stdout for one agent (for a local agent runtime).

    stdout carries only the protocol: the store it serves and any error go to stderr."""
    _need_extra("mcp", "agentrooms mcp")
    from agentrooms.server.mcp.stdio import run_stdio

    _prepare(url)
    err_console.print(
        Text.assemble(
            "agentrooms mcp: agent ", literal(agent), " on store ", literal(shown_url(url))
        ),
        soft_wrap=True,
    )
    try:
        run_stdio(url, agent, rooms=None if rooms is None else rooms.split(","), profile=profile)
    except AgentroomsError as exc:
        raise typer.Exit(_report(exc, url)) from exc


def doctor(
    url: UrlOption = DEFAULT_URL, as_json: JsonOption = False, server: ServerOption = None
) -> None:
    """Check the store connection and its durability settings, and say what is unsafe.

    ``--json``: ``{"backend", "url", "durability", "warnings", "details", "now"}``; the
    exit code is the same (1 when there are warnings). With ``--server``: the server's
    ``/healthz``, version, store backend and durability (never its URL), limits, and the
    token in $AGENTROOMS_TOKEN (works? which scopes?); ``--json``: ``{"server",
    "healthz", "version", "now", "store", "limits", "token", "agent", "scopes"}``."""
    if server is not None:
        raise typer.Exit(_doctor_remote(server, as_json))

    async def work(store: Store) -> int:
        info = await store.info()
        snap = await store.read("doctor", ["probe"])
        if as_json:
            emit_json({**plain(info), "now": snap.now})
            return EXIT_FINDING if info.warnings else EXIT_OK
        table = Table(show_header=False, box=None)
        table.add_row("backend", info.backend)
        table.add_row("url", literal(info.url))
        table.add_row("store clock", f"{snap.now:.3f}")
        if "clock" in info.details:
            table.add_row("expiry judged by", literal(str(info.details["clock"])))
        table.add_row("durability", literal(info.durability))
        if "wait" in info.details:
            table.add_row("replica acks", literal(str(info.details["wait"])))
        for i, shard in enumerate(info.details.get("topology", ())):  # a Redis Cluster
            table.add_row("topology" if i == 0 else "", literal(str(shard)))
        console.print(table)
        for warning in info.warnings:
            say(literal("warning:", "yellow"), " ", warning)
        return EXIT_FINDING if info.warnings else EXIT_OK

    raise typer.Exit(_run(url, work))


def _doctor_remote(server: str, as_json: bool) -> int:
    """``doctor --server``: print what the server says about itself; the exit code is
    1 when its store has unsafe settings (a token that does not work exits as its
    error's family, 2)."""
    from agentrooms.client.tokens import server_info

    found = {"server": shown_url(server), **_remote(server, server_info)}
    warnings = found["store"]["warnings"]
    if as_json:
        emit_json(found)
        return EXIT_FINDING if warnings else EXIT_OK
    token = found["token"]
    table = Table(show_header=False, box=None)
    table.add_row("server", literal(found["server"]))
    table.add_row("healthz", literal(found["healthz"]))
    table.add_row("version", literal(found["version"]))
    table.add_row("backend", literal(found["store"]["backend"]))
    table.add_row("durability", literal(found["store"]["durability"]))
    table.add_row("store clock", f"{found['now']:.3f}")
    if token is None:
        table.add_row("token", "none sent: the server is in dev mode")
    else:
        expiry = _when(token["expires_at"], found["now"])
        table.add_row("token", literal(f"{token['id']} works, expires {expiry}"))
    table.add_row("agent", literal(found["agent"]))
    table.add_row("scopes", literal(" ".join(found["scopes"])))
    for name, value in found["limits"].items():
        table.add_row(f"limit {name}", literal("off" if value is None else value))
    console.print(table)
    for warning in warnings:
        say(literal("warning:", "yellow"), " ", warning)
    return EXIT_FINDING if warnings else EXIT_OK


# ------------------------------------------------------------------------- migrating


def migrate(
    room: RoomArg,
    old: Annotated[str, typer.Argument(help="Old projection, as module:attribute")],
    new: Annotated[str, typer.Argument(help="New projection, as module:attribute")],
    url: UrlOption = DEFAULT_URL,
    step: Annotated[
        str, typer.Option(help="expand | migrate | contract | all | rollback | status")
    ] = "status",
    as_json: JsonOption = False,
) -> None:
    """Expand / migrate / contract a projection to a new version without stopping readers.

    ``--json``: the migration's status after the step (name, old, new, phase, active,
    old_position, new_position, head)."""
    from agentrooms.sourcing.migration import migrate_projection

    if step not in ("expand", "migrate", "contract", "all", "rollback", "status"):
        fail("bad_request", f"unknown step {step!r}", EXIT_USAGE)
    status = _run(url, lambda store: migrate_projection(store, room, old, new, step=step))  # type: ignore[arg-type]
    if as_json:
        emit_json(status)
        return
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


def demo(url: UrlOption = DEFAULT_URL) -> None:
    """Let two agents race one compare-and-set on the store, and read back the result."""
    _run(url, _demo)


# ----------------------------------------------------------------------------- bench

BENCH_MISSING = (
    "agentrooms bench needs the agentrooms-bench distribution (the benchmark suite and its "
    "peer libraries): `pip install ./benchmarks` from a clone of the repository, or "
    "`python3 dev.py cli bench` there"
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
