"""The event loop the benchmarks run on: asyncio's, with timer waits to the microsecond.

asyncio's default selector on Linux waits in ``epoll_wait``, whose timeout is in whole
milliseconds, rounded up. A 1 ms sleep whose loop is woken part-way (by any reply)
therefore waits the rest rounded up to a whole millisecond: 1.17-1.19 ms holds of a lock
where a thread's ``time.sleep`` holds 1.09-1.10 ms (BENCHMARKS.md section 4). The
benchmarks' sleeps stand for work (an agent holding a lock, thinking between a read and
its write), and that work should take as long on our side as on a thread-based peer's.
So the loop waits for its epoll descriptor with ``select(2)`` (microsecond timeouts;
one descriptor, so ``select``'s limit on descriptor numbers does not arise) and then
collects the ready events with a zero-timeout ``epoll_wait``. Elsewhere (kqueue,
nanosecond timeouts) the default selector is kept.
"""

from __future__ import annotations

import asyncio
import select
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


if hasattr(selectors, "EpollSelector"):

    class PreciseEpollSelector(selectors.EpollSelector):
        """epoll, waited for through ``select(2)``: timeouts in microseconds."""

        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is not None and timeout > 0:
                select.select([self.fileno()], [], [], timeout)
                timeout = 0
            return super().select(timeout)

    def new_loop() -> asyncio.AbstractEventLoop:
        return asyncio.SelectorEventLoop(PreciseEpollSelector())

else:  # pragma: no cover - not Linux

    def new_loop() -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on :func:`new_loop`."""
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main)
