"""Contention per key prefix, as one store handle saw it: a bounded in-memory table of
the version conflicts its ``transact`` raised, flushed in the background to one record
per (handle, room) in the room :data:`ROOM`, with a TTL, and summed by whoever reads it.

Counting costs no store operation on the path of a successful write, and none on the
failing one either: a conflict bumps a counter in memory and, at most once per
:data:`FLUSH_EVERY` seconds per room, a background task writes the room's counts. A
failed flush is retried on the next conflict (the counts stay in memory). Labels are
bounded (:func:`label`, :data:`MAX_LABELS` per room, :data:`MAX_ROOMS` per handle), so a
room with a million keys costs this table at most :data:`MAX_LABELS` counters.

What the counts mean, and their limits, are in docs/why-ops.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agentrooms.store.types import Put

if TYPE_CHECKING:
    from agentrooms.store.base import Store

__all__ = ["FLUSH_EVERY", "MAX_LABELS", "MAX_ROOMS", "ROOM", "TTL", "Contention", "label"]

ROOM = "_contention"
"""The room holding the flushed tables: ``<room>/<handle id>`` per handle and room."""
FLUSH_EVERY = 1.0  # seconds between two flushes of one room's counts, at least
TTL = 600.0  # seconds a flushed table outlives its handle's last flush
MAX_LABELS = 32  # labels per room per handle; the rest count under "<segment>/*" or "*"
MAX_ROOMS = 256  # rooms per handle; conflicts in further rooms are counted as dropped
CLOSE_WAIT = 2.0  # seconds a closing handle gives its last flush
IGNORED = frozenset({"_meta", "_archived"})  # a conflict there is a missing room, not contention

log = logging.getLogger(__name__)


def label(key: str) -> str:
    """The prefix a conflict on ``key`` counts under: the key up to its second ``/``
    (``task/t1``, ``lockq/build/``, ``doc/notes/``), so one hot record is named."""
    parts = key.split("/", 2)
    if len(parts) <= 2:
        return key
    return f"{parts[0]}/{parts[1]}/"


def _coarse(name: str) -> str:
    head, sep, _ = name.partition("/")
    return f"{head}/*" if sep else "*"


def table_key(room: str, handle: str) -> str:
    return f"{room}/{handle}"


class Contention:
    """The conflict counts of one store handle (shared by the wrappers around it)."""

    def __init__(self, store: Store) -> None:
        self.owner = store
        self.handle = uuid.uuid4().hex[:16]
        self.started = time.time()
        self.dropped = 0
        self._counts: dict[str, dict[str, int]] = {}
        self._last_flush: dict[str, float] = {}
        self._written: dict[str, dict[str, int]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def note(self, room: str, conflict_keys: Iterable[str]) -> None:
        """Count one failed transact in ``room`` under the label of each conflicting key,
        and schedule the room's flush. Never raises, never waits."""
        if room.startswith("_"):
            return
        counts = self._counts.get(room)
        if counts is None:
            if len(self._counts) >= MAX_ROOMS:
                self.dropped += 1
                return
            counts = self._counts[room] = {}
        for key in conflict_keys:
            if key in IGNORED:
                continue
            name = label(key)
            if name not in counts and len(counts) >= MAX_LABELS:
                name = _coarse(name)
                if name not in counts and len(counts) >= MAX_LABELS + 8:
                    name = "*"
            counts[name] = counts.get(name, 0) + 1
        self._schedule(room)

    def local(self, room: str) -> dict[str, int]:
        """This handle's counts for ``room``, flushed or not."""
        return dict(self._counts.get(room, {}))

    def _schedule(self, room: str) -> None:
        if room in self._tasks:
            return  # the running flush writes these counts too before it ends
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._tasks[room] = loop.create_task(self._flush(room))

    async def _flush(self, room: str) -> None:
        """Write the room's counts, at most every FLUSH_EVERY seconds, until what was
        written is what is counted; then leave (in the same step as the last check, so a
        conflict counted later schedules a new flush)."""
        try:
            while True:
                wait = self._last_flush.get(room, 0.0) + FLUSH_EVERY - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._last_flush[room] = time.monotonic()
                if not await self._write(room) or self._counts.get(room) == self._written[room]:
                    return
        finally:
            self._tasks.pop(room, None)

    async def _write(self, room: str) -> bool:
        counts = dict(self._counts.get(room, {}))
        value: dict[str, Any] = {
            "handle": self.handle,
            "room": room,
            "since": self.started,
            "conflicts": counts,
        }
        try:
            await self.owner.transact(ROOM, writes=[Put(table_key(room, self.handle), value, TTL)])
        except Exception as exc:  # the counts stay in memory; a later conflict retries
            log.warning("contention counts of %s not flushed: %s", room, exc)
            return False
        self._written[room] = counts
        return True

    async def close(self) -> None:
        """Cancel the pending flushes and write, once, the counts they had yet to write
        (before the handle closes; a failure is logged and those counts are lost)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            if task.get_loop() is asyncio.get_running_loop():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for room, counts in list(self._counts.items()):
            if counts != self._written.get(room):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._write(room), CLOSE_WAIT)
