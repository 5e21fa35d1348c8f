"""The built wheel, installed into a fresh virtual environment outside the repository.

First the lean core alone (no extras): the README's first example, ``--version``, the
``py.typed`` marker, and no web or MCP stack installed. Then the ``server`` extra on top:
``agentrooms serve --dev`` answers ``/healthz``. Nothing runs from the source tree: the
working directory is ``tmp_path`` and the environment carries no ``PYTHONPATH``. The
registry (or uv's cache) supplies the dependencies; the wheel is the local build.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import zipfile
from collections import defaultdict
from pathlib import Path

import dev
import httpx
import pytest

from agentrooms import __version__
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run(*args: str | Path, cwd: Path, timeout: float = 300) -> str:
    """Run a command outside the repository; its stdout, or the test fails with stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def readme_example() -> str:
    """The README's first Python block (the two agents committing one transition)."""
    found = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert found is not None
    return found.group(1)


def extras_of(metadata: str) -> dict[str, set[str]]:
    """Each extra of a wheel's METADATA and the distribution names it requires."""
    extras: dict[str, set[str]] = defaultdict(set)
    for name, extra in re.findall(
        r"^Requires-Dist: ([\w.-]+).*extra == '([\w-]+)'", metadata, re.M
    ):
        extras[extra].add(name)
    return extras


def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path: Path) -> None:
    uv = dev._uv()
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    run(uv, "build", "--wheel", "--package", "agentrooms", "--out-dir", dist, cwd=ROOT)
    (wheel,) = dist.glob("agentrooms-*.whl")
    with zipfile.ZipFile(wheel) as files:
        info = f"agentrooms-{__version__}.dist-info"
        assert f"{info}/licenses/LICENSE" in files.namelist()
        extras = extras_of(files.read(f"{info}/METADATA").decode())
    parts = ("server", "mcp", "redis", "postgres", "langgraph", "client")
    assert set().union(*(extras[part] for part in parts)) == extras["all"]
    assert extras["bench"] and not extras["bench"] & extras["all"]  # [all] pulls no peer
    run(uv, "venv", "--quiet", "--python", sys.executable, venv, cwd=work)
    python = venv / "bin" / "python"
    run(uv, "pip", "install", "--quiet", "--python", python, wheel, cwd=work)

    where = run(python, "-c", "import agentrooms; print(agentrooms.__file__)", cwd=work)
    assert Path(where.strip()).is_relative_to(venv)
    out = run(python, "-W", "error", "-c", readme_example(), cwd=work)
    assert sorted(re.findall(r"CommitResult\(result=(\d+)", out)) == ["1", "2"], out
    assert run(venv / "bin" / "agentrooms", "--version", cwd=work) == f"agentrooms {__version__}\n"
    probe = (
        "import importlib.resources, importlib.util;"
        "print(importlib.resources.files('agentrooms').joinpath('py.typed').is_file(),"
        " [m for m in ('fastapi', 'uvicorn', 'mcp') if importlib.util.find_spec(m)])"
    )
    assert run(python, "-c", probe, cwd=work) == "True []\n"  # typed, and lean

    run(uv, "pip", "install", "--quiet", "--python", python, f"{wheel}[server]", cwd=work)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen(
        [venv / "bin" / "agentrooms", "serve", "--dev", "--port", str(port),
         "--url", f"sqlite:///{work / 'served.db'}"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "no /healthz"
                time.sleep(0.2)
        assert health.status_code == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode is not None and f"http://127.0.0.1:{port}" in out
