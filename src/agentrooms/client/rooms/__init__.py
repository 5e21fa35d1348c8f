"""The library's room objects over the HTTP API: :class:`Client`, its :class:`Rooms`, and
one :class:`Room`'s plan, documents, events, presence and locks.

Each method has the name, arguments and result types of the library method it mirrors
(:mod:`agentrooms.rooms`), and raises the same :mod:`agentrooms.errors` classes. What
HTTP changes:

* The acting agent is always the token's. Methods that name an agent (``claim``,
  ``read_new``, ``heartbeat``...) take it as the library does, but it may be left out;
  naming another agent is ``Forbidden`` (the server's ``403``).
* Every state-changing command the server keys (add, claim, claim_next, renew, complete,
  fail, cancel, post, document put, lock acquire) sends an ``Idempotency-Key``: pass
  ``command_id=`` to choose it (a retry from another process then finds the first
  outcome), else one is made per call; a retry of an unknown outcome reuses it
  (:mod:`.http`).
* A document write needs a condition (``if_match``, ``create_only`` or
  ``must_exist``): an unconditional one is the server's ``428 precondition_required``.
* ``claim_next`` has no ``accept`` filter, ``try_acquire`` no ``read=``.
"""

from agentrooms.client.rooms.documents import Documents
from agentrooms.client.rooms.events import Events
from agentrooms.client.rooms.locks import Locks
from agentrooms.client.rooms.plan import Plan
from agentrooms.client.rooms.presence import Presence
from agentrooms.client.rooms.room import Client, Room, Rooms

__all__ = ["Client", "Documents", "Events", "Locks", "Plan", "Presence", "Room", "Rooms"]
