"""The run's server processes (HTTP and MCP surfaces): which are up, faults on one,
restarts in the background."""

from __future__ import annotations

import asyncio

from agentrooms.reliability.servers import ServerProcess
from agentrooms.reliability.torture.settings import RESTARTS

__all__ = ["Cluster"]


class Cluster:
    """The run's server processes: which are up, faults on one, restarts in the
    background."""

    def __init__(self, procs: list[ServerProcess]) -> None:
        self.procs = procs
        self.up = [False] * len(procs)
        self.restarts: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Start every server at once (the store is prepared already)."""
        await asyncio.gather(*(p.start() for p in self.procs))
        self.up = [True] * len(self.procs)

    def bases(self) -> list[str]:
        self.check()
        return [p.base for p, up in zip(self.procs, self.up, strict=True) if up]

    async def settled(self) -> None:
        """Wait for the restarts in progress (their errors are raised by :meth:`check`)."""
        if self.restarts:
            await asyncio.wait(set(self.restarts))

    def check(self) -> None:
        """Raise the error of a restart that failed."""
        for task in [t for t in self.restarts if t.done()]:
            self.restarts.discard(task)
            task.result()

    def candidate(self, target: int) -> int | None:
        """The server a fault aimed at ``target`` hits, if two or more are up."""
        up = [i for i, ok in enumerate(self.up) if ok]
        return up[target % len(up)] if len(up) >= 2 else None

    def kill(self, i: int) -> asyncio.Task[None]:
        """``kill -9`` of server ``i``; the task that restarts it."""
        self.procs[i].kill()
        self.up[i] = False
        task = asyncio.create_task(self._restart(i))
        self.restarts.add(task)
        return task

    async def _restart(self, i: int) -> None:
        """Start server ``i`` again; a start that fails (the store unavailable while it
        opened it, under a store fault) is tried again, :data:`RESTARTS` times in all."""
        for attempt in range(RESTARTS):
            try:
                await self.procs[i].start()
            except RuntimeError:
                if attempt == RESTARTS - 1:
                    raise
                await asyncio.sleep(0.5)
            else:
                break
        self.up[i] = True

    def pause(self, i: int) -> None:
        self.procs[i].pause()
        self.up[i] = False

    async def resumed(self, i: int) -> None:
        """:meth:`resume`, as the heal of a stop."""
        self.resume(i)

    def resume(self, i: int) -> None:
        self.procs[i].resume()
        self.up[i] = True

    async def stop(self) -> None:
        """Stop every server, the ones restarting too."""
        for task in self.restarts:
            task.cancel()
        await asyncio.gather(*self.restarts, return_exceptions=True)
        for p in self.procs:
            p.stop()
