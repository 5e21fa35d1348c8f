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
import time
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from agentrooms.errors import (
    AgentroomsError,
    BadRequest,
    LockHeld,
    StaleFence,
    StoreUnavailable,
    VersionConflict,
)
from agentrooms.integrations.langgraph import layout
from agentrooms.rooms import Lock, Room, Rooms, keys
from agentrooms.rooms.locks.records import check_ttl
from agentrooms.store import Absent, Delete, Put, Record, Store, Write
from agentrooms.sync import SyncStore

__all__ = ["DEFAULT_ROOM", "AgentroomsSaver", "ThreadHeld", "ThreadOwnershipLost"]

R = TypeVar("R")

DEFAULT_ROOM = "langgraph"
PAGE = 200  # records per scan page
CHUNK = 1000  # deletes per transact in delete_thread and prune
COPY = 100  # records per transact in copy_thread (values may be large)


class ThreadHeld(LockHeld):
    """Another writer owns the thread: this writer's ``put``/``put_writes`` (or ``take``)
    wrote nothing. Wait for the lease (``take(thread_id, timeout=...)``) or leave the
    thread to its owner. ``thread_id`` and ``holder`` (the owner's name) say who."""

    code = "thread_held"

    def __init__(self, thread_id: str, holder: str | None, writer: str) -> None:
        self.thread_id, self.writer = thread_id, writer
        super().__init__(
            layout.lock_name(thread_id),
            holder,
            f"thread {thread_id!r} is owned by {holder!r}, not by this writer "
            f"({writer!r}): nothing was written",
        )

    def details(self) -> dict[str, Any]:
        return {**super().details(), "thread_id": self.thread_id, "writer": self.writer}


class ThreadOwnershipLost(StaleFence):
    """This writer's lease on the thread was superseded: another writer was granted it
    since, so the write was refused (nothing written) rather than fork the thread. The
    thread may have moved on: re-read it before writing again. ``holder`` is the owner
    now (``None`` if nobody holds it at this moment)."""

    code = "thread_ownership_lost"

    def __init__(
        self, thread_id: str, writer: str, holder: str | None, fence: int, current: int | None
    ) -> None:
        self.key, self.fence, self.current = layout.lock_name(thread_id), fence, current
        self.thread_id, self.writer, self.holder = thread_id, writer, holder
        AgentroomsError.__init__(
            self,
            f"writer {writer!r} no longer owns thread {thread_id!r} (now held by "
            f"{holder!r}; fence {fence} is stale, the newest is {current}): the write "
            "was refused and nothing was written; re-read the thread",
        )

    def details(self) -> dict[str, Any]:
        return {
            **super().details(),
            "thread_id": self.thread_id,
            "writer": self.writer,
            "holder": self.holder,
        }


@dataclass
class _Lease:
    lock: Lock
    renew_at: float  # time.monotonic(): renew on the first write after this


