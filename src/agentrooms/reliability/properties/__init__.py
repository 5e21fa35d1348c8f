"""Properties checked besides linearizability: fences, cursors, the outbox.

Each property has a recorder that runs concurrent workers doing one mechanism under
faults it owns, a journal of what they did, and a checker that returns the anomalies
it finds. One entry per property, with one signature, for the torture runner::

    await run_fences(url, room, workers=3, seed=1, workdir=tmp, faults=True)
    await run_cursors(url, room, workers=3, seed=1, workdir=tmp, faults=True)
    await run_outbox(url, room, workers=3, seed=1, workdir=tmp, faults=True)

Each returns a :class:`PropertyReport`. ``memory://`` runs the workers as tasks of
this process (a fault is then the cancellation of a task, not a signal); any other
URL runs them as processes the run starts, faults and restarts itself. Fences and
cursors also take ``servers=[...]`` and ``surface="http"|"mcp"`` to go through the
network surfaces; :mod:`~agentrooms.reliability.properties.runner` runs many of them
(``agentrooms torture --property``).
"""

from agentrooms.reliability.properties.common import PropertyReport
from agentrooms.reliability.properties.cursors import check_cursors, run_cursors
from agentrooms.reliability.properties.fences import check_fences, run_fences
from agentrooms.reliability.properties.outbox import check_outbox, run_outbox

__all__ = [
    "PropertyReport",
    "check_cursors",
    "check_fences",
    "check_outbox",
    "run_cursors",
    "run_fences",
    "run_outbox",
]
