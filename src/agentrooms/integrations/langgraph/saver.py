"""The LangGraph checkpointer on an agentrooms store, with an owner per thread.

:class:`AgentroomsSaver` is a ``BaseCheckpointSaver`` (sync and async) that keeps each
thread in one room of any agentrooms store (:mod:`.layout` says where). What it adds to
LangGraph's checkpointers: **a thread has one writer at a time.** The writer holds the
thread's lease, a room lock with a fencing token, and every ``put`` and ``put_writes``
commits only while that grant is the newest one of the thread's lock (the fence is
compared in the same atomic write). A second writer's write raises :class:`ThreadHeld`
or :class:`ThreadOwnershipLost` and writes nothing, where LangGraph's own savers would
store a second child of the same parent and fork the thread.

Taking, renewing and releasing: the first write to a thread takes its lease if it is
free (or ``take`` it first, waiting in line); each write renews it once half its TTL has
passed, and so does ``owning`` in the background; ``release`` hands it on. Why it is
built this way: docs/why-langgraph.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from agentrooms.errors import (
    BadRequest,
    VersionConflict,
)
from agentrooms.integrations.langgraph import layout
from agentrooms.integrations.langgraph.leases import ThreadHeld, ThreadLeases, ThreadOwnershipLost
from agentrooms.integrations.langgraph.reads import CheckpointReader
from agentrooms.integrations.langgraph.upkeep import ThreadUpkeep
from agentrooms.rooms import Lock, Room, Rooms, keys
from agentrooms.rooms.locks.records import check_ttl
from agentrooms.store import Absent, Put, Store, Write
from agentrooms.sync import SyncStore

__all__ = ["DEFAULT_ROOM", "AgentroomsSaver", "ThreadHeld", "ThreadOwnershipLost"]

R = TypeVar("R")

DEFAULT_ROOM = "langgraph"
PAGE = 200  # records per scan page


class AgentroomsSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints in room ``room`` of ``store``, written by ``owner`` only
    while it owns the thread (module docstring).

    ``store`` is an async :class:`~agentrooms.store.Store` (the async methods then run on
    the event loop of their first call, and the blocking ones may be called from other
    threads while that loop runs) or a :class:`~agentrooms.sync.SyncStore` (either kind
    of method from anywhere). ``ttl``: seconds a lease lasts from its grant or renewal
    (a write renews it once half of that has passed). The room
    is created on first use. Values go through ``serde`` (LangGraph's default
    serializer unless given); one checkpoint's record, or one channel value, must fit
    the store's value limit (``PayloadTooLarge`` otherwise).
    """

    def __init__(
        self,
        store: Store | SyncStore,
        *,
        owner: str,
        room: str = DEFAULT_ROOM,
        ttl: float = 60.0,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self._loop: asyncio.AbstractEventLoop | None = None
        if isinstance(store, SyncStore):
            self.store, self._loop = store.inner, store.portal.loop
        else:
            self.store = store
        self.owner = keys.check_name(owner, "owner")
        self.ttl = check_ttl(ttl, "a thread lease ttl")
        self.room: Room = Rooms(self.store).room(room)
        self._ready = False
        self._threads = ThreadLeases(self.room, self.owner, self.ttl, self._setup)
        self._reader = CheckpointReader(self.store, self.room.name, self.serde, self._setup)
        self._upkeep = ThreadUpkeep(self._reader, self.room, self._threads)

    # -------------------------------------------------------------- event loop

    async def _run(self, coro: Coroutine[Any, Any, R]) -> R:
        """Run ``coro`` on the store's event loop, from whichever loop awaits."""
        running = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = running
        if self._loop is running:
            return await coro
        if not self._loop.is_running():
            coro.close()
            raise BadRequest(
                "this AgentroomsSaver's store lives on an event loop that is no longer "
                "running: make a saver (and open its store) on the loop that uses it"
            )
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def _block(self, coro: Coroutine[Any, Any, R]) -> R:
        """Run ``coro`` on the store's event loop and wait for it, from blocking code."""
        loop = self._loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or not loop.is_running():
            coro.close()
            raise BadRequest(
                "a blocking AgentroomsSaver method needs its store's event loop running in "
                "another thread: pass a SyncStore, or await the a* method"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # ------------------------------------------------------------------ leases

    async def _setup(self) -> None:
        if self._ready:
            return
        with contextlib.suppress(VersionConflict):  # it exists
            await Rooms(self.store).create(
                self.room.name, "LangGraph checkpoints, one lease per thread"
            )
        self._ready = True

    async def atake(self, thread_id: str, *, timeout: float | None = None) -> Lock:
        """Make this writer the thread's owner now: take its lease if it is free, or, with
        ``timeout``, wait in line (FIFO) up to that many seconds. ``ThreadHeld`` naming
        the owner otherwise. Taking a thread this writer owns already returns its grant."""
        return await self._run(self._threads.acquire(thread_id, timeout))

    async def arelease(self, thread_id: str) -> bool:
        """Give the thread up: the next writer in line gets it, else it is free. ``False``
        if this writer did not own it (or its lease had lapsed and was taken since)."""
        return await self._run(self._threads.drop(thread_id))

    async def aowner(self, thread_id: str) -> str | None:
        """The name of the thread's owner now, ``None`` if nobody holds it."""
        return await self._run(self._threads.owner_of(thread_id))

    @contextlib.asynccontextmanager
    async def owning(
        self, thread_id: str, *, timeout: float | None = None, keep_alive: bool = True
    ) -> AsyncIterator[Lock]:
        """``async with saver.owning(thread_id):`` — ``atake`` on entry, ``arelease`` on
        exit, even if the body raises. With ``keep_alive`` (the default) the lease is
        also renewed in the background while the body runs, so a step longer than the
        TTL keeps the thread; a lease lost all the same (the store out of reach past
        the TTL) is reported by the next write."""
        lock = await self.atake(thread_id, timeout=timeout)
        try:
            if keep_alive:
                await self._run(self._threads.start_keeping(thread_id))
            yield lock
        finally:
            await self.arelease(thread_id)

    def take(self, thread_id: str, *, timeout: float | None = None) -> Lock:
        """Blocking :meth:`atake`."""
        return self._block(self._threads.acquire(thread_id, timeout))

    def release(self, thread_id: str) -> bool:
        """Blocking :meth:`arelease`."""
        return self._block(self._threads.drop(thread_id))

    def owner_of(self, thread_id: str) -> str | None:
        """Blocking :meth:`aowner`."""
        return self._block(self._threads.owner_of(thread_id))

    # ------------------------------------------------------------------ writing

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        stored: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values")
        writes: list[Write] = [
            Put(
                layout.blob(thread_id, ns, channel, version),
                layout.packed(self.serde.dumps_typed(values[channel]))
                if channel in values
                else {"t": "empty"},
            )
            for channel, version in new_versions.items()
        ]
        metadata = get_checkpoint_metadata(config, metadata)
        run = metadata.get("run_id")
        record = {
            "k": "cp",
            "thread": thread_id,
            "ns": ns,
            "id": checkpoint["id"],
            "parent": conf.get("checkpoint_id"),
            "run": None if run is None else str(run),
            "checkpoint": layout.packed(self.serde.dumps_typed(stored)),
            "metadata": layout.packed(self.serde.dumps_typed(metadata)),
        }
        writes.append(Put(layout.checkpoint(thread_id, ns, checkpoint["id"]), record))
        writes += layout.index_writes(record)
        await self._threads.write(thread_id, writes, ())
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        checkpoint_id = str(conf["checkpoint_id"])
        keyed = []
        for i, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, i)
            entry = {
                "k": "w",
                "task": task_id,
                "channel": channel,
                "value": layout.packed(self.serde.dumps_typed(value)),
                "path": task_path,
                "idx": idx,
            }
            keyed.append((layout.write(thread_id, ns, checkpoint_id, task_id, idx), idx, entry))
        await self._setup()
        while True:
            # A regular write already stored is kept (a task's retry repeats it); the
            # special ones (error, interrupt...) replace theirs.
            regular = [key for key, idx, _ in keyed if idx >= 0]
            have = (await self.store.read(self.room.name, regular)).records if regular else {}
            todo = [(key, idx, entry) for key, idx, entry in keyed if key not in have]
            if not todo:
                return
            compares = [Absent(key) for key, idx, _ in todo if idx >= 0]
            try:
                await self._threads.write(thread_id, [Put(k, e) for k, _, e in todo], compares)
            except VersionConflict as exc:
                if not set(exc.conflicts) <= {c.key for c in compares}:
                    raise
                continue  # the same task's writes landed meanwhile: keep those
            return

    # ------------------------------------------------------- the saver interface

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), else the thread's
        newest in its namespace, with channel values and pending writes; ``None`` if
        there is none. Each read is a prefix scan of the one namespace, then one read of
        the channel values."""
        return await self._run(self._reader.get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first: of ``config``'s thread (and namespace, if it names
        one; every thread if ``config`` is ``None``), whose metadata has every item of
        ``filter``, older than ``before``'s checkpoint, at most ``limit``. Read page by
        page: a thread's namespace is one prefix scan, started at ``before``."""
        left = limit
        cursor: str | None = None
        while left is None or left > 0:
            want = PAGE if left is None else min(left, PAGE)
            page, cursor = await self._run(
                self._reader.list_page(config, filter, before, want, cursor)
            )
            for item in page:
                yield item
            if left is not None:
                left -= len(page)
            if cursor is None:
                return

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` (its parent is ``config``'s checkpoint) and the channel
        values of ``new_versions``, in one atomic write fenced by this writer's lease on
        the thread: ``ThreadHeld`` if another writer owns the thread,
        ``ThreadOwnershipLost`` if another was granted it since this writer's grant;
        either way nothing is written."""
        return await self._run(self._put(config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes on ``config``'s checkpoint, atomically and fenced
        like ``aput``. A regular write already stored for ``(task_id, index)`` is kept;
        special ones (error, interrupt, resume, scheduled) replace their own."""
        await self._run(self._put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, writes and channel values, page by page (not
        atomic for a thread over one page). Not fenced, and the thread's lease is left
        alone: an owner's next write starts the thread anew."""
        await self._run(self._upkeep.delete_thread(thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, pending write and channel value of the source thread to
        the target, a page at a time, each page fenced like ``aput`` by a lease on the
        target (taken for the copy, and given up after unless this writer owned the
        target): ``ThreadHeld`` if another writer owns it. A missing source copies
        nothing."""
        await self._run(self._upkeep.copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep only each namespace's newest checkpoint of each thread
        (with its writes and the channel values it reads), fenced like ``acopy_thread``
        by a lease on the thread; refused (``BadRequest``) for a thread that uses a
        ``DeltaChannel``, which needs the ancestors. ``"delete"``: ``adelete_thread``
        each one. Neither is atomic: a thread's deletes go a thousand records a write."""
        await self._run(self._upkeep.prune(thread_ids, strategy))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their pending writes) that the runs wrote, on every
        thread, found through the run index (no scan of other runs' checkpoints). Not
        fenced, like ``adelete_thread``; channel values stay (other checkpoints may read
        them)."""
        await self._run(self._upkeep.delete_for_runs(run_ids))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Blocking :meth:`adelete_for_runs`."""
        self._block(self._upkeep.delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Blocking :meth:`acopy_thread`."""
        self._block(self._upkeep.copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Blocking :meth:`aprune`."""
        self._block(self._upkeep.prune(thread_ids, strategy))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Blocking :meth:`aget_tuple`."""
        return self._block(self._reader.get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Blocking :meth:`alist`, page by page."""
        left = limit
        cursor: str | None = None
        while left is None or left > 0:
            want = PAGE if left is None else min(left, PAGE)
            page, cursor = self._block(self._reader.list_page(config, filter, before, want, cursor))
            yield from page
            if left is not None:
                left -= len(page)
            if cursor is None:
                return

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Blocking :meth:`aput`."""
        return self._block(self._put(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Blocking :meth:`aput_writes`."""
        self._block(self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Blocking :meth:`adelete_thread`."""
        self._block(self._upkeep.delete_thread(thread_id))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Channel versions as strings that sort in the order they were made, as
        LangGraph's own savers make them: the counter, then a random tiebreak."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        return f"{number + 1:032}.{random.random():016}"
