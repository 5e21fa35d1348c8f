"""Where event sourcing keeps its records in a room (one place, so one grep finds it).

==================================  =====================================================
record                              holds
==================================  =====================================================
``agg/<type>/<id>``                 the aggregate's head ``{"version": n}`` (n = events in
                                    its stream; compared on every append)
``aggev/<type>/<id>/<n:012d>``      the stream's n-th event ``{"type": "Name/vK",
                                    "data": ...}``, written once, never changed
``aggsnap/<type>/<id>``             the latest snapshot ``{"n", "schema", "state"}``
``projpos/<name>/v<k>``             projection version k's log position and status
``projrow/<name>/v<k>/<row>``       one row of projection version k's read model
``projactive/<name>``               the projection version readers use ``{"version"}``
``projmig/<name>``                  the projection's expand/migrate/contract state
==================================  =====================================================

Every domain event is also appended to the room log as ``Event(type="Name/vK",
data={"aggregate", "id", "n", "data"})``: agents' cursors and projections see it there.
"""

from __future__ import annotations

STREAM_DIGITS = 12
MAX_STREAM = 10**STREAM_DIGITS - 1


def head(aggregate: str, id: str) -> str:
    return f"agg/{aggregate}/{id}"


def events_prefix(aggregate: str, id: str) -> str:
    return f"aggev/{aggregate}/{id}/"


def event(aggregate: str, id: str, n: int) -> str:
    return f"aggev/{aggregate}/{id}/{n:0{STREAM_DIGITS}d}"


def snapshot(aggregate: str, id: str) -> str:
    return f"aggsnap/{aggregate}/{id}"


def position(projection: str, version: int) -> str:
    return f"projpos/{projection}/v{version}"


def rows_prefix(projection: str, version: int) -> str:
    return f"projrow/{projection}/v{version}/"


def row(projection: str, version: int, row: str) -> str:
    return f"projrow/{projection}/v{version}/{row}"


def active(projection: str) -> str:
    return f"projactive/{projection}"


def migration(projection: str) -> str:
    return f"projmig/{projection}"
