"""The library without its optional distributions: each missing one is a clear error.

Each test runs a fresh interpreter whose import system refuses the named top-level
packages (a meta-path finder that raises ``ModuleNotFoundError`` for them), as if they
were not installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
        return None
sys.meta_path.insert(0, Blocker())
"""


def without(blocked: set[str], script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter where ``blocked`` cannot be imported."""
    code = BLOCKER.format(blocked=sorted(blocked)) + textwrap.dedent(script)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_the_blocker_blocks() -> None:
    ran = without({"json"}, "import json")
    assert ran.returncode == 1 and "No module named 'json'" in ran.stderr


def test_bench_without_the_bench_distribution_names_it() -> None:
    ran = without(
        {"agentrooms_bench"},
        """
        import sys
        from agentrooms.cli import main
        sys.argv = ["agentrooms", "bench", "--quick"]
        main()
        """,
    )
    assert ran.returncode == 2, ran.stderr
    assert "agentrooms bench needs the agentrooms-bench distribution" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_bench_help_is_the_suites_own() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "agentrooms", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
    )
    assert ran.returncode == 0, ran.stderr
    assert "agentrooms bench" in ran.stdout and "--lock-agents" in ran.stdout
