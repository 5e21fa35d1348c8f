"""LangGraph on agentrooms: a checkpointer whose threads have one owner at a time.

Needs the extra: ``pip install 'agentrooms[langgraph]'``. How-to: docs/how-to-langgraph.md.

    async with await open_store("sqlite:///agents.db") as store:
        saver = AgentroomsSaver(store, owner="agent-a")
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke(inputs, {"configurable": {"thread_id": "t-1"}})
"""

from agentrooms.extras import require

require("langgraph", "agentrooms.integrations.langgraph")

from agentrooms.integrations.langgraph.saver import (  # noqa: E402
    DEFAULT_ROOM,
    AgentroomsSaver,
    ThreadHeld,
    ThreadOwnershipLost,
)

__all__ = ["DEFAULT_ROOM", "AgentroomsSaver", "ThreadHeld", "ThreadOwnershipLost"]
