"""The calls of a history as they happen, what the callers saw when a call raised, and
the faults' windows those errors are attributed to, and their heals."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentrooms.reliability.history import Operation
from agentrooms.reliability.recorder import COMMITS, LOG, Surface, _output

__all__ = [
    "GRACE_NS",
    "NO_FAULT",
    "Journal",
    "Journaled",
    "Seen",
    "Window",
    "attribute",
    "heal_after",
    "healed",
    "leaks",
    "seen",
]

T = TypeVar("T")


class Journal:
    """The calls of a history's clients as they happen: a call opens an entry, its
    answer (or its unknown outcome) closes it; an entry still open at the end (a killed
    client's call in flight) is an unknown outcome. ``answered`` counts closed entries."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []
        self.open: dict[tuple[int, int], tuple[str, str, Any, int]] = {}
        self.answered = 0
        self.errors: list[Seen] = []
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []  # (answers, woken)

    def event(self, client: int, event: dict[str, Any]) -> None:
        """``{"c": [n, op, key, input, call]}``, ``{"r": [n, output, return]}`` or
        ``{"u": n, "e": [seen, typed], "t": time}`` (the call raised, as :func:`seen`
        names it) from ``client``; ``ValueError`` for anything else."""
        if "c" in event:
            n, op, key, inp, call = event["c"]
            self.open[(client, n)] = (op, key, inp, call)
            return
        if "r" in event:
            n, output, ret = event["r"]
        elif "u" in event:
            n, output, ret = event["u"], None, None
        else:
            raise ValueError(f"not a journal event: {event!r}")
        op, key, inp, call = self.open.pop((client, n))
        if "e" in event:
            what, typed = event["e"]
            self.errors.append(Seen(client, op, call, event["t"], what, typed))
        self.ops.append(Operation(client, key, op, inp, output, call, ret))
        self.answered += 1
        if self._waiting:
            due = [w for w in self._waiting if w[0] <= self.answered]
            self._waiting = [w for w in self._waiting if w[0] > self.answered]
            for _, woken in due:
                if not woken.done():
                    woken.set_result(None)

    async def reached(self, answers: int) -> None:
        """Return once ``answers`` calls have been answered: woken by the answer that
        makes it (not by polling, which clients faster than a poll would outrun)."""
        if self.answered >= answers:
            return
        woken = asyncio.get_running_loop().create_future()
        self._waiting.append((answers, woken))
        await woken

    def close(self) -> list[Operation]:
        """Every operation, the open ones as unknown outcomes, in call order."""
        for (client, _), (op, key, inp, call) in self.open.items():
            self.ops.append(Operation(client, key, op, inp, None, call, None))
        self.open.clear()
        return sorted(self.ops, key=lambda o: o.call)


@dataclass(frozen=True, slots=True)
class Seen:
    """A call of ``client`` that raised: its ``op``, call time, the time it raised
    (``monotonic_ns``), what the caller saw (:func:`seen`) and whether that is a typed
    error (``False``: a raw driver or OS exception reached the caller)."""

    client: int
    op: str
    call: int
    at: int
    what: str
    typed: bool


def seen(exc: BaseException) -> tuple[str, bool]:
    """How a caller saw ``exc``, and whether it is typed: an agentrooms error (by its
    class name), what an HTTP or MCP caller saw (``UnknownOutcome.seen``, the surface's
    report), ``cancelled`` (the caller's own deadline, or a cancelled client task);
    anything else by its module and class, untyped."""
    from agentrooms.errors import AgentroomsError

    if isinstance(exc, asyncio.CancelledError):
        return "cancelled (the caller's deadline)", True
    if isinstance(exc, AgentroomsError):
        return type(exc).__name__, True
    shown = getattr(exc, "seen", None)
    if isinstance(shown, str):
        return shown, True
    kind = type(exc)
    return f"raw {kind.__module__}.{kind.__qualname__}: {str(exc)[:120]}", False


class Journaled:
    """A :class:`~agentrooms.reliability.recorder.Surface` that reports each call to
    ``emit`` before it is made and its outcome after (``{"u": n, "e": seen(exc), "t":
    time}`` when it raised or was cancelled); the calls go to ``inner``."""

    def __init__(self, inner: Surface, emit: Callable[[dict[str, Any]], None]) -> None:
        self.inner, self.emit, self.n = inner, emit, 0

    async def _run(self, op: str, key: str, inp: Any, call: Awaitable[T]) -> T:
        n, self.n = self.n, self.n + 1
        self.emit({"c": [n, op, key, inp, time.monotonic_ns()]})
        try:
            result = await call
        except BaseException as exc:
            self.emit({"u": n, "e": list(seen(exc)), "t": time.monotonic_ns()})
            raise
        self.emit({"r": [n, _output(op, result), time.monotonic_ns()]})
        return result

    async def read(self, key: str) -> tuple[str | None, int | None]:
        return await self._run("read", key, None, self.inner.read(key))

    async def put(self, key: str, value: str) -> int:
        return await self._run("put", key, {"value": value}, self.inner.put(key, value))

    async def cas(self, key: str, version: int | None, value: str) -> tuple[bool, int | None]:
        inp = {"version": version, "value": value}
        return await self._run("cas", key, inp, self.inner.cas(key, version, value))

    async def delete(self, key: str) -> None:
        await self._run("delete", key, None, self.inner.delete(key))

    async def append(self, item: str) -> int:
        return await self._run("append", LOG, {"id": item}, self.inner.append(item))

    async def read_log(self) -> list[tuple[int, str]]:
        return await self._run("read_log", LOG, None, self.inner.read_log())

    async def commit(self, command_id: str) -> tuple[int, bool | None] | None:
        inp = {"id": command_id}
        return await self._run("commit", COMMITS, inp, self.inner.commit(command_id))

    async def read_commits(self) -> list[str]:
        return await self._run("read_commits", COMMITS, None, self.inner.read_commits())

    async def close(self) -> None:
        await self.inner.close()


NO_FAULT = "(no fault)"
GRACE_NS = 1_000_000_000
"""An error up to this long after a fault's window closed is still the fault's (a
pooled connection the fault broke fails on its next use)."""


@dataclass(slots=True)
class Window:
    """When a fault of ``kind`` was active: from its injection to its heal (``end``
    ``None`` while it lasts), ``monotonic_ns``."""

    kind: str
    start: int = field(default_factory=time.monotonic_ns)
    end: int | None = None

    def closed(self) -> Window:
        """End the window now (once: a later call keeps the first end)."""
        if self.end is None:
            self.end = time.monotonic_ns()
        return self

    def on_done(self, _: object) -> None:
        """:meth:`closed`, as a task's done callback."""
        self.closed()


def attribute(errors: Sequence[Seen], windows: Sequence[Window]) -> Counter[tuple[str, str]]:
    """``(fault, what the caller saw)`` for each error: a call that raised is the
    fault's when it was in flight while the fault was active (or up to
    :data:`GRACE_NS` after); of :data:`NO_FAULT` when no fault was."""
    found: Counter[tuple[str, str]] = Counter()
    for e in errors:
        kinds = {
            w.kind
            for w in windows
            if w.start <= e.at and (w.end is None or e.call <= w.end + GRACE_NS)
        }
        for kind in kinds or {NO_FAULT}:
            found[(kind, e.what)] += 1
    return found


def leaks(errors: Sequence[Seen]) -> list[str]:
    """An anomaly for each raw (untyped) exception that reached a caller."""
    return [
        f"client {e.client}'s {e.op} saw {e.what} (a raw exception reached the caller)"
        for e in errors
        if not e.typed
    ]


async def heal_after(
    seconds: float, heal: Awaitable[None], over: asyncio.Event, window: Window
) -> None:
    """Await ``heal`` after ``seconds``, or once ``over`` is set if sooner; then close
    ``window`` (also when the heal fails)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(over.wait(), seconds)
    try:
        await heal
    finally:
        window.closed()


async def healed(heals: Sequence[asyncio.Task[None]]) -> list[str]:
    """Await every heal; an anomaly for each that failed (a heal that found damage)."""
    return [
        f"a fault's heal failed: {type(failed).__name__}: {failed}"
        for failed in await asyncio.gather(*heals, return_exceptions=True)
        if isinstance(failed, BaseException)
    ]
