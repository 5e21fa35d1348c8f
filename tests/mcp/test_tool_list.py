"""The tool list is read into every model's context: its size, as tokens counted as
characters / 4 of the ``tools/list`` result's JSON, stays within a budget."""

from __future__ import annotations

import json

from mcp import Client

from agentrooms.server.mcp import build_mcp
from agentrooms.store import Store

# #26 item 6 aims at 4,000 with scope filtering and profiles; this is the ceiling until then
# (4,500 before the three path tools of item 5, which list in about 460)
TOKEN_BUDGET = 4_950


async def test_the_tool_list_fits_its_token_budget(store: Store) -> None:
    async with Client(build_mcp(store, agent="a")) as client:
        tools = (await client.list_tools()).tools
    listed = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    text = json.dumps(listed, separators=(",", ":"))
    assert len(text) // 4 <= TOKEN_BUDGET, len(text) // 4
    for tool in listed:  # nothing a model need not read: no titles, no docstring indents
        assert "title" not in tool["inputSchema"] and "  " not in tool["description"]
        assert "title" not in tool["inputSchema"]["properties"].get("room", {}), tool["name"]
