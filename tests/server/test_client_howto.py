"""docs/client.md's remote agent runs against a real server and prints what the page says
it prints. (Every block of the page also runs in tests/unit/test_docs.py; this one
checks the output.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "client.md"


def test_the_remote_agent_prints_what_the_page_says(tmp_path: Path) -> None:
    text = PAGE.read_text()
    code = re.search(r"## An agent, remote.*?```python\n(.*?)```", text, re.DOTALL)
    printed = re.search(r"It prints:\n\n```\n(.*?)```", text, re.DOTALL)
    assert code is not None and printed is not None
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code.group(1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed.group(1)
    assert (tmp_path / "client-demo.db").exists()  # the server's store
