"""One clock for every process of a SQLite file: the clock of the file system holding it.

Each process reads its own clock to judge expiry (leases, locks, presence), so a process
whose clock is wrong judges wrongly: one ahead takes live leases and locks, one behind
writes leases already expired for everyone else. The processes sharing a file cannot
check each other through the file alone: what another process wrote only says that its
clock had reached some reading *before* now, so a newcomer an hour ahead would look fine
until after its first judgement. They can check themselves against one reference that
every one of them can read at any moment: the modification time the kernel stamps on a
file in the database's directory when it is written. That is the clock of the machine
holding the file, the same for every process of it, whatever a process's own clock says
(a time-faking tool in its environment, an injected clock).

:class:`ClockCheck` writes one byte to a temporary file there (unnamed where the file
system allows it, else removed at once), reads its own clock just before and just after,
and compares the middle of that interval with the stamp: the offset, in seconds, of the
process's clock from the file's. A process more than ``max_skew`` off is refused with
:class:`~agentrooms.errors.ClockSkew`, at open and on every call until it agrees. The
engine checks at open, then at most every :data:`CHECK_INTERVAL` seconds, and at once
when its clock steps against its monotonic clock (so a clock set wrong while running is
caught before its next call, not a second later).

What this cannot see: a tool that shifts the file times a process reads by the same
amount as its clock (libfaketime built with ``FAKE_STAT``; Debian's is not), and hosts
sharing the file over a network file system (SQLite's WAL mode does not support that:
its processes share memory, so they share a machine).

A file system that stamps no times (some FUSE or network file systems) would refuse
every process: ``?max_clock_skew=off`` turns the check off, and then each process judges
expiry by its own clock.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

from agentrooms.errors import ClockSkew

CHECK_INTERVAL = 1.0  # seconds (monotonic) between checks of a process that agreed


def file_clock_offset(directory: str, clock: Callable[[], float]) -> float:
    """Seconds ``clock`` is ahead of the clock that stamps files in ``directory``
    (negative: behind). The kernel stamps with a coarse clock, a tick (a few ms) late."""
    with tempfile.TemporaryFile(dir=directory, buffering=0) as probe:
        before = clock()
        os.write(probe.fileno(), b"t")
        after = clock()
        stamped = os.fstat(probe.fileno()).st_mtime_ns / 1e9
    return (before + after) / 2 - stamped


def describe(offset: float) -> str:
    """``offset`` in words: ``3600.000 s ahead of``."""
    return f"{abs(offset):.3f} s {'ahead of' if offset >= 0 else 'behind'}"


class ClockCheck:
    """Checks one process's clock against the file system holding ``path``; used by the
    engine's thread only."""

    def __init__(self, path: str, clock: Callable[[], float], max_skew: float) -> None:
        self.path = path
        self.max_skew = max_skew
        self.offset: float | None = None  # at the last check
        self._directory = os.path.dirname(os.path.abspath(path))
        self._clock = clock
        self._next = -float("inf")  # monotonic time of the next check
        self._base = 0.0  # clock() - monotonic() at the last check that agreed

    def check(self) -> None:
        """Raise ``ClockSkew`` if the clock is (still) off: measured when a check is due
        or the clock stepped since the last one, else at no cost but two clock reads."""
        mono = time.monotonic()
        stepped = abs(self._clock() - mono - self._base) > self.max_skew / 2
        if mono < self._next and not stepped:
            return
        self.measure()

    def measure(self) -> float:
        """Measure the offset now (the error of ``check``, or the offset)."""
        self.offset = offset = file_clock_offset(self._directory, self._clock)
        if abs(offset) > self.max_skew:
            self._next = -float("inf")  # check again on the next call
            raise ClockSkew(
                f"this process's clock is {describe(offset)} the clock of the file "
                f"system holding {self.path} (the URL's max_clock_skew allows "
                f"{self.max_skew:g} s): "
                "every process sharing the file judges leases, locks and presence by "
                "that clock, so this one is refused, having done nothing. Fix this "
                "process's clock: sync it (NTP), or remove what fakes it (faketime, "
                "LD_PRELOAD, a container's time settings), then retry",
                offset,
                self.max_skew,
            )
        mono = time.monotonic()
        self._base = self._clock() - mono
        self._next = mono + CHECK_INTERVAL
        return offset
