"""The operator read model: rooms overview, one room's first screen, its plan, its
events, and what is stuck (docs/operations.md; design in docs/why-ops.md)."""

from agentrooms.ops.model import (
    EXPIRED,
    EXPIRED_LAST,
    URGENCY,
    RoomPage,
    RoomsPage,
    Thresholds,
    as_json,
)
from agentrooms.ops.read import Ops

__all__ = [
    "EXPIRED",
    "EXPIRED_LAST",
    "URGENCY",
    "Ops",
    "RoomPage",
    "RoomsPage",
    "Thresholds",
    "as_json",
]
