"""docs/how-to-langgraph.md's two-agent graph runs and prints what the page says it prints.

(Every block of the page also runs in tests/unit/test_docs.py; this one checks the output.)
"""

from __future__ import annotations

from pathlib import Path

from tests.doc_example import run_example


def test_the_two_agent_graph_prints_what_the_page_says(tmp_path: Path) -> None:
    done, printed = run_example("how-to-langgraph.md", "Two agents, one thread", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed
    assert (tmp_path / "agents.db").exists()  # the agents shared one store