@dataclass
class _Group:
    """One checkpoint's record and its pending writes, as a scan met them."""

    record: Record
    writes: list[dict[str, Any]]


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
        self._leases: dict[str, _Lease] = {}
        self._turns: dict[str, asyncio.Lock] = {}
        self._keepers: dict[str, asyncio.Task[None]] = {}
        self._ready = False

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

    def _turn(self, thread_id: str) -> asyncio.Lock:
        return self._turns.setdefault(thread_id, asyncio.Lock())

    def _leased(self, thread_id: str, lock: Lock) -> Lock:
        self._leases[thread_id] = _Lease(lock, time.monotonic() + lock.ttl / 2)
        return lock

    async def _take(self, thread_id: str, timeout: float | None) -> Lock:
        await self._setup()
        name = layout.lock_name(thread_id)
        try:
            if timeout is None:
                lock = await self.room.locks.try_acquire(name, self.owner, ttl=self.ttl)
            else:
                lock = await self.room.locks.wait_acquire(
                    name, self.owner, ttl=self.ttl, timeout=timeout
                )
        except LockHeld as exc:
            raise ThreadHeld(thread_id, exc.holder, self.owner) from exc
        return self._leased(thread_id, lock)

    async def _lease(self, thread_id: str) -> Lock:
        """This writer's grant on the thread: the one it holds (renewed once half its TTL
        has passed), else a new one if the thread is free (``ThreadHeld`` if not)."""
        async with self._turn(thread_id):
            lease = self._leases.get(thread_id)
            if lease is None:
                return await self._take(thread_id, None)
            if time.monotonic() < lease.renew_at:
                return lease.lock
            try:
                return self._leased(thread_id, await self.room.locks.extend(lease.lock))
            except StaleFence:
                pass  # it lapsed: take it again, if nobody was granted it in between
            del self._leases[thread_id]
            try:
                lock = await self._take(thread_id, None)
            except ThreadHeld as exc:
                raise await self._lost(thread_id, lease.lock, None) from exc
            if lock.fence != lease.lock.fence + 1:
                await self._drop(thread_id)
                raise await self._lost(thread_id, lease.lock, lock.fence - 1)
            return lock

    def _forget(self, thread_id: str) -> _Lease | None:
        """Forget the thread's lease (and its turn, unless a call is in it)."""
        turn = self._turns.get(thread_id)
        if turn is not None and not turn.locked():
            del self._turns[thread_id]
        return self._leases.pop(thread_id, None)

    async def _drop(self, thread_id: str) -> bool:
        keeper = self._keepers.pop(thread_id, None)
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        lease = self._forget(thread_id)
        return lease is not None and await self.room.locks.release(lease.lock)

    async def _keep(self, thread_id: str) -> None:
        """Renew the thread's lease each time half its TTL has passed, until it is
        released or lost (the next write then says which)."""
        try:
            await self._keeping(thread_id)
        finally:
            if self._keepers.get(thread_id) is asyncio.current_task():
                del self._keepers[thread_id]

    async def _keeping(self, thread_id: str) -> None:
        while (lease := self._leases.get(thread_id)) is not None:
            await asyncio.sleep(max(0.0, lease.renew_at - time.monotonic()))
            async with self._turn(thread_id):
                lease = self._leases.get(thread_id)
                if lease is None or time.monotonic() < lease.renew_at:
                    continue  # released, or a write renewed it meanwhile
                try:
                    self._leased(thread_id, await self.room.locks.extend(lease.lock))
                except StaleFence:
                    return  # lapsed or taken: the next write takes it back or is refused
                except StoreUnavailable:
                    await asyncio.sleep(min(1.0, self.ttl / 10))  # try again

    async def _start_keeping(self, thread_id: str) -> None:
        if thread_id not in self._keepers:
            self._keepers[thread_id] = asyncio.create_task(self._keep(thread_id))

    async def _lost(self, thread_id: str, lock: Lock, current: int | None) -> ThreadOwnershipLost:
        holder = await self.room.locks.holder(lock.name)
        return ThreadOwnershipLost(
            thread_id,
            self.owner,
            None if holder is None else holder.owner,
            lock.fence,
            current if holder is None else holder.fence,
        )

    async def _write(self, thread_id: str, writes: list[Write], compares: Sequence[Any]) -> None:
        """Commit ``writes`` fenced by this writer's grant on the thread."""
        lock = await self._lease(thread_id)
        try:
            await self.room.scope.transact([lock.guard(), *compares], writes)
        except StaleFence as exc:
            self._forget(thread_id)
            raise await self._lost(thread_id, lock, exc.current) from exc

    async def atake(self, thread_id: str, *, timeout: float | None = None) -> Lock:
        """Make this writer the thread's owner now: take its lease if it is free, or, with
        ``timeout``, wait in line (FIFO) up to that many seconds. ``ThreadHeld`` naming
        the owner otherwise. Taking a thread this writer owns already returns its grant."""
        return await self._run(self._atake(thread_id, timeout))

    async def _atake(self, thread_id: str, timeout: float | None) -> Lock:
        async with self._turn(thread_id):
            lease = self._leases.get(thread_id)
            return lease.lock if lease is not None else await self._take(thread_id, timeout)

    async def arelease(self, thread_id: str) -> bool:
        """Give the thread up: the next writer in line gets it, else it is free. ``False``
        if this writer did not own it (or its lease had lapsed and was taken since)."""
        return await self._run(self._drop(thread_id))

    async def aowner(self, thread_id: str) -> str | None:
        """The name of the thread's owner now, ``None`` if nobody holds it."""
        return await self._run(self._owner(thread_id))

    async def _owner(self, thread_id: str) -> str | None:
        await self._setup()
        holder = await self.room.locks.holder(layout.lock_name(thread_id))
        return None if holder is None else holder.owner

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
                await self._run(self._start_keeping(thread_id))
            yield lock
        finally:
            await self.arelease(thread_id)

    def take(self, thread_id: str, *, timeout: float | None = None) -> Lock:
        """Blocking :meth:`atake`."""
        return self._block(self._atake(thread_id, timeout))

    def release(self, thread_id: str) -> bool:
        """Blocking :meth:`arelease`."""
        return self._block(self._drop(thread_id))

    def owner_of(self, thread_id: str) -> str | None:
        """Blocking :meth:`aowner`."""
        return self._block(self._owner(thread_id))

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
        writes += _indexed(record)
        await self._write(thread_id, writes, ())
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
                await self._write(thread_id, [Put(k, e) for k, _, e in todo], compares)
            except VersionConflict as exc:
                if not set(exc.conflicts) <= {c.key for c in compares}:
                    raise
                continue  # the same task's writes landed meanwhile: keep those
            return

    async def _delete_thread(self, thread_id: str) -> None:
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
            entries = [_entry(r.value) for r in records]
            deletes = [Delete(k) for k in (r.key for r in records)]
            await self.room.scope.transact(
                writes=deletes + [Delete(k) for k in entries if k is not None]
            )

    async def _delete_for_runs(self, run_ids: Sequence[str]) -> None:
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
        owned = thread_id in self._leases
        await self._lease(thread_id)
        try:
            yield
        finally:
            if not owned:
                await self._drop(thread_id)

    async def _copy_thread(self, source: str, target: str) -> None:
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
                            copies += _indexed(value)
                        copies.append(Put(new + r.key[len(old) :], value))
                    await self._write(target, copies, ())

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

    async def _prune(self, thread_ids: Sequence[str], strategy: str) -> None:
        if isinstance(thread_ids, str):
            raise BadRequest("thread_ids must be a sequence of thread ids, not one string")
        if strategy not in ("keep_latest", "delete"):
            raise BadRequest(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        for thread_id in map(str, thread_ids):
            if strategy == "delete":
                await self._delete_thread(thread_id)
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
                    doomed += [r.key, *filter(None, [_entry(r.value)])]
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
            await self._write(thread_id, [Delete(k) for k in doomed[start : start + CHUNK]], ())

    # ------------------------------------------------------------------ reading

    async def _groups(
        self, prefix: str, after: str | None, want: int, keep: Any
    ) -> tuple[list[tuple[_Group, CheckpointMetadata]], str | None]:
        """Up to ``want`` checkpoints under ``prefix`` after key ``after`` that ``keep``
        (a predicate on the record's value and metadata) accepts, each with its pending
        writes, newest first; and the cursor to go on from (``None``: no more)."""
        found: list[tuple[_Group, CheckpointMetadata]] = []
        group: _Group | None = None
        last = after

        def close() -> None:
            if group is not None:
                metadata = self.serde.loads_typed(layout.unpacked(group.record.value["metadata"]))
                if keep(group.record.value, metadata):
                    found.append((group, metadata))

        cursor = after
        size = min(PAGE, 4 * want + 4)  # a few writes each; pages grow if there are more
        while True:
            page = await self.store.scan(self.room.name, prefix, cursor, size)
            size = min(PAGE, 2 * size)
            for record in page.records:
                kind = record.value.get("k") if isinstance(record.value, dict) else None
                if kind == "cp":
                    close()
                    if len(found) >= want:
                        return found, last
                    group = _Group(record, [])
                elif kind == "w" and group is not None and record.key.startswith(group.record.key):
                    group.writes.append(record.value)
                last = record.key
            if page.next_after is None:
                close()
                return found, None
            cursor = page.next_after

    async def _tuples(
        self, groups: list[tuple[_Group, CheckpointMetadata]]
    ) -> list[CheckpointTuple]:
        """The checkpoints of ``groups`` with their channel values (one read for all)."""
        loaded = []
        wanted: list[str] = []
        for group, metadata in groups:
            value = group.record.value
            checkpoint: Checkpoint = self.serde.loads_typed(layout.unpacked(value["checkpoint"]))
            blob_keys = {
                channel: layout.blob(value["thread"], value["ns"], channel, version)
                for channel, version in checkpoint["channel_versions"].items()
            }
            wanted += blob_keys.values()
            loaded.append((group, metadata, checkpoint, blob_keys))
        blobs: dict[str, Record] = {}
        unique = list(dict.fromkeys(wanted))
        step = self.store.limits.max_ops
        for start in range(0, len(unique), step):
            snap = await self.store.read(self.room.name, unique[start : start + step])
            blobs.update(snap.records)
        out = []
        for group, metadata, checkpoint, blob_keys in loaded:
            value = group.record.value
            values = {}
            for channel, key in blob_keys.items():
                blob = blobs.get(key)
                if blob is not None and blob.value["t"] != "empty":
                    values[channel] = self.serde.loads_typed(layout.unpacked(blob.value))
            writes = sorted(group.writes, key=lambda w: (w["path"], w["task"], w["idx"]))
            where = {"thread_id": value["thread"], "checkpoint_ns": value["ns"]}
            out.append(
                CheckpointTuple(
                    config={"configurable": {**where, "checkpoint_id": value["id"]}},
                    checkpoint={**checkpoint, "channel_values": values},
                    metadata=metadata,
                    parent_config=(
                        {"configurable": {**where, "checkpoint_id": value["parent"]}}
                        if value["parent"]
                        else None
                    ),
                    pending_writes=[
                        (
                            w["task"],
                            w["channel"],
                            self.serde.loads_typed(layout.unpacked(w["value"])),
                        )
                        for w in writes
                    ],
                )
            )
        return out

    async def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        await self._setup()
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            prefix = layout.checkpoint(thread_id, ns, checkpoint_id)
        else:
            prefix = layout.namespace_checkpoints(thread_id, ns)
        groups, _ = await self._groups(prefix, None, 1, lambda _v, _m: True)
        if not groups:
            return None
        (found,) = await self._tuples(groups)
        return found

    async def _list_page(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        want: int,
        cursor: str | None,
    ) -> tuple[list[CheckpointTuple], str | None]:
        """One page of :meth:`alist`: up to ``want`` tuples and the cursor for the next."""
        await self._setup()
        conf = config["configurable"] if config else {}
        thread_id = conf.get("thread_id")
        ns = conf.get("checkpoint_ns")
        only = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        if thread_id is None:
            prefix = layout.CHECKPOINTS
        elif ns is None:
            prefix = layout.thread_checkpoints(str(thread_id))
        elif only:
            prefix = layout.checkpoint(str(thread_id), str(ns), only)
        else:
            prefix = layout.namespace_checkpoints(str(thread_id), str(ns))
            if before_id and cursor is None:  # start the scan past it
                cursor = layout.older_than(str(thread_id), str(ns), before_id)

        def keep(value: dict[str, Any], metadata: CheckpointMetadata) -> bool:
            if ns is not None and value["ns"] != ns:
                return False
            if before_id and value["id"] >= before_id:
                return False
            return not filter or all(metadata.get(k) == v for k, v in filter.items())

        groups, cursor = await self._groups(prefix, cursor, want, keep)
        return await self._tuples(groups), cursor

    # ------------------------------------------------------- the saver interface

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), else the thread's
        newest in its namespace, with channel values and pending writes; ``None`` if
        there is none. Each read is a prefix scan of the one namespace, then one read of
        the channel values."""
        return await self._run(self._get_tuple(config))

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
            page, cursor = await self._run(self._list_page(config, filter, before, want, cursor))
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
        await self._run(self._delete_thread(thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, pending write and channel value of the source thread to
        the target, a page at a time, each page fenced like ``aput`` by a lease on the
        target (taken for the copy, and given up after unless this writer owned the
        target): ``ThreadHeld`` if another writer owns it. A missing source copies
        nothing."""
        await self._run(self._copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep only each namespace's newest checkpoint of each thread
        (with its writes and the channel values it reads), fenced like ``acopy_thread``
        by a lease on the thread; refused (``BadRequest``) for a thread that uses a
        ``DeltaChannel``, which needs the ancestors. ``"delete"``: ``adelete_thread``
        each one. Neither is atomic: a thread's deletes go a thousand records a write."""
        await self._run(self._prune(thread_ids, strategy))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their pending writes) that the runs wrote, on every
        thread, found through the run index (no scan of other runs' checkpoints). Not
        fenced, like ``adelete_thread``; channel values stay (other checkpoints may read
        them)."""
        await self._run(self._delete_for_runs(run_ids))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Blocking :meth:`adelete_for_runs`."""
        self._block(self._delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Blocking :meth:`acopy_thread`."""
        self._block(self._copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Blocking :meth:`aprune`."""
        self._block(self._prune(thread_ids, strategy))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Blocking :meth:`aget_tuple`."""
        return self._block(self._get_tuple(config))

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
            page, cursor = self._block(self._list_page(config, filter, before, want, cursor))
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
        self._block(self._delete_thread(thread_id))

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


def _entry(value: Any) -> str | None:
    """The run index key of a checkpoint record's value (``None`` for other records)."""
    if isinstance(value, dict) and value.get("k") == "cp":
        return layout.run_entry(value)
    return None


def _indexed(record: dict[str, Any]) -> list[Write]:
    """The run index entry to write with a checkpoint record, if a run wrote it."""
    key = layout.run_entry(record)
    if key is None:
        return []
    return [Put(key, {"thread": record["thread"], "ns": record["ns"], "id": record["id"]})]
