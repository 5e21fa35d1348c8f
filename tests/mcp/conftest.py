"""Backends for the MCP tests: SQLite (a file in tmp_path) always; Redis and PostgreSQL
through the suite's fixtures (skipped locally when they do not answer, failing in CI).
The in-memory backend is left out: a stdio server runs in another process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Backend

SHARED = ("sqlite", "redis", "postgres")


@pytest.fixture(params=SHARED)
def shared_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A backend several processes (and store handles) share."""
    name: str = request.param
    if name == "sqlite":
        return Backend(name, f"sqlite:///{tmp_path / 'store.db'}", shared_across_processes=True)
    return Backend(name, request.getfixturevalue(f"{name}_url"), True)


@pytest.fixture
def sqlite_backend(tmp_path: Path) -> Backend:
    return Backend("sqlite", f"sqlite:///{tmp_path / 'store.db'}", shared_across_processes=True)
