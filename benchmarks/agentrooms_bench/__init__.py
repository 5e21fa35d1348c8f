"""``agentrooms bench``: write policies, raw clients and peer libraries, side by side.

* :mod:`.scenarios`: the policies (compare-and-swap with four backoffs, whole-document
  lock, per-task leases, designated writer, append-only log, CRDT counter, the raw
  client) as N agents updating one shared state, each with its loss check;
* :mod:`.runner`: one cell (warm-up, closed loop, open loop, loss check);
* :mod:`.peers`: python-redis-lock, pottery, eventsourcing, LangGraph's checkpointer;
* :mod:`.records`: the resumable output directory (JSON lines);
* :mod:`.report`, :mod:`.plots`: Markdown, CSV and PNG summaries;
* :mod:`.suite`: a whole run across backends.

Speed is measured here, never asserted in tests (DESIGN.md section 6): every figure sits
next to the raw client doing the same work in the same run.
"""

from agentrooms_bench.runner import Settings
from agentrooms_bench.scenarios import HIDDEN, POLICIES
from agentrooms_bench.suite import run_bench

__all__ = ["HIDDEN", "POLICIES", "Settings", "run_bench"]
