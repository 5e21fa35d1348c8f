"""The ``agentrooms`` command line."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentrooms.errors import AgentroomsError, VersionConflict
from agentrooms.store import Append, Put, Store, VersionIs, open_store

DEFAULT_URL = "sqlite:///.agentrooms/agentrooms.db"

app = typer.Typer(
    help="Shared state for teams of agents: rooms, plans, leases, documents, events.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()

UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="AGENTROOMS_URL",
        help="Store URL: sqlite:///path.db, redis://host:6379/0, postgresql://..., memory://",
    ),
]


def _fail(exc: AgentroomsError) -> typer.Exit:
    console.print(f"[red]{type(exc).__name__}[/red]: {exc}")
    return typer.Exit(1)


@app.command()
def doctor(url: UrlOption = DEFAULT_URL) -> None:
    """Check the store connection and its durability settings, and say what is unsafe."""

    async def run() -> int:
        store = await open_store(url)
        try:
            info = await store.info()
            snap = await store.read("doctor", ["probe"])
        finally:
            await store.close()
        table = Table(show_header=False, box=None)
        table.add_row("backend", info.backend)
        table.add_row("url", info.url)
        table.add_row("store clock", f"{snap.now:.3f}")
        table.add_row("durability", info.durability)
        console.print(table)
        for warning in info.warnings:
            console.print(f"[yellow]warning:[/yellow] {warning}")
        return 1 if info.warnings else 0

    try:
        code = asyncio.run(run())
    except AgentroomsError as exc:
        raise _fail(exc) from exc
    raise typer.Exit(code)


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
    events = await store.read_log(room, after=max(0, last - 3))
    for event in events:
        console.print(f"  event #{event.seq} {event.type} {event.data}")


@app.command()
def demo(url: UrlOption = DEFAULT_URL) -> None:
    """Open the store, let two agents race one compare-and-set, and read back the result."""

    async def run() -> None:
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            os.makedirs(os.path.dirname(url[len("sqlite:///") :]) or ".", exist_ok=True)
        store = await open_store(url)
        try:
            await _demo(store)
        finally:
            await store.close()

    try:
        asyncio.run(run())
    except AgentroomsError as exc:
        raise _fail(exc) from exc


def main() -> None:
    app()
