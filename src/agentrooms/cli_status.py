"""``agentrooms status ROOM``: the operator's first screen in a terminal.

What is stuck first (most urgent first), then the plan's counts, locks with their lines,
presence, cursor lag, effects, the designated writer and contention; readable at 80
columns. ``--json`` prints the operator API's JSON of the room page instead
(docs/operations.md). ``--watch`` prints it again each time the room's log grows (woken
by the store's watch) and at least every ``--every`` seconds (leases run out without an
event); in a terminal it redraws in place, otherwise it prints one screen (one JSON line
with ``--json``) after another. Exit code 0 whatever is stuck; the errors of every
command otherwise. With ``--server`` the page comes from that server's operator API
(``GET /v1/ops/rooms/{room}``, the token needs ``ops:read``), and ``--watch`` reads it
again every ``--every`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import types
import typing
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agentrooms.cli_common import (
    DEFAULT_URL,
    EXIT_OK,
    RoomArg,
    ServerOption,
    UrlOption,
    _remote,
    _run,
    console,
    literal,
)
from agentrooms.ops import EXPIRED, EXPIRED_LAST, Ops, RoomPage, Thresholds, as_json
from agentrooms.store import Store

if TYPE_CHECKING:
    from agentrooms.client import Client

SHOWN = 8  # rows per section beyond the stuck list (the rest are counted)
_DEFAULT = Thresholds()
LIFECYCLE = ("pending", "ready", "claimed", EXPIRED, EXPIRED_LAST, "done", "failed", "cancelled")


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def _table(title: str, *columns: str) -> Table:
    table = Table(title=Text(title, "bold"), title_justify="left", box=None, pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _more(shown: int, total: int) -> list[RenderableType]:
    return [Text(f"  ... {total - shown} more", "dim")] if total > shown else []


def render(page: RoomPage) -> RenderableType:
    """The room page as the terminal screen (no markup read from agents' text)."""
    parts: list[RenderableType] = [
        Text.assemble(
            literal(page.room, "bold"),
            f"  seq {page.last_seq}",
            "  (archived)" if page.archived else "",
        )
    ]
    if page.stuck:
        stuck = _table(f"STUCK ({page.stuck_total})", "kind", "subject", "detail")
        for item in page.stuck:
            stuck.add_row(Text(item.kind, "red"), literal(item.subject), literal(item.detail))
        parts += [stuck, *_more(len(page.stuck), page.stuck_total)]
    else:
        parts.append(Text("nothing stuck", "green"))
    plan = page.plan
    order = {state: i for i, state in enumerate(LIFECYCLE)}
    states = sorted(plan.states.items(), key=lambda item: (order.get(item[0], 99), item[0]))
    counts = " · ".join(f"{n} {state}" for state, n in states)
    parts.append(Text.assemble(Text("PLAN ", "bold"), f"{plan.total} tasks: {counts or '-'}"))
    locks = _table(f"LOCKS ({len(page.locks)})", "lock", "holder", "fence", "left", "line")
    for lock in page.locks[:SHOWN]:
        waited = [w.waited for w in lock.waiters if w.waited is not None]
        line = f"{lock.queued}" + (f", longest {_ago(max(waited))}" if waited else "")
        holder = literal(lock.holder) if lock.holder is not None else Text("free", "dim")
        left = _ago(lock.remaining)
        locks.add_row(literal(lock.name), holder, str(lock.fence), left, line)
    if page.locks:
        parts += [locks, *_more(min(SHOWN, len(page.locks)), len(page.locks))]
    presence = _table(f"PRESENCE ({len(page.presence)})", "agent", "seen", "status")
    for member in page.presence[:SHOWN]:
        presence.add_row(literal(member.agent), f"{_ago(member.age)} ago", literal(member.status))
    if page.presence:
        parts += [presence, *_more(min(SHOWN, len(page.presence)), len(page.presence))]
    lag = _table(f"LAG ({len(page.cursors)} cursors)", "agent", "position", "behind")
    for cursor in page.cursors[:SHOWN]:
        lag.add_row(literal(cursor.agent), str(cursor.position), str(cursor.lag))
    if page.cursors:
        parts += [lag, *_more(min(SHOWN, len(page.cursors)), len(page.cursors))]
    effects = ", ".join(f"{n} {s}" for s, n in sorted(page.effects.counts.items()))
    writer = f"writer {page.writer.queued} queued, {page.writer.dead_letters} dead letters"
    parts.append(Text.assemble(Text("EFFECTS ", "bold"), effects or "-", f"; {writer}"))
    if page.contention:
        hot = ", ".join(f"{c.prefix} {c.conflicts}" for c in page.contention[:4])
        parts.append(Text.assemble(Text("CONTENTION ", "bold"), literal(hot)))
    return Group(*parts)


def _rebuilt(kind: Any, data: Any) -> Any:
    """The read model value of type ``kind`` whose :func:`as_json` is ``data`` (nested
    dataclasses, lists and optionals, by the fields' type hints)."""
    if data is None:
        return None
    if isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(data, dict):
        hints = typing.get_type_hints(kind)
        return kind(
            **{
                f.name: _rebuilt(hints[f.name], data[f.name])
                for f in dataclasses.fields(kind)
                if f.name in data
            }
        )
    origin = typing.get_origin(kind)
    if origin is list and isinstance(data, list):
        (item,) = typing.get_args(kind)
        return [_rebuilt(item, v) for v in data]
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(kind):
            if dataclasses.is_dataclass(arg):
                return _rebuilt(arg, data)
    return data


def status(
    room: RoomArg,
    url: UrlOption = DEFAULT_URL,
    as_json_: Annotated[
        bool, typer.Option("--json", help="Print the operator API's JSON of the room page")
    ] = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="Print again whenever the room changes")
    ] = False,
    every: Annotated[
        float, typer.Option("--every", min=0.1, help="--watch: refresh at least every N s")
    ] = 5.0,
    effect_unknown: Annotated[
        float, typer.Option(min=0, help="Seconds an effect is unknown before it is stuck")
    ] = _DEFAULT.effect_unknown,
    waiter_waiting: Annotated[
        float, typer.Option(min=0, help="Seconds a lock waiter waits before it is stuck")
    ] = _DEFAULT.waiter_waiting,
    cursor_lag: Annotated[
        int, typer.Option(min=0, help="Events a cursor lags before it is stuck")
    ] = _DEFAULT.cursor_lag,
    server: ServerOption = None,
) -> None:
    """A room's first screen: what is stuck, the plan, locks, presence and lag."""
    limits = Thresholds(effect_unknown, waiter_waiting, cursor_lag)

    def show(page: RoomPage) -> RenderableType:
        if as_json_:
            return Text(json.dumps(as_json(page), ensure_ascii=False, separators=(",", ":")))
        return render(page)

    async def work(store: Store) -> None:
        ops = Ops(store, limits)
        page = await ops.room(room)
        if not watch:
            console.print(show(page), soft_wrap=as_json_)
            return
        live = Live(console=console, auto_refresh=False) if console.is_terminal else None
        with live or contextlib.nullcontext():
            while True:
                if live is not None:
                    live.update(show(page), refresh=True)
                else:
                    console.print(show(page), soft_wrap=as_json_)
                    console.file.flush()
                deadline = time.monotonic() + every
                while (left := deadline - time.monotonic()) > 0:
                    if await store.watch(room, page.last_seq, left) > page.last_seq:
                        break
                page = await ops.room(room)

    async def remote(client: Client) -> None:
        params = dataclasses.asdict(limits)
        path = f"/ops/rooms/{room}"
        while True:
            body = await client.http.json("GET", path, safety="idempotent", params=params)
            page = _rebuilt(RoomPage, body)
            console.print(show(page), soft_wrap=as_json_)
            console.file.flush()
            if not watch:
                return
            await asyncio.sleep(every)

    try:
        if server is not None:
            _remote(server, remote)
        else:
            _run(url, work)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_OK) from None
