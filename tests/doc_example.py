"""Running a docs page's example as a reader would, to compare what it prints with what
the page says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def run_example(page: str, section: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the first Python block after the heading ``section`` of ``docs/page`` (in a
    fresh interpreter, warnings as errors, in ``cwd``); the finished process and the block
    the page shows after ``It prints:``."""
    text = (DOCS / page).read_text()
    code = re.search(rf"## {re.escape(section)}.*?```python\n(.*?)```", text, re.DOTALL)
    printed = re.search(r"It prints:\n\n```\n(.*?)```", text, re.DOTALL)
    assert code is not None and printed is not None
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code.group(1)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, printed.group(1)
