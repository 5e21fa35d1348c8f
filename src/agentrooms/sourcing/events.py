"""Typed, versioned domain events and the upcasters that keep old ones readable.

An event type is a name and an integer version, written ``"TaskPriorityChanged/v2"``.
When an event's schema changes, its version goes up and an *upcaster*
registered for ``(name, old_version)`` turns the old data into the next version's.
Upcasters chain (v1 -> v2 -> v3), and run on read, so logs written by old code stay
readable by new code and nothing stored is ever rewritten.

Guarantees: ``EventType.parse`` accepts exactly what ``str(EventType)`` produces;
``Upcasters.upcast`` either returns the event at the wanted version or raises
``InvalidTransition`` naming the missing step (it never hands a fold an event of a
version the fold was not written for).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrooms.errors import BadRequest, InvalidTransition
from agentrooms.store.types import JSON

__all__ = [
    "DomainEvent",
    "EventType",
    "Recorded",
    "Upcaster",
    "Upcasters",
    "check_name",
]

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,127}")
_TYPE = re.compile(r"([A-Za-z][A-Za-z0-9_.:-]{0,127})/v([1-9][0-9]{0,8})")

Upcaster = Callable[[JSON], JSON]
"""Turns the data of version ``v`` of an event into the data of version ``v + 1``."""


def check_name(value: object, what: str) -> str:
    """Names of event types, aggregates and projections: 1-128 characters of
    ``A-Z a-z 0-9 . _ : -``, starting with a letter (no ``/``: they are key parts)."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise BadRequest(
            f"{what} must be 1-128 letters, digits, '.', '_', ':' or '-', starting with "
            f"a letter; got {value!r}"
        )
    return value


def check_version(value: object, what: str = "event version") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 10**9:
        raise BadRequest(f"{what} must be an integer from 1; got {value!r}")
    return value


@dataclass(frozen=True, slots=True, order=True)
class EventType:
    name: str
    version: int

    def __post_init__(self) -> None:
        check_name(self.name, "event name")
        check_version(self.version)

    def __str__(self) -> str:
        return f"{self.name}/v{self.version}"

    @classmethod
    def parse(cls, text: object) -> EventType:
        """``"Name/v2"`` -> ``EventType("Name", 2)``; ``BadRequest`` otherwise."""
        match = _TYPE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise BadRequest(f"an event type is 'Name/vN' (N >= 1); got {text!r}")
        return cls(match[1], int(match[2]))


@dataclass(frozen=True, slots=True)
class DomainEvent:
    """One event of an aggregate: its type name, schema version and JSON data."""

    name: str
    version: int
    data: JSON = None

    def __post_init__(self) -> None:
        check_name(self.name, "event name")
        check_version(self.version)

    @classmethod
    def of(cls, type: str, data: JSON = None) -> DomainEvent:
        """``DomainEvent.of("TaskPriorityChanged/v2", {...})``."""
        parsed = EventType.parse(type)
        return cls(parsed.name, parsed.version, data)

    @property
    def type(self) -> EventType:
        return EventType(self.name, self.version)


@dataclass(frozen=True, slots=True)
class Recorded:
    """A stored event with where it sits: its aggregate's stream position ``n`` (from 1)
    and, when read from the room log, the log's sequence number and time."""

    aggregate: str
    id: str
    n: int
    event: DomainEvent
    seq: int | None = None
    time: float | None = None


class Upcasters:
    """The upcasters of a set of event types, keyed by ``(name, from_version)``.

    Register with ``upcasters.add("Name", 1, fn)`` or as a decorator
    ``@upcasters.register("Name", 1)``. Shared by aggregates and projections that read
    the same events; registering twice for one ``(name, version)`` is refused.
    """

    def __init__(self, steps: Mapping[tuple[str, int], Upcaster] | None = None) -> None:
        self._steps: dict[tuple[str, int], Upcaster] = {}
        for (name, version), fn in (steps or {}).items():
            self.add(name, version, fn)

    def add(self, name: str, version: int, fn: Upcaster) -> None:
        key = (check_name(name, "event name"), check_version(version))
        if key in self._steps:
            raise BadRequest(f"an upcaster for {name}/v{version} is already registered")
        if not callable(fn):
            raise BadRequest("an upcaster must be callable")
        self._steps[key] = fn

    def register(self, name: str, version: int) -> Callable[[Upcaster], Upcaster]:
        def decorate(fn: Upcaster) -> Upcaster:
            self.add(name, version, fn)
            return fn

        return decorate

    def steps(self) -> list[tuple[str, int]]:
        return sorted(self._steps)

    def latest(self, name: str) -> int | None:
        """The version the chain for ``name`` ends at (None if it has no upcaster)."""
        versions = [v for n, v in self._steps if n == name]
        return max(versions) + 1 if versions else None

    def upcast(self, event: DomainEvent, target: int | None = None) -> DomainEvent:
        """``event`` upcast step by step to version ``target`` (default: as far as the
        chain goes). ``InvalidTransition`` if the event is newer than ``target`` or a
        step is missing."""
        version, data = event.version, event.data
        if target is not None and version > target:
            raise InvalidTransition(
                f"event {event.type} is newer than this code reads ({event.name}/v{target})"
            )
        while target is None or version < target:
            step = self._steps.get((event.name, version))
            if step is None:
                if target is None:
                    break
                raise InvalidTransition(
                    f"no upcaster from {event.name}/v{version} (needed to read it as v{target})"
                )
            data = step(_copy(data))
            version += 1
        return event if version == event.version else DomainEvent(event.name, version, data)


def _copy(data: Any) -> Any:
    """A deep copy of JSON data, so an upcaster that mutates cannot touch the original."""
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data
