"""Who may do what, without the web framework: the room a principal may enter, the agent
it acts as, the command id of an idempotency key and an owner-checked lock grant. The
HTTP routes (:mod:`.deps`) and the MCP tools share these, so the MCP server over stdio
imports no HTTP stack."""

from __future__ import annotations

from agentrooms.errors import Forbidden
from agentrooms.rooms import Room, Rooms
from agentrooms.rooms import keys as room_keys
from agentrooms.server.auth import Principal
from agentrooms.store.types import Record

__all__ = ["PRINCIPAL", "act_as", "command_id", "enter", "held_grant"]

PRINCIPAL = "agentrooms.principal"
"""The ASGI scope key under which the gate leaves the admitted :class:`Principal`."""


def enter(principal: Principal, rooms: Rooms, name: str, scope: str) -> Room:
    """The room handle if ``principal`` may use ``scope`` in room ``name``."""
    room = rooms.room(name)
    if not principal.may_enter(room.name):
        raise room.scope.missing()  # the very answer an absent room gets
    if not principal.has(scope):
        raise Forbidden(f"this token lacks the {scope!r} scope")
    return room


def act_as(principal: Principal, agent: str | None) -> str:
    """The acting agent: always the token's; a body naming another is ``403``."""
    if agent is not None and agent != principal.agent:
        raise Forbidden(f"this token acts as {principal.agent!r}, not {agent!r}")
    return principal.agent


def command_id(principal: Principal, key: str | None) -> str | None:
    """An ``Idempotency-Key`` as the library's command id, scoped to the agent. The
    agent's name is length-prefixed, so no two (agent, key) pairs share an id even where
    names and keys contain the separator (``x`` with ``y:K`` and ``x:y`` with ``K``)."""
    return None if key is None else f"{len(principal.agent)}:{principal.agent}:{key}"


async def held_grant(room: Room, name: str, agent: str, token: str) -> Record | None:
    """The lock's holder record if it is the grant ``token`` names (else ``None``: it
    expired or changed hands); ``Forbidden`` if that grant is another agent's (its token
    was passed on)."""
    key = room_keys.lock(name)
    record = (await room.scope.read([key])).get(key)
    if record is None or record.value.get("token") != token:
        return None
    if record.value.get("owner") != agent:
        raise Forbidden(f"that grant of lock {name!r} belongs to another agent")
    return record
