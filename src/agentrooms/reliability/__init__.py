"""The reliability suite: recorded concurrent histories, checked mechanically.

* :mod:`.history`: operations as JSON lines;
* :mod:`.checker`: the linearizability checker, with :mod:`.models` (sequential
  specifications) and :mod:`.jepsen` (readers for Jepsen's history formats);
* :mod:`.recorder`: clients that record histories against a store through a pluggable
  surface, and the checks of a run;
* :mod:`.surfaces`: the HTTP and MCP surfaces, against several server processes;
* :mod:`.servers`: the server processes a run starts, and the faults it injects;
* :mod:`.broken`: deliberately broken stores that the suite must flag.

See docs/reliability.md.
"""
