"""The optional parts of agentrooms and the error that names the one missing.

The library itself (rooms, the store, ``commit``, the CLI's store commands) needs none of
them; ``agentrooms[server]`` adds the HTTP API and the MCP server (FastAPI, uvicorn, the
MCP SDK); ``agentrooms[redis]`` and ``agentrooms[postgres]`` add the shared stores'
drivers; ``agentrooms[all]`` is all of these.
"""

from __future__ import annotations

import importlib

__all__ = ["EXTRAS", "MissingExtra", "require"]

EXTRAS: dict[str, tuple[str, ...]] = {"server": ("fastapi", "uvicorn", "mcp")}


class MissingExtra(ModuleNotFoundError):
    """A feature needs an extra that is not installed; the message names the extra and
    how to install it, ``name`` is the first module found missing."""


def require(extra: str, feature: str) -> None:
    """Import every module of ``extra`` (:data:`EXTRAS`); raise :class:`MissingExtra`
    naming ``feature`` and the extra if one of them is not installed."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] != module:
                raise  # the module is there and something it imports is not: a real bug
            raise MissingExtra(
                f"{feature} needs the {extra} extra ({module} is not installed): "
                f"pip install 'agentrooms[{extra}]'",
                name=module,
            ) from None
