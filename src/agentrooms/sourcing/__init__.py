"""Event sourcing on the store primitive: aggregates, snapshots, upcasters, projections.

* :class:`Aggregate` / :class:`Aggregates`: an aggregate's state is the pure fold of its
  own event stream; appends are conditional on the stream's version (concurrent appends
  conflict, never interleave), snapshots bound the replay, upcasters keep old events
  readable. Events also go to the room log, where agents' cursors see them.
* :class:`Projection` / :class:`Projector` / :class:`ReadModel`: read models folded from
  the room log by sequence number, each event exactly once, stored in records.
* :class:`ProjectionMigration` / :func:`migrate_projection`: expand / migrate / contract.

The record layout is in :mod:`agentrooms.sourcing.keys`. Nothing here talks to a backend
directly: it runs unchanged on every store.
"""

from agentrooms.sourcing.aggregates import MAX_APPEND, Aggregates, Appended, Loaded
from agentrooms.sourcing.events import DomainEvent, EventType, Recorded, Upcaster, Upcasters
from agentrooms.sourcing.fold import Aggregate
from agentrooms.sourcing.migration import (
    MigrationStatus,
    Phase,
    ProjectionMigration,
    Step,
    migrate_projection,
    resolve_projection,
)
from agentrooms.sourcing.projections import (
    Projection,
    ProjectionStatus,
    Projector,
    ReadModel,
    Rows,
    domain_event,
)

__all__ = [
    "MAX_APPEND",
    "Aggregate",
    "Aggregates",
    "Appended",
    "DomainEvent",
    "EventType",
    "Loaded",
    "MigrationStatus",
    "Phase",
    "Projection",
    "ProjectionMigration",
    "ProjectionStatus",
    "Projector",
    "ReadModel",
    "Recorded",
    "Rows",
    "Step",
    "Upcaster",
    "Upcasters",
    "domain_event",
    "migrate_projection",
    "resolve_projection",
]
