"""The front of a lock's line: whom a release hands the lock to.

A waiter's entry ``lockq/<name>/<waiter>`` carries its ticket (the version the entry got
when it joined); the head of the line is the live entry with the lowest ticket. A handoff
event names up to :data:`LINE` waiters behind the new holder, in order, so that the next
release finds the head by reading the first of them still there instead of scanning the
line; anyone who joined since has a later ticket. Reads only; nothing here writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from agentrooms.rooms import keys
from agentrooms.rooms.locks.knowledge import Knowledge
from agentrooms.rooms.scope import Scope
from agentrooms.store.types import Record

LINE = 16  # waiters behind the new holder that a handoff event names, in order
NAMED_READ = 2  # named waiters read at once while looking for the first still in line


@dataclass(frozen=True, slots=True)
class Line:
    """The entry of the longest waiting live agent (``None``: nobody waits), and the
    public ids of the waiters behind it, in order (a prefix of the line; they may have
    left since)."""

    head: Record | None
    behind: tuple[str, ...] = ()


async def scan(scope: Scope, name: str) -> Line:
    """The whole line, read. Only the head is compared by the release that uses it, so
    waiters refreshing or joining meanwhile do not make that release conflict."""
    queue = keys.lock_queue(name)
    page = await scope.store.scan(scope.room, queue, None, 1000)
    if not page.records:
        return Line(None)
    ordered = sorted(page.records, key=lambda r: (r.value.get("ticket", r.version), r.key))
    return Line(ordered[0], tuple(r.key[len(queue) :] for r in ordered[1 : LINE + 1]))


async def next_of(scope: Scope, known: Knowledge, name: str, named: tuple[str, ...]) -> Line:
    """The front of the line given ``named``, waiters known to be its front, in order: the
    first of them still in line is the head (a waiter of this process by what ``known``
    holds, without a read); when none is, a scan."""
    while named:
        local = known.entry_of(scope.room, name, named[0]) or {}
        if "ticket" in local:
            key = keys.lock_waiter(name, named[0])
            return Line(Record(key, dict(local), local["ticket"]), named[1:])
        batch, named = named[:NAMED_READ], named[NAMED_READ:]
        entries = [keys.lock_waiter(name, waiter) for waiter in batch]
        snap = await scope.read(entries)
        for i, key in enumerate(entries):
            record = snap.get(key)
            if record is not None:
                return Line(record, (*batch[i + 1 :], *named))
    return await scan(scope, name)


async def front(scope: Scope, name: str, ahead: asyncio.Task[Line] | None) -> Line:
    """The front of the line: ``ahead`` (a lookup started while the lock was held) if it
    found a head, else a scan."""
    if ahead is not None and ahead.get_loop() is asyncio.get_running_loop():
        with contextlib.suppress(Exception):
            found = await ahead
            if found.head is not None:
                return found
    return await scan(scope, name)


def named(line: object) -> tuple[str, ...]:
    """The waiter ids a handoff event's ``line`` names (nothing, if it names none)."""
    if not isinstance(line, list):
        return ()
    return tuple(waiter for waiter in line if isinstance(waiter, str))
