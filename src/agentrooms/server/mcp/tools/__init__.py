"""The tools an agent calls, each a thin translation to the rooms library.

Every tool names its ``room``; who calls is fixed by the transport (stdio: the agent the
server was started for; HTTP: the bearer token, with the HTTP surface's scope and room
rules, a room outside the token answering exactly as an absent one). Nothing is kept
between calls: leases travel as ``task_id`` + ``fence``, lock grants as their ``token``,
the event cursor lives in the store. State-changing tools take an optional
``request_id`` that becomes the library's command id, scoped to the agent, so repeating
a call whose answer was lost applies nothing twice.
"""

from __future__ import annotations

from agentrooms.server.mcp.tools.base import (
    CHANGES,
    DESTRUCTIVE,
    IDEMPOTENT,
    READ_ONLY,
    TaskIn,
    ToolsBase,
)
from agentrooms.server.mcp.tools.documents import DocumentTools
from agentrooms.server.mcp.tools.events import EventTools
from agentrooms.server.mcp.tools.locks import LockTools
from agentrooms.server.mcp.tools.plan import PlanTools
from agentrooms.server.mcp.tools.presence import PresenceTools

__all__ = ["CHANGES", "DESTRUCTIVE", "IDEMPOTENT", "READ_ONLY", "RoomTools", "TaskIn", "ToolsBase"]


class RoomTools(PresenceTools, PlanTools, EventTools, DocumentTools, LockTools):
    """The tool implementations over one store. ``principal`` fixes the caller (stdio);
    without it each call's caller comes from its HTTP request (``scope[PRINCIPAL]``)."""
