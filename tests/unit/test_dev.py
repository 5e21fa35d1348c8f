"""``dev.py``, the project's one entry point: the command it starts is the process it
is, so that a signal sent to ``dev.py serve``'s process id (a service manager's, or a
test's that started it) stops the server rather than orphaning it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.name != "posix", reason="exec replaces the process on POSIX only")
def test_the_command_runs_as_dev_pys_own_process() -> None:
    probe = subprocess.Popen(
        [sys.executable, "dev.py", "run", "python", "-c", "import os; print(os.getpid())"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = probe.communicate(timeout=300)
    assert probe.returncode == 0
    assert int(out.strip().splitlines()[-1]) == probe.pid


def test_the_commands_exit_status_is_dev_pys() -> None:
    proc = subprocess.run(
        [sys.executable, "dev.py", "run", "python", "-c", "raise SystemExit(3)"],
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 3
