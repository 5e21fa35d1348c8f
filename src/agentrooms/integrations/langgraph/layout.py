"""Where the checkpointer keeps a thread in its room: record keys and their encodings.

=====================================================  ==================================
record                                                 holds
=====================================================  ==================================
``lgc/<thread>/<ns>/<id>``                             one checkpoint (and its metadata)
``lgc/<thread>/<ns>/<id>w/<task>/<idx>``               one pending write of that checkpoint
``lgb/<thread>/<ns>/<channel>/<version>``              one channel value at one version
``lgr/<run>/<thread>/<ns>/<id>``                       a checkpoint the run wrote (index)
``lock/thread:<thread>`` (the room's locks)            the writer that owns the thread
=====================================================  ==================================

Every ``<part>`` is percent-encoded (``/`` included), so parts never run into each other.
``<id>`` is the checkpoint id *inverted*: its UTF-8 bytes in hexadecimal with each digit
``d`` replaced by ``f - d``, then ``~``. Key order is then newest checkpoint first (ids
increase with time), so "the latest", "the ``limit`` newest" and "those ``before`` one"
are each one prefix scan from its start or from a key, and a checkpoint's pending writes
sort right behind it (``w`` sorts before ``~``), read in the same scan.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any
from urllib.parse import quote

from agentrooms.store import Put, Write

CHECKPOINTS = "lgc/"
BLOBS = "lgb/"
RUNS = "lgr/"

_FLIP = str.maketrans("0123456789abcdef", "fedcba9876543210")
_LOCK_NAME = re.compile(r"[A-Za-z0-9._:-]{1,120}")


def part(value: str) -> str:
    """One key part: percent-encoded, ``/`` included."""
    return quote(value, safe="")


def inverted(checkpoint_id: str) -> str:
    """A key part that sorts descending where ``checkpoint_id`` sorts ascending (Unicode
    code point order, which is UTF-8 byte order): for ``a < b``, ``inverted(b) <
    inverted(a)``, a prefix included (the ``~`` terminator sorts after every digit)."""
    return checkpoint_id.encode().hex().translate(_FLIP) + "~"


def thread_checkpoints(thread_id: str) -> str:
    return f"{CHECKPOINTS}{part(thread_id)}/"


def namespace_checkpoints(thread_id: str, ns: str) -> str:
    return f"{thread_checkpoints(thread_id)}{part(ns)}/"


def checkpoint(thread_id: str, ns: str, checkpoint_id: str) -> str:
    """The checkpoint's record; also the prefix of its pending writes."""
    return namespace_checkpoints(thread_id, ns) + inverted(checkpoint_id)


def older_than(thread_id: str, ns: str, checkpoint_id: str) -> str:
    """The scan cursor (``after``) past the checkpoint and its writes: what follows is
    older checkpoints of the same thread and namespace."""
    return checkpoint(thread_id, ns, checkpoint_id) + "~"


def write(thread_id: str, ns: str, checkpoint_id: str, task_id: str, idx: int) -> str:
    return f"{checkpoint(thread_id, ns, checkpoint_id)}w/{part(task_id)}/{idx}"


def thread_blobs(thread_id: str) -> str:
    return f"{BLOBS}{part(thread_id)}/"


def blob(thread_id: str, ns: str, channel: str, version: str | int | float) -> str:
    return f"{thread_blobs(thread_id)}{part(ns)}/{part(channel)}/{part(str(version))}"


def run_entries(run_id: str) -> str:
    return f"{RUNS}{part(run_id)}/"


def run_entry(record: dict[str, Any]) -> str | None:
    """The run index entry of a checkpoint record (``None``: no run wrote it)."""
    run = record.get("run")
    if not isinstance(run, str):
        return None
    where = f"{part(record['thread'])}/{part(record['ns'])}/{inverted(record['id'])}"
    return run_entries(run) + where


def lock_name(thread_id: str) -> str:
    """The name of the room lock that is the thread's lease: ``thread:<id>`` when the id
    is a valid lock name, else ``thread-sha256:<digest>`` (the two never collide)."""
    if _LOCK_NAME.fullmatch(thread_id):
        return f"thread:{thread_id}"
    return f"thread-sha256:{hashlib.sha256(thread_id.encode()).hexdigest()}"


def packed(typed: tuple[str, bytes]) -> dict[str, Any]:
    """A serializer's ``(type, bytes)`` as JSON."""
    kind, data = typed
    return {"t": kind, "b": base64.b64encode(data).decode("ascii")}


def unpacked(value: dict[str, Any]) -> tuple[str, bytes]:
    return value["t"], base64.b64decode(value["b"])


def entry_of(value: Any) -> str | None:
    """The run index key of a checkpoint record's value (``None`` for other records)."""
    if isinstance(value, dict) and value.get("k") == "cp":
        return run_entry(value)
    return None


def index_writes(record: dict[str, Any]) -> list[Write]:
    """The run index entry to write with a checkpoint record, if a run wrote it."""
    key = run_entry(record)
    if key is None:
        return []
    return [Put(key, {"thread": record["thread"], "ns": record["ns"], "id": record["id"]})]
