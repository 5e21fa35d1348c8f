"""The command line, run in-process with typer's runner against a real SQLite store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrooms.cli import app
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.store import open_store

runner = CliRunner()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def seed(url: str) -> None:
    async def work() -> None:
        store = await open_store(url)
        room = Rooms(store).room("contract")
        await room.plan.add(
            [TaskSpec("fetch", "fetch it"), TaskSpec("tax", deps=["fetch"]), TaskSpec("risk")]
        )
        lease = await room.plan.claim("fetch", "agent-a")
        await room.plan.complete(lease, "ok")
        await room.plan.claim("tax", "agent-b", ttl=600)
        await room.events.post("note", {"text": "héllo"})
        await store.close()

    asyncio.run(work())


def test_rooms_create_list_archive_delete(url: str) -> None:
    assert invoke("rooms", "create", "contract", "--url", url, "--description", "legal")[0] == 0
    code, out = invoke("rooms", "list", "--url", url)
    assert code == 0 and "contract" in out and "legal" in out
    code, out = invoke("rooms", "create", "contract", "--url", url)
    assert code == 1 and "version_conflict" in out
    assert invoke("rooms", "archive", "contract", "--url", url)[0] == 0
    assert "contract" not in invoke("rooms", "list", "--url", url)[1]
    assert "contract" in invoke("rooms", "list", "--url", url, "--archived")[1]
    assert invoke("rooms", "delete", "contract", "--url", url, "--yes")[0] == 0
    code, out = invoke("rooms", "delete", "contract", "--url", url, "--yes")
    assert code == 1 and "not_found" in out


def test_plan_show_has_owners_leases_and_fences(url: str) -> None:
    invoke("rooms", "create", "contract", "--url", url)
    seed(url)
    code, out = invoke("plan", "show", "contract", "--url", url)
    assert code == 0
    assert "3 tasks" in out
    assert "done" in out and "fetch" in out and "by agent-a (fence 1)" in out
    assert "owner=agent-b fence=1 lease in" in out
    assert "ready" in out and "risk" in out


def test_tail_follows_events(url: str) -> None:
    invoke("rooms", "create", "contract", "--url", url)
    seed(url)
    code, out = invoke("tail", "contract", "--url", url, "--after", "0", "--count", "3")
    assert code == 0
    assert "#1 room.created" in out and "#2 task.added" in out
    code, out = invoke("tail", "nowhere", "--url", url, "--count", "1")
    assert code == 1 and "not_found" in out


def test_tokens_mint_list_revoke(url: str) -> None:
    code, out = invoke("tokens", "mint", "agent-a", "--url", url, "--rooms", "contract")
    assert code == 0
    token = out.strip().splitlines()[-1]
    assert token.startswith("ar_")
    token_id = token.split("_")[1]
    code, out = invoke("tokens", "list", "--url", url)
    assert code == 0 and token_id in out and "agent-a" in out and token not in out
    assert invoke("tokens", "revoke", token_id, "--url", url)[0] == 0
    assert invoke("tokens", "revoke", token_id, "--url", url)[0] == 1
    assert "ago" in invoke("tokens", "list", "--url", url)[1]  # revoked column filled


def test_doctor_reports_durability(url: str) -> None:
    code, out = invoke("doctor", "--url", url)
    assert code == 0 and "sqlite" in out and "durability" in out
    code, out = invoke("doctor", "--url", url + "?synchronous=NORMAL")
    assert code == 1 and "warning" in out


def test_bad_url_and_demo(url: str) -> None:
    code, out = invoke("doctor", "--url", "mongodb://x")
    assert code == 1 and "unknown store URL scheme" in out
    code, out = invoke("demo", "--url", url)
    assert code == 0 and "committed" in out and "conflict" in out


def test_serve_refuses_dev_mode_off_loopback() -> None:
    code, out = invoke("serve", "--dev", "--host", "0.0.0.0")
    assert code == 2 and "refusing" in out


def test_mcp_over_stdio_from_the_cli(url: str, tmp_path: Path) -> None:
    """`agentrooms mcp --agent A` speaks MCP on stdio (the SDK's own client drives it)."""
    import sys

    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    invoke("rooms", "create", "contract", "--url", url)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agentrooms", "mcp", "--agent", "agent-a", "--url", url],
        cwd=str(tmp_path),
    )

    async def session() -> str:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            tools = {t.name for t in (await s.list_tools()).tools}
            assert {"join_room", "claim_task", "read_new_events"} <= tools
            joined = await s.call_tool("join_room", {"room": "contract"})
            assert not joined.is_error
            return str(joined.content[0].text)  # type: ignore[union-attr]

    assert "agent-a" in asyncio.run(session())
