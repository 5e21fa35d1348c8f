"""What every part of a remote room shares: its room, client and transport, and the
conversions of response bodies into the library's dataclasses."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import quote

if TYPE_CHECKING:
    from agentrooms.client.rooms.room import Room

D = TypeVar("D")
Ack = Literal["auto", "explicit"]


def parse(kind: type[D], data: Mapping[str, Any], **extra: Any) -> D:
    """The dataclass ``kind`` from a response body's fields (others are ignored)."""
    names = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    return kind(**{k: v for k, v in {**data, **extra}.items() if k in names})


def seg(value: str) -> str:
    return quote(value, safe="")


class Part:
    def __init__(self, room: Room) -> None:
        self._room = room
        self._client = room.client
        self._http = room.client.http

    @property
    def room(self) -> str:
        return self._room.name

    def _key(self, command_id: str | None) -> dict[str, str]:
        return {} if command_id is None else {"Idempotency-Key": command_id}

    async def _keyed(
        self, path: str, body: Any, command_id: str | None, *, wait: float = 0.0
    ) -> Any:
        """POST ``body`` to ``path`` as a keyed command (``command_id``, else one made);
        a call that may wait ``wait`` seconds on the server reads that much longer."""
        return await self._http.json(
            "POST",
            path,
            safety="keyed",
            body=body,
            headers=self._key(command_id),
            read_timeout=self._waiting(wait),
        )

    def _waiting(self, wait: float) -> float | None:
        """The read timeout of a call the server may hold ``wait`` seconds (``None``:
        the client's own)."""
        return self._http.timeout + wait if wait > 0 else None
