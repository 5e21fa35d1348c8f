"""The pure side of an aggregate: its definition, how stored events are read, the fold.

No IO here. :class:`Aggregate` guarantees that a fold only ever sees events of the
types and versions it declared: stored events are upcast first, and an event it cannot
read raises ``InvalidTransition`` (never folded wrongly, never skipped); a new event of
an old version, of an unknown type or not a ``DomainEvent`` is a ``BadRequest``.
``replay`` is the fold over a sequence, so "snapshot + tail == full replay" is a
property of ``fold`` alone (tested with Hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from agentrooms.errors import BadRequest, InvalidTransition
from agentrooms.sourcing.events import DomainEvent, Upcasters, check_name, check_version
from agentrooms.store.types import JSON

__all__ = ["Aggregate"]

S = TypeVar("S")


def _identity(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Aggregate(Generic[S]):
    """An aggregate type: ``events`` maps each event name it accepts to the version its
    fold reads; ``fold`` must be pure (no IO, no mutation of the state it is given).

    ``initial()`` makes the state of an empty stream. ``schema`` is the version of the
    fold and state layout: bump it whenever the state a stream folds to would change,
    and older snapshots are ignored. ``encode``/``decode`` turn the state into JSON for
    snapshots (identity by default). ``snapshot_every=0`` disables snapshots.
    """

    name: str
    initial: Callable[[], S]
    fold: Callable[[S, DomainEvent], S]
    events: Mapping[str, int]
    upcasters: Upcasters = field(default_factory=Upcasters)
    snapshot_every: int = 100
    schema: int = 1
    encode: Callable[[S], JSON] = _identity
    decode: Callable[[JSON], S] = _identity

    def __post_init__(self) -> None:
        check_name(self.name, "aggregate name")
        if not isinstance(self.events, Mapping) or not self.events:
            raise BadRequest("an aggregate accepts at least one event type")
        for name, version in self.events.items():
            check_name(name, "event name")
            check_version(version)
        for name, version in self.upcasters.steps():
            current = self.events.get(name)
            if current is not None and version >= current:
                raise BadRequest(
                    f"upcaster from {name}/v{version} goes past the version the fold reads "
                    f"({name}/v{current})"
                )
        if isinstance(self.snapshot_every, bool) or not isinstance(self.snapshot_every, int):
            raise BadRequest("snapshot_every must be an integer (0: never)")
        if self.snapshot_every < 0:
            raise BadRequest("snapshot_every must be 0 (never) or more")
        check_version(self.schema, "schema")

    def read(self, stored: JSON) -> DomainEvent:
        """A stored event (``{"type": "Name/vK", "data": ...}``) as the fold reads it."""
        if not isinstance(stored, dict) or set(stored) != {"type", "data"}:
            raise InvalidTransition(f"not a stored event of {self.name}: {stored!r}")
        event = DomainEvent.of(stored["type"], stored["data"])
        current = self.events.get(event.name)
        if current is None:
            raise InvalidTransition(f"aggregate {self.name} has no event type {event.name}")
        return self.upcasters.upcast(event, current)

    def check_new(self, event: object) -> DomainEvent:
        """A new event must be a ``DomainEvent`` of a type and version the fold reads."""
        if not isinstance(event, DomainEvent):
            raise BadRequest(f"events are DomainEvent values, not {type(event).__name__}")
        current = self.events.get(event.name)
        if current is None:
            raise BadRequest(f"aggregate {self.name} has no event type {event.name}")
        if event.version != current:
            raise BadRequest(f"new events are written at {event.name}/v{current}, not {event.type}")
        return event

    def replay(self, events: Sequence[DomainEvent], state: S | None = None) -> S:
        """Fold ``events`` (already upcast) onto ``state`` (default: ``initial()``)."""
        current = self.initial() if state is None else state
        for event in events:
            current = self.fold(current, event)
        return current
