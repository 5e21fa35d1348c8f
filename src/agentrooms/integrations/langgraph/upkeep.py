"""Whole-thread operations of the LangGraph saver: delete a thread or a run's
checkpoints, copy a thread, prune threads to their latest checkpoint. Each writes in
chunks under the thread's lease (taken for the call if this writer did not hold it),
so a writer that does not own the thread writes nothing (``ThreadHeld``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from agentrooms.errors import (
    BadRequest,
)
from agentrooms.integrations.langgraph import layout
from agentrooms.integrations.langgraph.leases import ThreadLeases
from agentrooms.integrations.langgraph.reads import CheckpointReader
from agentrooms.rooms import Room
from agentrooms.store import Delete, Put, Record, Write

__all__ = ["ThreadUpkeep"]

PAGE = 200  # records per scan page
CHUNK = 1000  # deletes per transact in delete_thread and prune
COPY = 100  # records per transact in copy_thread (values may be large)


class ThreadUpkeep:
    """Deletes, copies and prunes threads in ``room`` through the leases of ``threads``,
    reading through ``reader`` (its store, serializer and setup)."""

    def __init__(self, reader: CheckpointReader, room: Room, threads: ThreadLeases) -> None:
        self.store, self.serde, self._setup = reader.store, reader.serde, reader.setup
        self.room, self._threads = room, threads

    async def delete_thread(self, thread_id: str) -> None:
        await self._setup()
        for prefix in (layout.thread_checkpoints(thread_id), layout.thread_blobs(thread_id)):
            while True:
                page = await self.store.scan(self.room.name, prefix, None, CHUNK)
                await self._delete(page.records)
                if page.next_after is None:
                    break

    async def _delete(self, records: Sequence[Record]) -> None:
        """Delete ``records`` and the run index entries of the checkpoints among them
        (one write, not fenced)."""
        if records:
            entries = [layout.entry_of(r.value) for r in records]
            deletes = [Delete(k) for k in (r.key for r in records)]
            await self.room.scope.transact(
                writes=deletes + [Delete(k) for k in entries if k is not None]
            )

    async def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        if isinstance(run_ids, str):
            raise BadRequest("run_ids must be a sequence of run ids, not one string")
        await self._setup()
        for run_id in map(str, run_ids):
            while True:
                page = await self.store.scan(self.room.name, layout.run_entries(run_id), None, 50)
                for entry in page.records:
                    where = entry.value
                    key = layout.checkpoint(where["thread"], where["ns"], where["id"])
                    async for records in self._pages(key):
                        await self._delete(records)
                    await self.room.scope.transact(writes=[Delete(entry.key)])
                if page.next_after is None:
                    break

    @contextlib.asynccontextmanager
    async def _borrowed(self, thread_id: str) -> AsyncIterator[None]:
        """Own the thread for the body (``ThreadHeld`` if another writer does), and give
        it up after unless this writer owned it before."""
        owned = thread_id in self._threads.leases
        await self._threads.lease(thread_id)
        try:
            yield
        finally:
            if not owned:
                await self._threads.drop(thread_id)

    async def copy_thread(self, source: str, target: str) -> None:
        await self._setup()
        moves = (
            (layout.thread_checkpoints(source), layout.thread_checkpoints(target)),
            (layout.thread_blobs(source), layout.thread_blobs(target)),
        )
        if not (await self.store.scan(self.room.name, moves[0][0], None, 1)).records:
            return  # no checkpoint to copy: the target is left alone
        async with self._borrowed(target):
            for old, new in moves:
                async for records in self._pages(old):
                    copies: list[Write] = []
                    for r in records:
                        value = r.value
                        if value.get("k") == "cp":
                            value = {**value, "thread": target}
                            copies += layout.index_writes(value)
                        copies.append(Put(new + r.key[len(old) :], value))
                    await self._threads.write(target, copies, ())

    async def _pages(self, prefix: str) -> AsyncIterator[list[Record]]:
        """The room's records under ``prefix``, a page of ``COPY`` at a time."""
        after: str | None = None
        while True:
            page = await self.store.scan(self.room.name, prefix, after, COPY)
            if page.records:
                yield page.records
            if page.next_after is None:
                return
            after = page.next_after

    async def prune(self, thread_ids: Sequence[str], strategy: str) -> None:
        if isinstance(thread_ids, str):
            raise BadRequest("thread_ids must be a sequence of thread ids, not one string")
        if strategy not in ("keep_latest", "delete"):
            raise BadRequest(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        for thread_id in map(str, thread_ids):
            if strategy == "delete":
                await self.delete_thread(thread_id)
                continue
            await self._setup()
            async with self._borrowed(thread_id):
                await self._keep_latest(thread_id)

    async def _keep_latest(self, thread_id: str) -> None:
        """Delete all but each namespace's newest checkpoint (and its writes) of a thread
        this writer owns, then the channel values no kept checkpoint reads."""
        doomed: list[str] = []
        kept: set[str] = set()
        namespaces: set[str] = set()
        keeping: str | None = None
        async for records in self._pages(layout.thread_checkpoints(thread_id)):
            for r in records:
                if r.value.get("k") != "cp":
                    if keeping is None or not r.key.startswith(keeping):
                        doomed.append(r.key)
                    continue
                metadata = self.serde.loads_typed(layout.unpacked(r.value["metadata"]))
                if metadata.get("counters_since_delta_snapshot"):
                    raise BadRequest(
                        f"thread {thread_id!r} uses a DeltaChannel, whose values need the "
                        "checkpoints keep_latest would delete: prune it with strategy='delete'"
                    )
                if r.value["ns"] in namespaces:
                    keeping = None
                    doomed += [r.key, *filter(None, [layout.entry_of(r.value)])]
                    continue
                namespaces.add(r.value["ns"])
                keeping = r.key
                checkpoint = self.serde.loads_typed(layout.unpacked(r.value["checkpoint"]))
                kept.update(
                    layout.blob(thread_id, r.value["ns"], channel, version)
                    for channel, version in checkpoint["channel_versions"].items()
                )
        async for records in self._pages(layout.thread_blobs(thread_id)):
            doomed += [r.key for r in records if r.key not in kept]
        for start in range(0, len(doomed), CHUNK):
            await self._threads.write(
                thread_id, [Delete(k) for k in doomed[start : start + CHUNK]], ()
            )
