"""The designated writer: agents submit conditional intents to a room's queue;
one writer at a time applies them, in order, many in one conditional write.

Layout of queue ``<q>`` in the room (default ``main``)::

    event wq.submitted {queue, id, keys,  the queue's order: the room log's gapless seq,
      intent[, place][, digest]}          assigned by the store, so submitting is one
                                          append that never conflicts with another; it
                                          carries the intent, so the writer reads no
                                          record to apply it
    event wq.settled {queue, by, fence,   one per batch: its outcomes, each
      outcomes: [[id, status, seq,        [id, applied|rejected|dead|skipped, seq,
                  place, reason], ...]}   place, reason], the rejected first
    wq/<q>/i/<id>      the outcome once settled: applied | rejected (a predicate did not
                       hold) | dead (poison); for an id the submitter named, also the
                       intent as submitted (status queued) from the submission on
    wq/<q>/queue       marks the queue (written by an IntentQueue's first submission)
    wq/<q>/cursor      the writer's position: seq of the last submission consumed, and
                       its recent throughput (read by submitters told to back off)
    wq/<q>/dead/<id>   dead letters: the intent, why it failed, how often
    set wq:<q>:queued  ids submitted and not settled: the depth, O(1)
    lock writer.<q>    the writer's fenced lock (rooms.locks)

Rules:

* **In order, exactly once, in batches.** A batch is consecutive submissions of the
  log. Its intents (their writes, each one's outcome, their removal from the queued set)
  and the cursor's advance to its last seq commit in *one* transact, which also compares
  the cursor's version: an intent is applied exactly when the cursor passes it, whoever
  the writer is and however often it restarts. A batch is bounded (``Writer(batch=,
  batch_bytes=)``, the store's ``limits.max_ops``); a batch the store refuses is
  retried in halves.
* **The order within a batch: place, then seq.** A submission's *place* is its own seq;
  a retry (``submit(..., retry_of=outcome)``, ``outcome`` a settled outcome of an earlier
  intent) takes that outcome's place, so a retry keeps the place of the first submission
  of its chain. A batch applies its intents in order of (place, seq): the result is
  exactly that of applying them one by one in that order, and the oldest waiter is
  evaluated first on each fresh state (round robin among submitters who retry). If the
  batch in that order would not fit its bounds, or one of its intents cannot be applied,
  the batch is the longest prefix in log order that fits, applied in log order.
* **Fenced.** Every write of the writer carries ``lock.guard()``; a writer whose lock was
  taken over (``Locks.wait_acquire`` hands it to the standby once it expires) gets
  ``StaleFence`` and steps down.
* **Conditional intents.** Predicates (:class:`~agentrooms.commit.Where`) are evaluated
  on the snapshot the write is conditioned on, as left by the intents before it in the
  batch's order. A predicate that fails is an *outcome* (``rejected``, with the failed
  predicates), never a crash, and leaves the rest of the batch alone.
* **Increments.** :class:`Increment` (in a :class:`QueuedIntent`) adds to a counter on
  the running state: commutative, so it needs no predicate and is never rejected for
  contention.
* **Poison.** An intent whose application raises (it cannot be decoded, the store
  refuses its writes...) is retried; after ``max_failures`` it goes to the dead letters
  with its reason, and the queue moves on. A store outage is not counted against it.
* **Submitting.** Without an ``intent_id``, ``submit`` is one append and the queued
  set's add, guarded by the room's existence and archive state; its generated id reads
  as ``queued`` until settled. The unnamed submissions a process makes to one queue
  through one handle in one step of its event loop share one transact
  (:mod:`agentrooms.writer.groups`).
  With an ``intent_id``, the intent's record is written too (compared absent):
  idempotent by id.
* **Backpressure.** ``submit`` on a queue holding ``max_depth`` intents raises
  ``RateLimited`` with ``retry_after`` = the excess / the writer's recent throughput.
  The depth is read before the append, except while the process's last reading (shared
  by its ``IntentQueue`` objects of the queue) plus this object's submissions since is
  under half the limit and less than ``DEPTH_EVERY`` (0.1 s) old. So the limit can be
  overshot: by one submission per concurrent submitter, and by what each
  ``IntentQueue`` submits on a recent reading (less than half the limit).
* **Observable.** Every batch appends one ``wq.settled`` event, after the applied
  intents' own appends: its outcomes, each ``[id, status, seq, place, reason]`` (status
  ``applied``, ``rejected``, ``dead`` or ``skipped`` for a submission settled already),
  the rejections first (so the submitters who must retry hear first), and the writer and
  its fence. Waiters anywhere learn their outcome from it (the process's follower routes
  it to each by intent id). ``wq.failed`` counts each exception of a poison intent.
* **Retention.** Settled intents are kept ``retention`` seconds (a re-submitted id is
  recognised meanwhile). Never trim the room log past :meth:`IntentQueue.position`.
"""

from agentrooms.metrics import WriterMetrics
from agentrooms.writer.model import (
    DeadLetter,
    Increment,
    IntentOutcome,
    QueuedIntent,
    decode_intent,
    encode_intent,
)
from agentrooms.writer.queue import IntentQueue
from agentrooms.writer.worker import Writer

__all__ = [
    "DeadLetter",
    "Increment",
    "IntentOutcome",
    "IntentQueue",
    "QueuedIntent",
    "Writer",
    "WriterMetrics",
    "decode_intent",
    "encode_intent",
]
