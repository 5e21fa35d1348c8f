"""Coordination an agent team uses, written once on top of the store primitive."""

from agentrooms.rooms.documents import Document, Documents
from agentrooms.rooms.events import Events, InboxPage
from agentrooms.rooms.locks import Lock, LockInfo, Locks
from agentrooms.rooms.paths import PathConflict, Paths, Reservation
from agentrooms.rooms.plan import Lease, LeaseKeeper, Plan, Task, TaskSpec
from agentrooms.rooms.presence import Member, Presence
from agentrooms.rooms.room import Room, RoomInfo, RoomList, Rooms

__all__ = [
    "Document",
    "Documents",
    "Events",
    "InboxPage",
    "Lease",
    "LeaseKeeper",
    "Lock",
    "LockInfo",
    "Locks",
    "Member",
    "PathConflict",
    "Paths",
    "Plan",
    "Presence",
    "Reservation",
    "Room",
    "RoomInfo",
    "RoomList",
    "Rooms",
    "Task",
    "TaskSpec",
]
