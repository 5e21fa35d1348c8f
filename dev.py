#!/usr/bin/env python3
"""One entry point for people and CI, needing nothing but Python 3.11+.

    python3 dev.py serve --dev the HTTP API + MCP on the embedded SQLite store, no tokens
    python3 dev.py demo        two agents race one compare-and-set on the embedded store
    python3 dev.py cli ARGS    the agentrooms command line (rooms, plan show, tail, tokens...)
    python3 dev.py test [ARGS] the whole test suite in two worker processes (extra ARGS go
                               to pytest; naming a test file or folder runs it in one)
    python3 dev.py check       ruff and mypy --strict
    python3 dev.py bench NAME  benchmarks/bench_NAME.py (extra ARGS go to it)
    python3 dev.py run CMD...  any command inside the project environment

The first call creates ``.venv`` (with ``uv`` installed into it from PyPI when no ``uv``
is on PATH) and installs the locked dependencies with ``uv sync --frozen``, compiled to
bytecode; later calls only re-sync, which is a no-op when nothing changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
TOOLS = ROOT / ".tools"  # holds uv when it is not on PATH


def _uv() -> str:
    found = shutil.which("uv")
    if found:
        return found
    uv = TOOLS / ("Scripts" if os.name == "nt" else "bin") / "uv"
    if not uv.exists():
        print("dev.py: installing uv into .tools/ (one time)", file=sys.stderr)
        venv.EnvBuilder(with_pip=True, clear=True).create(TOOLS)
        pip = TOOLS / ("Scripts" if os.name == "nt" else "bin") / "pip"
        subprocess.run([str(pip), "install", "--quiet", "uv>=0.5"], check=True)
    return str(uv)


def sync() -> None:
    # --compile-bytecode: the dependencies' .pyc files are written once, here (a few
    # seconds, the first time only), so that every later process imports them instead of
    # compiling them, also where PYTHONDONTWRITEBYTECODE keeps Python from writing them
    # (about 0.8 s per process on the CI machine)
    env = dict(os.environ, UV_PROJECT_ENVIRONMENT=str(VENV))
    subprocess.run(
        [_uv(), "sync", "--frozen", "--all-extras", "--quiet", "--compile-bytecode"],
        cwd=ROOT,
        env=env,
        check=True,
    )


def _env() -> dict[str, str]:
    return dict(os.environ, VIRTUAL_ENV=str(VENV), PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")


def run(*cmd: str) -> int:
    return subprocess.run(list(cmd), cwd=ROOT, env=_env(), check=False).returncode


def become(*cmd: str) -> int:
    """Run ``cmd`` as this process (POSIX ``exec``), so that signals sent to this process
    id (a service manager's or a test's SIGTERM) reach it rather than orphan it."""
    if os.name == "posix":
        os.chdir(ROOT)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvpe(cmd[0], list(cmd), _env())  # does not return
    return run(*cmd)  # elsewhere exec starts a new process: wait for it instead


def _workers(args: list[str]) -> list[str]:
    """pytest-xdist's options for a run of the whole suite: two worker processes, each
    with its own stores (the suite isolates every process's databases and key prefixes),
    handed tests as they free up. None when ``args`` name tests or choose workers."""
    named = any(not a.startswith("-") and Path(a.split("::")[0]).exists() for a in args)
    chosen = any(a.startswith(("-n", "--numprocesses", "-p")) for a in args)
    return [] if named or chosen else ["-n", "2", "--dist", "worksteal"]


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 (dev.py may be run by an older python3)
        print("agentrooms needs Python 3.11 or newer", file=sys.stderr)
        return 2
    command, args = (argv[0], argv[1:]) if argv else ("help", [])
    if command in ("help", "-h", "--help"):
        print(__doc__)
        return 0
    sync()
    py = str(BIN / "python")
    if command in ("serve", "demo"):
        return become(py, "-m", "agentrooms", command, *args)
    if command == "cli":
        return become(py, "-m", "agentrooms", *args)
    if command == "test":
        return become(py, "-m", "pytest", *_workers(args), *args)
    if command == "check":
        return (
            run(py, "-m", "ruff", "check", ".")
            or run(py, "-m", "ruff", "format", "--check", ".")
            or run(py, "-m", "mypy")
        )
    if command == "bench":
        if not args:
            print("usage: python3 dev.py bench NAME [ARGS]", file=sys.stderr)
            return 2
        return become(py, f"benchmarks/bench_{args[0]}.py", *args[1:])
    if command == "run":
        return become(*args)
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
