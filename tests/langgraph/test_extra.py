"""The integration is an extra: ``import agentrooms`` loads none of it, and without
LangGraph installed the integration names the extra to install."""

from __future__ import annotations

from tests.unit.test_lean import without

LANGGRAPH = {"langgraph", "langchain_core"}


def test_the_library_loads_no_langgraph() -> None:
    ran = without(
        set(),
        """
        import sys
        import agentrooms, agentrooms.sync, agentrooms.rooms, agentrooms.cli
        print(sorted({m.split(".")[0] for m in sys.modules} & {"langgraph", "langchain_core"}))
        """,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["[]"]


def test_the_integration_without_langgraph_names_the_extra() -> None:
    ran = without(
        LANGGRAPH,
        """
        from agentrooms.extras import MissingExtra
        try:
            import agentrooms.integrations.langgraph
        except MissingExtra as exc:
            print(exc.name, exc)
        """,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("langchain_core agentrooms.integrations.langgraph needs the")
    assert "pip install 'agentrooms[langgraph]'" in ran.stdout
