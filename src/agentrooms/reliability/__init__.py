"""The reliability suite: recorded concurrent histories, checked mechanically.

* :mod:`.history`: operations as JSON lines;
* :mod:`.checker`: the linearizability checker, with :mod:`.models` (sequential
  specifications) and :mod:`.jepsen` (readers for Jepsen's history formats);
* :mod:`.recorder`: clients that record histories against a store through a pluggable
  surface, and the checks of a run;
* :mod:`.broken`: deliberately broken stores that the suite must flag.

See docs/reliability.md.
"""
