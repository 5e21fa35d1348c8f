"""A linearizability checker: Wing & Gong's search with Lowe's memoization, as porcupine
does it.

A history is linearizable when every operation can be given one instant between its call
and its return such that applying the operations in the order of their instants, one at
a time, to the model's sequential specification gives every operation the output it had.

The search, per partition:

* The history is a doubly linked list of call and return entries in time order (a call
  before a return at equal times: intervals are closed).
* From the head, the first call whose operation the model accepts in the current state is
  *linearized*: its call and return entries are lifted out of the list and the search
  starts over from the head. Reaching a return entry means the operation it ends cannot
  be placed before it: the last linearized operation is undone (its entries put back)
  and the search goes on after its call.
* A cache of (linearized set, model state) pairs already explored cuts every path that
  reaches a configuration seen before (Lowe): a linearized set is an ``int`` bitset, a
  state any hashable value.
* Partitions are checked separately (P-compositionality): a history is linearizable iff
  each key's sub-history is, so the search only ever sees one key's operations. The
  partitions' searches take turns, a slice of steps each, and all stop as soon as one
  fails (porcupine runs them in parallel and kills the rest at the first failure): one
  key without a linearization decides the history, even when another key's search would
  take far longer to end.

* An *observer* (an operation the model says never changes the state: a read, a failed
  compare-and-set) that holds in every possible state of the current configuration is
  linearized at once, with no alternative tried there: moving an observer earlier, to a
  point where it holds and after everything that returned before its call, keeps any
  linearization valid. This cuts the orders of concurrent reads, which otherwise
  dominate the search on histories that are not linearizable.
* An unplaced observer must be placed before every operation called after its return,
  so only the calls before its return can come between now and it. When, for any
  unplaced observer, the model says no sequence of those calls can make it hold (a read
  of a value none of them writes, a get of a string that neither the current value nor
  any of those puts begins), the configuration fails without being explored.

An operation whose outcome is unknown (``Operation.ret is None``: a timeout, a killed
client, Jepsen's ``:info``) has an infinite return time: it may take effect at any instant
after its call, with any output, or never. "Never" is the same as "last": once every
operation with a known outcome is linearized, the remaining unknown ones are dropped and
the search has succeeded.

Models may be nondeterministic (an unknown outcome):
``step`` returns every state the operation may lead to, and the search runs over sets of
states (porcupine's power-set construction), so it needs no extra backtracking for them.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrooms.reliability.history import Operation

__all__ = ["CheckResult", "Model", "PartitionResult", "check"]


class Model(Protocol):
    """A sequential specification.

    ``prepare`` turns an operation into the compact form ``step`` reads (called once per
    operation; ``None`` leaves out an operation that carries no information, such as a
    read that failed; ``ValueError`` for an operation the model does not know).
    ``step(state, prepared, unknown)`` returns the states the operation may leave when it
    takes effect in ``state`` with its recorded output (with any output when ``unknown``);
    an empty result means the output is impossible in that state.
    ``observes(prepared)``: the operation never changes any state (a read).
    ``reaches(prepared)``: what the operation may contribute to the states a sequence of
    operations can reach (the values it may write; empty for nothing).
    ``unreachable(state, observer, reached)``: ``True`` only if no sequence of some
    operations (each at most once, in any order) whose ``reaches`` are ``reached``,
    applied to ``state``, can make ``observer`` hold (``False`` when unsure: it only
    prunes).
    """

    def partition(self, op: Operation) -> str: ...

    def init(self) -> Hashable: ...

    def prepare(self, op: Operation) -> Any: ...

    def step(self, state: Any, prepared: Any, unknown: bool) -> Iterable[Hashable]: ...

    def observes(self, prepared: Any) -> bool: ...

    def reaches(self, prepared: Any) -> tuple[Hashable, ...]: ...

    def unreachable(self, state: Any, observer: Any, reached: set[Any]) -> bool: ...


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """One key's verdict: ``linearizable`` is ``None`` when its search was stopped
    undecided because another key had already failed. ``steps``: configurations the
    search tried; ``longest``: the most operations it managed to linearize at once (all
    of them when linearizable)."""

    key: str
    linearizable: bool | None
    operations: int
    unknown: int
    steps: int
    longest: int


@dataclass(frozen=True, slots=True)
class CheckResult:
    """A history's verdict: linearizable iff every partition is (when one is not, the
    ones still undecided then are left undecided)."""

    linearizable: bool
    partitions: list[PartitionResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def operations(self) -> int:
        return sum(p.operations for p in self.partitions)

    @property
    def failed(self) -> list[str]:
        """The keys with no linearization (at least one when not linearizable)."""
        return [p.key for p in self.partitions if p.linearizable is False]


_SLICE = 1024  # search steps a partition takes in its turn


def check(
    model: Model, history: Iterable[Operation], *, budget: float | None = None
) -> CheckResult:
    """Whether ``history`` is linearizable with respect to ``model``.

    Raises ``ValueError`` for an operation the model does not know. Exact, no sampling;
    the cost is exponential only in the worst case, which the memoization keeps away
    from the histories recorded here. The partitions are searched in turns and the check
    ends at the first one that fails, leaving the unfinished ones undecided
    (``PartitionResult.linearizable is None``). ``budget``: seconds after which the
    searches still running stop undecided (the history is then not linearizable with no
    failed key: undecided); ``None``, no limit.
    """
    started = time.perf_counter()
    parts: dict[str, list[tuple[Operation, Any]]] = {}
    for op in history:
        prepared = model.prepare(op)
        if prepared is not None:
            parts.setdefault(model.partition(op), []).append((op, prepared))
    searches = {key: _search(model, key, ops) for key, ops in sorted(parts.items())}
    progress = {key: (0, 0) for key in searches}
    results: dict[str, PartitionResult] = {}
    failed = False
    deadline = None if budget is None else started + budget
    while searches and not failed:
        if deadline is not None and time.perf_counter() > deadline:
            break
        for key, search in list(searches.items()):
            try:
                progress[key] = next(search)
            except StopIteration as done:
                results[key] = done.value
                del searches[key]
                if not done.value.linearizable:
                    failed = True
                    break
    for key, search in searches.items():  # stopped undecided: another key failed, or time
        search.close()
        ops = parts[key]
        steps, longest = progress[key]
        unknown = sum(op.ret is None for op, _ in ops)
        results[key] = PartitionResult(key, None, len(ops), unknown, steps, longest)
    ordered = [results[key] for key in sorted(results)]
    linearizable = all(r.linearizable for r in ordered)
    return CheckResult(linearizable, ordered, time.perf_counter() - started)


def _search(  # noqa: PLR0915 (one search loop, kept in one frame for speed)
    model: Model, key: str, ops: Sequence[tuple[Operation, Any]]
) -> Generator[tuple[int, int], None, PartitionResult]:
    """One partition's search: yields ``(steps, longest)`` every ``_SLICE`` steps (its
    turn is over) and returns its verdict."""
    n = len(ops)
    infinity = max((op.call if op.ret is None else op.ret for op, _ in ops), default=0) + 1
    # entry numbering: 0 is the head; op i has call entry 2i+1 and return entry 2i+2
    events = []
    for i, (op, _) in enumerate(ops):
        events.append((op.call, 0, 2 * i + 1))
        events.append((infinity if op.ret is None else op.ret, 1, 2 * i + 2))
    events.sort()
    nxt = [-1] * (2 * n + 1)
    prv = [-1] * (2 * n + 1)
    last = 0
    for _, _, entry in events:
        nxt[last], prv[entry] = entry, last
        last = entry
    inputs = [prepared for _, prepared in ops]
    unknown = [op.ret is None for op, _ in ops]
    observer = [not u and model.observes(p) for u, p in zip(unknown, inputs, strict=True)]
    reaches = [model.reaches(p) for p in inputs]
    unreachable = model.unreachable
    step = model.step

    def successors(states: frozenset[Hashable], i: int) -> frozenset[Hashable]:
        if len(states) == 1:
            (only,) = states
            return frozenset(step(only, inputs[i], unknown[i]))
        out: set[Hashable] = set()
        for s in states:
            out.update(step(s, inputs[i], unknown[i]))
        return frozenset(out)

    # per entry: a call's contribution, or a return's observer (None: nothing to do)
    work: list[Any] = [None] * (2 * n + 1)
    for i in range(n):
        work[2 * i + 1] = reaches[i] or None
        work[2 * i + 2] = inputs[i] if observer[i] else None

    def dead() -> bool:
        """Some unplaced observer cannot hold whatever runs before its own return."""
        reached: set[Hashable] = set()  # what the calls seen so far may contribute
        e = nxt[0]
        if len(state) == 1:  # the common case, without a generator per observer
            (only,) = state
            while e != -1:
                w = work[e]
                if w is not None:
                    if e & 1:
                        reached.update(w)
                    elif unreachable(only, w, reached):
                        return True
                e = nxt[e]
            return False
        while e != -1:
            w = work[e]
            if w is not None:
                if e & 1:
                    reached.update(w)
                elif all(unreachable(s, w, reached) for s in state):
                    return True
            e = nxt[e]
        return False

    def lift(i: int) -> None:
        call, ret = 2 * i + 1, 2 * i + 2
        nxt[prv[call]], prv[nxt[call]] = nxt[call], prv[call]
        nxt[prv[ret]] = nxt[ret]
        if nxt[ret] != -1:
            prv[nxt[ret]] = prv[ret]

    def unlift(i: int) -> None:  # the reverse of lift, in the reverse order
        call, ret = 2 * i + 1, 2 * i + 2
        nxt[prv[ret]] = ret
        if nxt[ret] != -1:
            prv[nxt[ret]] = ret
        nxt[prv[call]] = call
        prv[nxt[call]] = call

    state: frozenset[Hashable] = frozenset([model.init()])
    linearized = 0
    stack: list[tuple[int, frozenset[Hashable], bool]] = []  # op, state before, forced
    cache: set[tuple[int, frozenset[Hashable]]] = set()
    steps = longest = 0
    fresh = True  # at a configuration not scanned yet
    entry = 0
    ok = True
    while nxt[0] != -1:
        steps += 1
        if not steps % _SLICE:
            yield steps, longest
        if fresh:
            fresh = False
            # An observer (it never changes the state) that holds in every possible
            # state now can be linearized here without loss: moving it earlier in any
            # linearization from here keeps the linearization valid. No alternative to
            # it is tried at this configuration.
            e = nxt[0]
            while e & 1:
                i = (e - 1) >> 1
                if observer[i] and successors(state, i) == state:
                    break
                e = nxt[e]
            if not e & 1:
                # an observer that cannot come to hold in time fails this configuration
                entry = -1 if dead() else nxt[0]
            else:
                bits = linearized | (1 << i)
                if (bits, state) not in cache:
                    cache.add((bits, state))
                    stack.append((i, state, True))
                    linearized = bits
                    longest = max(longest, len(stack))
                    lift(i)
                    fresh = True
                    continue
                entry = -1  # explored before, and it failed: so does this configuration
        if entry != -1 and entry & 1:  # a call: try to linearize its operation here
            i = (entry - 1) >> 1
            after = successors(state, i)
            if after:
                bits = linearized | (1 << i)
                if (bits, after) not in cache:
                    cache.add((bits, after))
                    stack.append((i, state, False))
                    state, linearized = after, bits
                    longest = max(longest, len(stack))
                    lift(i)
                    fresh = True
                    continue
            entry = nxt[entry]
            continue
        # a return (or a configuration known to fail): its operation cannot be placed
        if entry != -1 and unknown[(entry - 1) >> 1]:
            break  # only unknown outcomes are left: each may never have taken effect
        while True:  # undo the last choice that had alternatives
            if not stack:
                ok = False
                break
            i, state, forced = stack.pop()
            linearized &= ~(1 << i)
            unlift(i)
            if not forced:
                entry = nxt[2 * i + 1]
                break
        if not ok:
            break
    if ok:
        longest = n
    return PartitionResult(key, ok, n, sum(unknown), steps, longest)
