"""``agentrooms paths`` against a real SQLite store, and its pre-commit hook in a
temporary git repository with the real ``git``: refused while another agent holds a
staged path, allowed after the release."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrooms.cli import EXIT_OK, EXIT_REFUSED, app
from agentrooms.rooms import Rooms
from agentrooms.store import open_store
from tests.conftest import unavailable

runner = CliRunner()


@pytest.fixture
def url(tmp_path: Path) -> str:
    store_url = f"sqlite:///{tmp_path / 'paths.db'}"

    async def create() -> None:
        store = await open_store(store_url)
        try:
            await Rooms(store).create("repo")
        finally:
            await store.close()

    asyncio.run(create())
    return store_url


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_reserve_check_list_release(url: str) -> None:
    who = ["--room", "repo", "--url", url]
    code, out, _ = invoke("paths", "reserve", "src/**", "--agent", "alice", *who, "--json")
    assert code == EXIT_OK
    held = json.loads(out)
    assert (held["owner"], held["patterns"]) == ("alice", ["src/**"])
    code, _, err = invoke("paths", "reserve", "src/a.py", "--agent", "bob", *who)
    assert code == EXIT_REFUSED and "paths_reserved" in err and "'alice'" in err
    code, _, err = invoke("paths", "check", "src/a.py", "docs/x.md", "--agent", "bob", *who)
    assert code == EXIT_REFUSED and "src/a.py: reserved exclusive by alice as src/**" in err
    code, _, _ = invoke("paths", "check", "docs/x.md", "--agent", "bob", *who)
    assert code == EXIT_OK
    code, out, _ = invoke("paths", "list", *who, "--json")
    assert [r["id"] for r in json.loads(out)["reservations"]] == [held["id"]]
    code, out, _ = invoke("paths", "release", held["id"], "--agent", "bob", *who)
    assert "not held" in out
    code, out, _ = invoke("paths", "release", held["id"], "--agent", "alice", *who)
    assert code == EXIT_OK and out.startswith("released")


def test_the_pre_commit_hook_refuses_then_allows(url: str, tmp_path: Path) -> None:
    if shutil.which("git") is None:
        unavailable("git")
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bob",
        "GIT_AUTHOR_EMAIL": "bob@example.org",
        "GIT_COMMITTER_NAME": "bob",
        "GIT_COMMITTER_EMAIL": "bob@example.org",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    for var in ("AGENTROOMS_ROOM", "AGENTROOMS_AGENT", "AGENTROOMS_URL"):
        env.pop(var, None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, check=False)

    assert run("git", "init", "-q").returncode == 0
    installed = run(
        sys.executable, "-m", "agentrooms", "paths", "hook", "--install",
        "--room", "repo", "--agent", "bob", "--url", url,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    hook = repo / ".git" / "hooks" / "pre-commit"
    assert os.access(hook, os.X_OK)
    code, out, _ = invoke(
        "paths", "reserve", "src/**", "--room", "repo", "--agent", "alice", "--url", url, "--json"
    )
    assert code == EXIT_OK
    reservation = json.loads(out)["id"]
    (repo / "src").mkdir()
    (repo / "src" / "a.py").write_text("x = 1\n")
    (repo / "README").write_text("hi\n")
    assert run("git", "add", "src/a.py", "README").returncode == 0

    refused = run("git", "commit", "-q", "-m", "touches src")
    assert refused.returncode != 0
    assert "src/a.py: reserved exclusive by alice as src/**" in refused.stderr
    assert run("git", "rev-parse", "--verify", "-q", "HEAD").returncode != 0  # no commit

    code, _, _ = invoke(
        "paths", "release", reservation, "--room", "repo", "--agent", "alice", "--url", url
    )
    assert code == EXIT_OK
    allowed = run("git", "commit", "-q", "-m", "touches src")
    assert allowed.returncode == 0, allowed.stderr
    assert run("git", "rev-parse", "--verify", "-q", "HEAD").returncode == 0
