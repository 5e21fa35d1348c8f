"""The outbox: external side effects requested with a state change, performed by workers
with the operation id as idempotency key, and settled by a reconciler.

Code that may be replayed (a transition in the commit loop) never calls anything
external. It records the *request* for the call in the same transact as the state
change (:func:`request_effects`); a :class:`Worker` performs it later, at least once,
always under the same operation id, and a :class:`Reconciler` settles whatever a worker
left unrecorded by asking the destination (``check``) instead of calling again blindly.

Layout in the room (written only through the store primitive, so every backend has it)::

    effect/<op_id>       the effect: kind, params, status, fence, lease, attempts,
                         result / error, links to a compensation
    set effects:pending  ids waiting for a worker       (claimed with set_pick, O(1))
    set effects:inflight ids claimed or unknown         (where the reconciler looks)
    set effects:dead     ids that failed for good       (counted with set_size)

Lifecycle (every arrow is one conditional write and an ``effect.<status>`` event)::

    requested ─> pending ──claim (fence+1, lease)──> claimed ──handler ok──> succeeded
                  ^   ^                               │  │ handler raised, attempts left
                  │   └───────────────────────────────┘  │ (retry after a backoff)
                  │                  handler raised: permanent, or no attempts left ─> failed
                  │     lease lapsed (worker died) or handler said OutcomeUnknown
                  │                                   v
                  └──── not applied ─── unknown ──(reconciler takes over: fence+1)
                                          │ applied ──> succeeded (with the found result)
                                          │ failed  ──> failed
                                          │ compensate ──> compensated + a new pending
                                          │                effect (linked both ways)
                                          └ undecided ──> unknown (asked again later)

Fencing rules:

* the record's ``fence`` grows with every claim and every take-over, never otherwise;
* a holder (worker or reconciler) records only with ``FenceAtMost(effect/<id>, fence)``
  and only while the record still carries its fence, so a worker whose lease was taken
  over gets ``StaleFence`` and its outcome is discarded;
* lease expiry is judged by the store's clock; the worker renews while its handler runs.

An effect is therefore performed *at least* once, and exactly once at a destination that
deduplicates by the ``Idempotency-Key`` it is given (the operation id). Where the
destination cannot deduplicate, the reconciler's ``check`` is the only protection.
"""

from agentrooms.effects.model import (
    CLAIMED,
    COMPENSATED,
    DEAD_SET,
    FAILED,
    INFLIGHT_SET,
    PENDING,
    PENDING_SET,
    SUCCEEDED,
    TERMINAL,
    UNKNOWN,
    Effect,
    EffectRequest,
    Outcome,
    OutcomeUnknown,
    PermanentFailure,
    compensation_id,
    effect_key,
    request_effects,
)
from agentrooms.effects.outbox import Outbox
from agentrooms.effects.reconciler import Check, Reconciler
from agentrooms.effects.worker import Handler, Worker

__all__ = [
    "CLAIMED",
    "COMPENSATED",
    "DEAD_SET",
    "FAILED",
    "INFLIGHT_SET",
    "PENDING",
    "PENDING_SET",
    "SUCCEEDED",
    "TERMINAL",
    "UNKNOWN",
    "Check",
    "Effect",
    "EffectRequest",
    "Handler",
    "Outbox",
    "Outcome",
    "OutcomeUnknown",
    "PermanentFailure",
    "Reconciler",
    "Worker",
    "compensation_id",
    "effect_key",
    "request_effects",
]
