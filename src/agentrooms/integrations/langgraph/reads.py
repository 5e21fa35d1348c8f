"""Reading LangGraph checkpoints back: scans of a thread's records grouped by checkpoint
(each with its pending writes), and the channel values they name, in one read for all.
Read-only; what it reads is laid out by :mod:`.layout`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from agentrooms.integrations.langgraph import layout
from agentrooms.store import Record, Store

__all__ = ["CheckpointReader"]

PAGE = 200  # records per scan page


@dataclass
class _Group:
    """One checkpoint's record and its pending writes, as a scan met them."""

    record: Record
    writes: list[dict[str, Any]]


class CheckpointReader:
    """Reads the checkpoints of room ``room`` of ``store``, decoding values with
    ``serde``; ``setup`` runs first (it creates the room)."""

    def __init__(
        self,
        store: Store,
        room: str,
        serde: SerializerProtocol,
        setup: Callable[[], Awaitable[None]],
    ) -> None:
        self.store, self.serde, self.setup = store, serde, setup
        self.room_name = room

    async def groups(
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
            page = await self.store.scan(self.room_name, prefix, cursor, size)
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

    async def tuples(
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
            snap = await self.store.read(self.room_name, unique[start : start + step])
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

    async def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        await self.setup()
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            prefix = layout.checkpoint(thread_id, ns, checkpoint_id)
        else:
            prefix = layout.namespace_checkpoints(thread_id, ns)
        groups, _ = await self.groups(prefix, None, 1, lambda _v, _m: True)
        if not groups:
            return None
        (found,) = await self.tuples(groups)
        return found

    async def list_page(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        want: int,
        cursor: str | None,
    ) -> tuple[list[CheckpointTuple], str | None]:
        """One page of ``AgentroomsSaver.alist``: up to ``want`` tuples and the cursor
        for the next."""
        await self.setup()
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

        groups, cursor = await self.groups(prefix, cursor, want, keep)
        return await self.tuples(groups), cursor
