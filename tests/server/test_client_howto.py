"""docs/client.md's remote agent runs against a real server and prints what the page says
it prints. (Every block of the page also runs in tests/unit/test_docs.py; this one
checks the output.)"""

from __future__ import annotations

from pathlib import Path

from tests.doc_example import run_example


def test_the_remote_agent_prints_what_the_page_says(tmp_path: Path) -> None:
    done, printed = run_example("client.md", "An agent, remote", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed
    assert (tmp_path / "client-demo.db").exists()  # the server's store
