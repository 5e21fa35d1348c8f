"""The long tier: many short histories on one backend through one surface, under
faults, each checked as it ends.

A run (:func:`run_torture`) starts what it needs once (the store, the server processes
of the HTTP and MCP surfaces, the client processes) and records histories one after
another until a number of histories or minutes. History ``i`` has seed ``seed + i``: its
rooms are fresh, its clients draw their calls from that seed
(:class:`~agentrooms.reliability.recorder.Workload`), and so does its fault plan
(:func:`plan_faults`), so ``--seed S --histories 1`` replays the same workload and the
same faults. Each history is checked by
:func:`~agentrooms.reliability.recorder.verify` (linearizability, the log and the command
ids); one that is not linearizable, undecided, or with an anomaly is saved (JSON lines
of its operations, and a ``.meta.json`` with the seed, the settings, the faults and the
command that replays it).

Clients: on ``memory://`` they are asyncio tasks of this process (nothing else can share
the store); elsewhere each is a client process, forked from a fork server that imported
the library once and kept for the whole run, that streams every call and every outcome
to the runner as it happens (over a socket), so a client killed with ``kill -9`` leaves
its call in flight as an unknown outcome.

Faults, drawn per history from those the backend and surface allow (:func:`fault_kinds`):
``kill -9`` of a client process (a cancelled client task on ``memory://``); over HTTP
and MCP, ``kill -9`` of a server process (restarted on its port in the background) and
SIGSTOP/SIGCONT of one; and, when the run owns its store (no
``url``), the store faults of :func:`~agentrooms.reliability.faults.store_under_test`
(the TCP proxy's delay, drop, reset, blackhole and reset of a request in flight between
every client or server process and Redis or PostgreSQL, ``CLIENT PAUSE`` and a restart
of the run's own
``redis-server``, ``pg_terminate_backend`` of the run's database, ``kill -9`` of a
SQLite writer; none on memory), and over HTTP and MCP on Redis and PostgreSQL a
``kill -9`` of a server in flight: each server reaches the store through a port of the
proxy's own, and the proxy holds the reply to the next request a server sent while it
was armed, has that server killed (and restarted), and resets the connection. Each
fault is injected after a number of answers, so it lands mid-history however fast the
machine is; at most one server is down at a time and one store fault is active at a
time; every fault is healed after its time or once the history's clients are done,
before the history is checked.
"""

from agentrooms.reliability.torture.journal import (
    GRACE_NS,
    NO_FAULT,
    Journal,
    Journaled,
    Seen,
    Window,
    attribute,
    leaks,
    seen,
)
from agentrooms.reliability.torture.runner import RunStore, run_torture
from agentrooms.reliability.torture.settings import (
    BACKENDS,
    CLIENT_CANCEL,
    CLIENT_KILL,
    SERVER_KILL,
    SERVER_KILL_IN_FLIGHT,
    SERVER_STOP,
    SURFACES,
    PlannedFault,
    Settings,
    StoreFault,
    Unsupported,
    fault_kinds,
    plan_faults,
)
from agentrooms.reliability.torture.summary import HistoryResult, Summary

__all__ = [
    "BACKENDS",
    "CLIENT_CANCEL",
    "CLIENT_KILL",
    "GRACE_NS",
    "NO_FAULT",
    "SERVER_KILL",
    "SERVER_KILL_IN_FLIGHT",
    "SERVER_STOP",
    "SURFACES",
    "HistoryResult",
    "Journal",
    "Journaled",
    "PlannedFault",
    "RunStore",
    "Seen",
    "Settings",
    "StoreFault",
    "Summary",
    "Unsupported",
    "Window",
    "attribute",
    "fault_kinds",
    "leaks",
    "plan_faults",
    "run_torture",
    "seen",
]
