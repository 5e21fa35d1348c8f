"""Readers for Jepsen's history formats, as operations for the checker.

Times are event indexes (the line order), which is all Jepsen's logs give. A call
``:invoke`` ends with ``:ok`` (it returned), ``:fail`` (it definitely had no effect: a
compare-and-set whose comparison failed, a read that timed out) or ``:info`` (unknown:
return time infinity). A process still waiting at the end of the log is unknown too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from agentrooms.reliability.history import Operation

__all__ = ["parse_edn_kv", "parse_etcd_log"]

_ETCD = re.compile(r"^INFO\s+jepsen\.util - (\d+)\s+:(invoke|ok|fail|info)\s+:(\w+)\s*(.*?)\s*$")
_EDN = re.compile(
    r'^\{:process (\d+), :type :(invoke|ok|fail|info), :f :(\w+), :key "([^"]*)", '
    r':value (nil|"[^"]*")\}$'
)


class _Pairing:
    """Matches each process's invocation with its completion."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[int, str, str, Any]] = {}
        self.ops: list[Operation] = []

    def invoke(self, process: int, time: int, key: str, f: str, value: Any) -> None:
        if process in self.pending:
            raise ValueError(f"process {process} invoked twice at event {time}")
        self.pending[process] = (time, key, f, value)

    def complete(self, process: int, time: int, kind: str, output: Any) -> None:
        if process not in self.pending:
            raise ValueError(f"process {process} completed nothing at event {time}")
        call, key, f, value = self.pending.pop(process)
        if kind == "fail" and f == "read":
            return  # a read that returned nothing: no effect and no information
        if kind == "info":
            self.ops.append(Operation(process, key, f, value, None, call, None))
        else:
            self.ops.append(Operation(process, key, f, value, output, call, time))

    def finish(self) -> list[Operation]:
        for process, (call, key, f, value) in sorted(self.pending.items()):
            self.ops.append(Operation(process, key, f, value, None, call, None))
        self.pending.clear()
        return self.ops


def _etcd_value(text: str) -> Any:
    if text in ("nil", ":timed-out", ""):
        return None
    if text.startswith("["):
        return [None if v == "nil" else int(v) for v in text.strip("[]").split()]
    return int(text)


def parse_etcd_log(lines: Iterable[str]) -> list[Operation]:
    """A Jepsen etcd log (``INFO jepsen.util - <process> <type> <op> <value>``) as
    register operations (:class:`~.models.RegisterModel`). ``ValueError`` on a line
    that is not an event or breaks the one-call-per-process rule."""
    pairing = _Pairing()
    for time, line in enumerate(line for line in lines if line.strip()):
        m = _ETCD.match(line)
        if m is None:
            raise ValueError(f"not a Jepsen etcd event: {line!r}")
        process, kind, f, text = int(m[1]), m[2], m[3], m[4]
        if f not in ("read", "write", "cas"):
            raise ValueError(f"unknown operation {f!r} in {line!r}")
        if kind == "invoke":
            pairing.invoke(process, time, "register", f, None if f == "read" else _etcd_value(text))
        elif f == "cas":
            pairing.complete(process, time, kind, kind == "ok")
        else:
            pairing.complete(process, time, kind, _etcd_value(text) if f == "read" else None)
    return pairing.finish()


def parse_edn_kv(lines: Iterable[str]) -> list[Operation]:
    """A key-value history in Jepsen's map syntax (``{:process 0, :type :invoke, :f
    :append, :key "3", :value "x"}``) as operations of :class:`~.models.AppendModel`."""
    pairing = _Pairing()
    for time, line in enumerate(line for line in lines if line.strip()):
        m = _EDN.match(line.strip())
        if m is None:
            raise ValueError(f"not a Jepsen key-value event: {line!r}")
        process, kind, f, key = int(m[1]), m[2], m[3], m[4]
        value = None if m[5] == "nil" else m[5][1:-1]
        if kind == "invoke":
            pairing.invoke(process, time, key, f, value)
        else:
            pairing.complete(process, time, kind, value if f == "get" else None)
    return pairing.finish()
