"""Recorded histories: one operation per JSON line, as the recorders write them.

Each line is an object with

* ``client``: the client (process or task) that issued the call; one call at a time each;
* ``key``: the object the call is about (a record key, ``log`` for the room's log, the
  commit key), the unit the checker partitions a history by;
* ``op`` and ``input``: what was asked; ``output``: what came back (``null`` when the
  outcome is unknown);
* ``call`` and ``return``: integer times (nanoseconds of one clock shared by every
  client; ``return`` is ``null`` when the outcome is unknown, meaning *infinity*: the call
  may have taken effect at any time after it started, or never).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Operation", "dump_jsonl", "load_jsonl", "parse_jsonl"]


@dataclass(frozen=True, slots=True)
class Operation:
    """One call and its outcome. ``ret is None`` (and ``output is None``) when the
    outcome is unknown: a timeout, a lost connection, a killed client."""

    client: int
    key: str
    op: str
    input: Any
    output: Any
    call: int
    ret: int | None

    @property
    def unknown(self) -> bool:
        return self.ret is None

    def to_json(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "key": self.key,
            "op": self.op,
            "input": self.input,
            "output": self.output,
            "call": self.call,
            "return": self.ret,
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Operation:
        """Raises ``ValueError`` for a row that is not a well-formed operation."""
        try:
            client, key, op = row["client"], row["key"], row["op"]
            call, ret = row["call"], row["return"]
            item = cls(client, key, op, row["input"], row["output"], call, ret)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not an operation: {row!r}") from exc
        if not (isinstance(client, int) and isinstance(key, str) and isinstance(op, str)):
            raise ValueError(f"client, key and op have the wrong types in {row!r}")
        if not isinstance(call, int) or not (ret is None or (isinstance(ret, int) and ret >= call)):
            raise ValueError(f"call and return times are not ordered integers in {row!r}")
        if ret is None and item.output is not None:
            raise ValueError(f"an unknown outcome has an output in {row!r}")
        return item


def parse_jsonl(lines: Iterable[str]) -> list[Operation]:
    """Operations from JSON lines (blank lines skipped); ``ValueError`` on a bad line."""
    return [Operation.from_json(json.loads(line)) for line in lines if line.strip()]


def load_jsonl(path: str | Path) -> list[Operation]:
    with open(path, encoding="utf-8") as f:
        return parse_jsonl(f)


def dump_jsonl(ops: Iterable[Operation], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for item in ops:
            f.write(json.dumps(item.to_json(), separators=(",", ":")) + "\n")
