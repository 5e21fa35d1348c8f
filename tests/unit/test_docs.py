"""Code blocks in the docs run as tests, so the docs cannot drift from the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks() -> list[tuple[str, int, str]]:
    blocks = []
    for doc in DOCS:
        text = doc.read_text()
        for match in re.finditer(r"```python\n(.*?)```", text, re.DOTALL):
            line = text[: match.start()].count("\n") + 1
            blocks.append((doc.name, line, match.group(1)))
    return blocks


@pytest.mark.parametrize(("doc", "line", "code"), python_blocks(), ids=lambda v: str(v)[:20])
def test_python_block_runs(doc: str, line: int, code: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{doc}:{line} failed:\n{done.stderr}"
