"""How a room lays out its records, sets and events (one place, so a reviewer greps one file).

=====================  ===============================================================
record / set           holds
=====================  ===============================================================
``_meta``              the room's description; absent = the room does not exist
``_archived``          present = the room is archived (read-only)
``task/<id>``          one task of the plan (its own concurrency unit)
set ``ready``          ids of tasks whose dependencies are all done and nobody holds
set ``leased``         ids of claimed tasks, scanned for expired leases
``lock/<name>``        the current holder of a named lock (expires with its TTL)
``lockfence/<name>``   the lock's fencing counter: never expires, never decreases
``lockq/<name>/<id>``  an agent queued for the lock (expires unless refreshed)
``lockline/<name>``    rewritten by every grant of a free lock and every join of its line:
                       a release that finds it unchanged since its grant knows that
                       nobody joined, and skips reading the line
``cursor/<agent>``     the agent's position in the room's event log
``presence/<agent>``   the agent's last heartbeat (expires with its TTL)
``doc/<name>``         a versioned document
``docby/<name>``       ``{"writer": agent}``: who wrote the document's current version,
                       written (and deleted) in the same transact as ``doc/<name>``
``paths/<id>``         a path reservation (patterns, mode, owner, fence, lapse time)
``pathx/<dir>*<id>``   one pattern of a reservation, indexed by its literal directory
                       prefix (``<dir>`` ends in ``/``; ``*`` never occurs in it)
``pathfence``          the room's reservation fencing counter: every grant rewrites it
=====================  ===============================================================

The registry of rooms lives in the store rooms ``REGISTRY.<h>``
(:mod:`agentrooms.rooms.registry`): one ``room/<name>`` record per room, so rooms can be
listed.
"""

from __future__ import annotations

import re

from agentrooms.errors import BadRequest

META = "_meta"
ARCHIVED = "_archived"
READY = "ready"
LEASED = "leased"
REGISTRY = "_registry"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def check_name(value: object, what: str) -> str:
    """Names of rooms, tasks, agents, locks and documents: 1-128 characters of
    ``A-Z a-z 0-9 . _ : -``, starting with a letter or digit (safe in URLs and keys)."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise BadRequest(
            f"{what} must be 1-128 characters of letters, digits, '.', '_', ':' or '-', "
            f"starting with a letter or digit; got {value!r}"
        )
    return value


def task(task_id: str) -> str:
    return f"task/{task_id}"


def lock(name: str) -> str:
    return f"lock/{name}"


def lock_fence(name: str) -> str:
    return f"lockfence/{name}"


def lock_grant(name: str, token: str) -> str:
    """The grant's own record, named by its secret token: present exactly while that grant
    holds the lock, so a release or extend that compares it is checked by the token."""
    return f"lockgrant/{name}/{token}"


def lock_line(name: str) -> str:
    return f"lockline/{name}"


def lock_queue(name: str) -> str:
    return f"lockq/{name}/"


def lock_waiter(name: str, waiter: str) -> str:
    """A queue entry, named by the waiter's public id (its secret token is in the value)."""
    return f"lockq/{name}/{waiter}"


def cursor(agent: str) -> str:
    return f"cursor/{agent}"


def presence(agent: str) -> str:
    return f"presence/{agent}"


def doc(name: str) -> str:
    return f"doc/{name}"


def doc_writer(name: str) -> str:
    return f"docby/{name}"


PATH_FENCE = "pathfence"


def path_reservation(reservation: str) -> str:
    return f"paths/{reservation}"


def path_node(prefix: tuple[str, ...]) -> str:
    """The index directory of a literal prefix: a scan of it finds the patterns indexed
    at that prefix and below it."""
    return "pathx/" + "".join(segment + "/" for segment in prefix)


def path_index(prefix: tuple[str, ...], reservation: str, number: int) -> str:
    return f"{path_node(prefix)}*{reservation}.{number}"


def registry_entry(room: str) -> str:
    return f"room/{room}"
