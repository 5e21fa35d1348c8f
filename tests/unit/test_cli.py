"""The command line, run in-process with typer's runner against a real SQLite store."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrooms import errors
from agentrooms.cli import (
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
    _banner,
    _default_url,
    app,
    default_store,
    exit_code,
    literal,
)
from agentrooms.rooms import Rooms, TaskSpec
from agentrooms.store import open_store

runner = CliRunner()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def invoke_split(*args: str, columns: int = 200) -> tuple[int, str, str]:
    """Exit code, stdout and stderr apart; a crash (not ``typer.Exit``) fails the test."""
    result = runner.invoke(app, list(args), env={"COLUMNS": str(columns)})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


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


def test_rooms_list_by_page(url: str) -> None:
    for name in ("pa", "pb", "pc"):
        assert invoke("rooms", "create", name, "--url", url)[0] == 0
    code, out = invoke("rooms", "list", "--url", url, "--limit", "2", "--json")
    first = json.loads(out)
    assert code == 0 and [r["name"] for r in first["rooms"]] == ["pa", "pb"]
    assert first["next_after"] == "pb"
    code, out = invoke("rooms", "list", "--url", url, "--limit", "2", "--after", "pb", "--json")
    assert json.loads(out) == {"rooms": [json.loads(out)["rooms"][0]], "next_after": None}
    assert json.loads(out)["rooms"][0]["name"] == "pc"
    code, out = invoke("rooms", "list", "--url", url, "--limit", "1")
    assert code == 0 and "pa" in out and "pb" not in out and "--after pa" in out
    code, out = invoke("rooms", "list", "--url", url, "--json")
    assert [r["name"] for r in json.loads(out)["rooms"]] == ["pa", "pb", "pc"]
    assert invoke("rooms", "list", "--url", url, "--limit", "0")[0] != 0


def test_rooms_create_list_archive_delete(url: str) -> None:
    assert invoke("rooms", "create", "contract", "--url", url, "--description", "legal")[0] == 0
    code, out = invoke("rooms", "list", "--url", url)
    assert code == 0 and "contract" in out and "legal" in out
    code, out = invoke("rooms", "create", "contract", "--url", url)
    assert code == EXIT_REFUSED and "version_conflict" in out
    assert invoke("rooms", "archive", "contract", "--url", url)[0] == 0
    assert "contract" not in invoke("rooms", "list", "--url", url)[1]
    assert "contract" in invoke("rooms", "list", "--url", url, "--archived")[1]
    assert invoke("rooms", "delete", "contract", "--url", url, "--yes")[0] == 0
    code, out = invoke("rooms", "delete", "contract", "--url", url, "--yes")
    assert code == EXIT_NOT_FOUND and "not_found" in out


def test_plan_show_has_owners_leases_and_fences(url: str) -> None:
    invoke("rooms", "create", "contract", "--url", url)
    seed(url)
    code, out = invoke("plan", "show", "contract", "--url", url)
    assert code == 0
    assert "3 tasks" in out
    assert "done" in out and "fetch" in out and "by agent-a (fence 1)" in out
    assert "owner=agent-b fence=1 lease in" in out
    assert "ready" in out and "risk" in out


def test_plan_show_shows_an_expired_lease_as_expired_reclaimable(url: str) -> None:
    async def work() -> None:
        store = await open_store(url)
        room = await Rooms(store).create("contract")
        await room.plan.add([TaskSpec("gone"), TaskSpec("kept")])
        await room.plan.claim("gone", "agent-a", ttl=0.2)
        await room.plan.claim("kept", "agent-b", ttl=600)
        await asyncio.sleep(0.4)
        await store.close()

    asyncio.run(work())
    code, out = invoke("plan", "show", "contract", "--url", url)
    assert code == 0
    [gone] = [line for line in out.splitlines() if "gone" in line]
    [kept] = [line for line in out.splitlines() if "kept" in line]
    assert "expired, reclaimable" in gone and "owner=agent-a" in gone and "ago (since" in gone
    assert "claimed" in kept and "expired" not in kept and "lease in" in kept


def test_tail_follows_events(url: str) -> None:
    invoke("rooms", "create", "contract", "--url", url)
    seed(url)
    code, out = invoke("tail", "contract", "--url", url, "--after", "0", "--count", "3")
    assert code == 0
    assert "#1 room.created" in out and "#2 task.added" in out
    code, out = invoke("tail", "nowhere", "--url", url, "--count", "1")
    assert code == EXIT_NOT_FOUND and "not_found" in out


def test_tail_names_each_events_author(url: str) -> None:
    async def work() -> None:
        store = await open_store(url)
        room = await Rooms(store).create("contract")
        await room.events.post("note", {"n": 1}, author="agent-a")
        await store.close()

    asyncio.run(work())
    code, out = invoke("tail", "contract", "--url", url, "--after", "0", "--count", "2")
    assert code == 0
    assert out.splitlines() == [
        '#1 room.created {"room": "contract"}',
        '#2 note by agent-a {"n": 1}',
    ]


def test_tokens_mint_list_revoke(url: str) -> None:
    code, out = invoke("tokens", "mint", "agent-a", "--url", url, "--rooms", "contract")
    assert code == 0
    token = out.strip().splitlines()[-1]
    assert token.startswith("ar_")
    token_id = token.split("_")[1]
    code, out = invoke("tokens", "list", "--url", url)
    assert code == 0 and token_id in out and "agent-a" in out and token not in out
    assert invoke("tokens", "revoke", token_id, "--url", url)[0] == 0
    assert invoke("tokens", "revoke", token_id, "--url", url)[0] == EXIT_NOT_FOUND
    assert "ago" in invoke("tokens", "list", "--url", url)[1]  # revoked column filled


def test_doctor_reports_durability(url: str) -> None:
    code, out = invoke("doctor", "--url", url)
    assert code == 0 and "sqlite" in out and "durability" in out
    code, out = invoke("doctor", "--url", url + "?synchronous=NORMAL")
    assert code == 1 and "warning" in out


def test_bad_url_and_demo(url: str) -> None:
    code, out = invoke("doctor", "--url", "mongodb://x")
    assert code == EXIT_USAGE and "unknown store URL scheme" in out
    code, out = invoke("demo", "--url", url)
    assert code == 0 and "committed" in out and "conflict" in out


def test_serve_refuses_dev_mode_off_loopback() -> None:
    code, out = invoke("serve", "--dev", "--host", "0.0.0.0")
    assert code == 2 and "refusing" in out


def test_mcp_over_stdio_from_the_cli(url: str, tmp_path: Path) -> None:
    """`agentrooms mcp --agent A` speaks MCP on stdio (the SDK's own client drives it)."""
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


# ------------------------------------------------------------ agent text, printed literally


def seed_hostile(url: str) -> None:
    """A room, task and events whose text looks like Rich markup, emoji codes and
    terminal escapes."""

    async def work() -> None:
        store = await open_store(url)
        rooms = Rooms(store)
        room = await rooms.create("contract", "see [/] and [red]x :smile:")
        await room.plan.add([TaskSpec("fix", "[/] fix [b]it[/b]")])
        await room.events.post("note", {"text": "per [clause 7], [bold]not bold[/bold]"})
        await room.events.post("note", {"text": "\x1b[2J" + "w" * 400})
        await rooms.create("escape", "\x1b]0;owned\x07 title")
        await store.close()

    asyncio.run(work())


def test_tail_prints_event_text_literally_one_line_each(url: str) -> None:
    seed_hostile(url)
    code, out, err = invoke_split(
        "tail", "contract", "--url", url, "--after", "2", "--count", "2", columns=80
    )
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == '#3 note {"text": "per [clause 7], [bold]not bold[/bold]"}'
    assert lines[1] == '#4 note {"text": "\\u001b[2J' + "w" * 400 + '"}'  # not wrapped at 80
    assert len(lines) == 2


def test_markup_in_room_and_task_text_breaks_no_listing(url: str) -> None:
    seed_hostile(url)
    code, out, err = invoke_split("rooms", "list", "--url", url)
    assert code == 0 and err == ""
    assert "see [/] and [red]x :smile:" in out
    assert "\\x1b]0;owned\\x07 title" in out and "\x1b" not in out  # escapes, shown
    code, out, err = invoke_split("plan", "show", "contract", "--url", url)
    assert code == 0 and err == ""
    assert "[/] fix [b]it[/b]" in out and "contract: 1 tasks" in out


def test_literal_shows_control_characters_and_keeps_markup_text() -> None:
    assert literal("[bold]x[/] :smile:").plain == "[bold]x[/] :smile:"
    assert literal("a\tb\nc\x1b[31m\x7f\x9b").plain == "a\tb\nc\\x1b[31m\\x7f\\x9b"


# ---------------------------------------------------------------- errors and exit codes


def test_errors_go_to_stderr_with_the_exit_code_of_their_family(url: str, tmp_path: Path) -> None:
    assert invoke_split("rooms", "create", "contract", "--url", url)[0] == 0
    code, out, err = invoke_split("rooms", "create", "contract", "--url", url)
    assert (code, out) == (EXIT_REFUSED, "") and err.startswith("version_conflict: ")
    code, out, err = invoke_split("tail", "nowhere", "--url", url, "--count", "1")
    assert (code, out) == (EXIT_NOT_FOUND, "") and err.startswith("not_found: room 'nowhere'")
    code, out, err = invoke_split("tokens", "revoke", "nothing", "--url", url)
    assert (code, out) == (EXIT_NOT_FOUND, "") and err.startswith("not_found: ")
    code, out, err = invoke_split("doctor", "--url", "mongodb://x")
    assert (code, out) == (EXIT_USAGE, "") and err.startswith("bad_request: unknown store URL")
    assert err.count("\n") == 1  # one line, not wrapped
    code, out, err = invoke_split("serve", "--dev", "--host", "0.0.0.0")
    assert (code, out) == (EXIT_USAGE, "") and "refusing" in err
    declined = runner.invoke(app, ["rooms", "delete", "contract", "--url", url], input="n\n")
    assert declined.exit_code == EXIT_FINDING and "Aborted" in declined.stderr
    assert invoke_split("rooms", "list", "--url", url)[1].count("contract") == 1  # kept
    code, out, err = invoke_split("rooms", "list", "--no-such-option")
    assert (code, out) == (EXIT_USAGE, "") and "No such option" in err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = invoke_split("rooms", "list", "--url", f"sqlite:///{blocker}/x.db")
    assert (code, out) == (EXIT_UNAVAILABLE, "")
    folder = f"cannot create the folder {blocker} of the store {blocker}/x.db: File exists"
    assert err == f"store_unavailable: {folder}\n"


def test_every_error_kind_has_an_exit_code() -> None:
    kinds = [getattr(errors, name) for name in errors.__all__]
    for kind in kinds:
        if kind is errors.AgentroomsError:
            continue
        code = exit_code(kind.__new__(kind))
        assert code in (EXIT_USAGE, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_UNAVAILABLE), kind
    assert exit_code(errors.LockHeld.__new__(errors.LockHeld)) == EXIT_REFUSED
    assert exit_code(errors.PayloadTooLarge.__new__(errors.PayloadTooLarge)) == EXIT_USAGE
    with pytest.raises(LookupError):
        exit_code(errors.AgentroomsError())


def test_exit_codes_are_the_documented_table() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "surfaces.md").read_text()
    table = dict(
        (int(code), words)
        for code, words in re.findall(r"^\| (\d) \| (.+) \|$", text, re.MULTILINE)
    )
    assert sorted(table) == [0, 1, 2, 3, 4, 5, 6]
    from agentrooms_bench.suite import EXIT_FAILED, EXIT_LOST
    from agentrooms_bench.suite import EXIT_USAGE as BENCH_USAGE

    assert (EXIT_OK, EXIT_FINDING, EXIT_CRASHED) == (0, 1, 3)
    assert (EXIT_LOST, BENCH_USAGE, EXIT_FAILED) == (EXIT_FINDING, EXIT_USAGE, EXIT_CRASHED)
    kinds = [getattr(errors, name) for name in errors.__all__]
    for kind in kinds:
        if not any(other is not kind and issubclass(other, kind) for other in kinds):
            code = exit_code(kind.__new__(kind))  # every error a store raises
            assert f"`{kind.code}`" in table[code], (kind, code)
    assert set(EXIT_CODES.values()) == {EXIT_USAGE, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_UNAVAILABLE}


# ------------------------------------------------------------------------- default store


def cli(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("AGENTROOMS_URL", "XDG_DATA_HOME")}
    return subprocess.run(
        [sys.executable, "-m", "agentrooms", *args],
        cwd=cwd,
        env={**clean, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_default_store_is_one_absolute_file_for_every_folder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    made = cli(one, {"XDG_DATA_HOME": str(data)}, "rooms", "create", "r1")
    store = data / "agentrooms" / "agentrooms.db"
    assert made.returncode == 0 and f"in the store sqlite:///{store}" in made.stdout
    listed = cli(two, {"XDG_DATA_HOME": str(data)}, "rooms", "list")
    assert listed.returncode == 0 and "r1" in listed.stdout
    assert store.is_file() and not (one / ".agentrooms").exists()
    empty = cli(two, {"XDG_DATA_HOME": str(tmp_path / "elsewhere")}, "rooms", "list")
    assert empty.returncode == 0 and "no rooms in the store sqlite:///" in empty.stdout


def test_default_store_follows_xdg_then_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    assert default_store() == tmp_path / ".local/share/agentrooms/agentrooms.db"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_store() == tmp_path / "xdg/agentrooms/agentrooms.db"
    assert default_store().is_absolute()
    assert DEFAULT_URL.startswith("sqlite:////")  # the default is absolute, and in --help
    assert DEFAULT_URL in " ".join(invoke("rooms", "list", "--help")[1].split()).replace(" ", "")


def test_no_home_means_no_default_and_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def unknown() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setattr(Path, "home", unknown)
    assert _default_url() == NO_DEFAULT
    code, out, err = invoke_split("rooms", "list", "--url", NO_DEFAULT)
    assert (code, out) == (EXIT_USAGE, "")
    assert (
        err == "bad_request: there is no default store: set XDG_DATA_HOME or HOME, or give --url\n"
    )


def test_mcp_in_an_unwritable_folder(tmp_path: Path) -> None:
    """An MCP host may start `agentrooms mcp` anywhere: the working directory does not
    matter, and a store location that cannot be made is one line on stderr."""
    readonly = Path("/proc")  # not writable, even by root
    data = {"XDG_DATA_HOME": str(tmp_path / "data")}
    served = cli(readonly, data, "mcp", "--agent", "agent-a")  # stdin closed: it ends
    assert served.returncode == 0, served.stderr
    assert served.stdout == "" and "on store sqlite:///" in served.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    refused = cli(readonly, {"XDG_DATA_HOME": str(blocker)}, "mcp", "--agent", "agent-a")
    assert refused.returncode == EXIT_UNAVAILABLE and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"store_unavailable: cannot create the folder {blocker}/agentrooms of the store "
        f"{blocker}/agentrooms/agentrooms.db: Not a directory"
    ]


def test_serve_names_an_unreachable_store_in_one_line(tmp_path: Path) -> None:
    done = cli(tmp_path, {}, "serve", "--port", "0", "--url", "postgresql://u:pw@127.0.0.1:1/x")
    assert done.returncode == EXIT_UNAVAILABLE
    assert "Traceback" not in done.stderr and "pw" not in done.stdout + done.stderr
    assert done.stderr.startswith("store_unavailable: ") and done.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------- /docs


def test_serve_advertises_only_paths_that_answer() -> None:
    """The banner and the docs name /openapi.json, not a /docs page the server lacks."""
    import httpx

    from agentrooms.server import AuthConfig, HttpLimits, create_app

    banner = " ".join(line.plain for line in _banner("memory://", "127.0.0.1", 8080, True))
    paths = re.findall(r"(?<![\w./:])(/[a-z0-9.]+)", banner)
    assert "/openapi.json" in paths and "/docs" not in paths
    root = Path(__file__).resolve().parents[2]
    for doc in [root / "README.md", *(root / "docs").glob("*.md")]:
        assert not re.search(r"(?<![\w.])/docs\b(?!/)", doc.read_text()), doc

    async def answers() -> dict[str, int]:
        store = await open_store("memory://")
        http_app = create_app(store, auth=AuthConfig(dev=True), limits=HttpLimits())
        transport = httpx.ASGITransport(app=http_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            got = {p: (await c.get(p + "/rooms" * (p == "/v1"))).status_code for p in paths}
            got["/docs"] = (await c.get("/docs")).status_code
        await store.close()
        return got

    got = asyncio.run(answers())
    assert got.pop("/docs") == 404
    got.pop("/mcp")  # mounted by serve itself; tested with the MCP server
    assert got == dict.fromkeys(got, 200)


def test_serve_has_a_flag_and_a_variable_for_every_limit() -> None:
    import dataclasses

    from typer.main import get_command

    from agentrooms.cli_serve import limit_envvar
    from agentrooms.server import HttpLimits

    serve = get_command(app).commands["serve"]  # type: ignore[attr-defined]
    options = {p.name: p for p in serve.params}
    for field in dataclasses.fields(HttpLimits):
        option = options[field.name]
        assert option.opts == ["--" + field.name.replace("_", "-")]
        assert option.envvar == limit_envvar(field.name)
        assert option.default == (0 if field.default is None else field.default)
    assert options["port"].envvar == "AGENTROOMS_PORT"


def test_serve_refuses_a_limit_out_of_range(url: str) -> None:
    result = runner.invoke(
        app, ["serve", "--dev", "--url", url], env={"AGENTROOMS_MAX_BODY_BYTES": "0"}
    )
    assert result.exit_code == EXIT_USAGE
    assert "max_body_bytes must be at least 1" in result.stderr


def test_tokens_list_is_whole_at_80_columns(url: str) -> None:
    agent = "worker-" + "x" * 90  # longer than a line: folded, never cut
    minted = [
        invoke("tokens", "mint", agent, "--url", url, "--rooms", "contract-42,contract-43")[1],
        invoke("tokens", "mint", "brief", "--url", url, "--ttl", "7200")[1],
        invoke("tokens", "mint", "gone", "--url", url, "--ttl", "0.001")[1],
    ]
    ids = [out.strip().splitlines()[-1].split("_")[1] for out in minted]
    assert invoke("tokens", "revoke", ids[1], "--url", url)[0] == 0
    code, out, _ = invoke_split("tokens", "list", "--url", url, columns=80)
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 80
    heads = {line.split()[0]: line for line in out.splitlines() if not line.startswith(" ")}
    assert set(heads) == set(ids)  # every id whole, at the start of its line
    assert heads[ids[0]].endswith("expires in 30 d")
    assert re.search(r"revoked \d+ s ago, expires in (2 h|1\d\d min)$", heads[ids[1]])
    assert re.search(r"expired \d+ s ago$", heads[ids[2]])
    assert "".join(out.split()).count(agent) == 1  # folded across lines, all of it there
    assert "contract-42, contract-43" in out and "presence:write" in out


def test_spans_read_as_a_person_says_them() -> None:
    from agentrooms.cli_common import span

    assert [span(s) for s in (0, 42, 89, 90, 720, 5399, 5400, 3 * 3600, 2 * 86_400, -7200)] == [
        "0 s", "42 s", "89 s", "2 min", "12 min", "90 min", "2 h", "3 h", "2 d", "2 h",
    ]  # fmt: skip


def test_version_prints_the_distributions_version() -> None:
    from importlib.metadata import version

    import agentrooms

    code, out, _ = invoke_split("--version")
    assert code == 0 and out == f"agentrooms {agentrooms.__version__}\n"
    assert agentrooms.__version__ == version("agentrooms")  # one source: the built metadata
