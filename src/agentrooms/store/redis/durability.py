"""What a Redis server's settings mean for acknowledged writes: a pure judgement.

An acknowledged write survives a crash of the server only with ``appendonly yes`` and
``appendfsync always``. With ``everysec`` up to about one second of acknowledged writes
can be lost; with ``appendfsync no`` whatever the OS had not flushed (typically up to
30 s); without AOF everything since the last RDB snapshot, or everything when ``save`` is
empty too. An eviction policy other than ``noeviction`` lets Redis drop records, room
counters and log entries under memory pressure, which breaks the contract outright.
"""

from __future__ import annotations

from collections.abc import Mapping

SAFE = "appendonly yes, appendfsync always: an acknowledged write survives a crash"


def judge(config: Mapping[str, str]) -> tuple[str, list[str]]:
    """``(durability, warnings)`` from ``CONFIG GET`` values (``appendonly``,
    ``appendfsync``, ``save``, ``maxmemory-policy``). When CONFIG is unavailable the
    caller passes ``aof_enabled`` from ``INFO persistence`` instead, or nothing."""
    warnings: list[str] = []
    if "appendonly" in config:
        durability = _persistence(config, warnings)
    else:
        aof = {"1": "on", "0": "off"}.get(config.get("aof_enabled", ""), "unknown")
        durability = f"unknown: CONFIG GET is not allowed on this server (AOF {aof})"
        warnings.append(
            "could not read the persistence settings (CONFIG is disabled): make sure the "
            "server runs with appendonly yes and appendfsync always"
        )
    policy = config.get("maxmemory-policy", "noeviction")
    if policy != "noeviction":
        warnings.append(
            f"maxmemory-policy is {policy}: under memory pressure Redis may evict records, "
            "room counters and log entries (lost writes, reused versions, gaps in the log); "
            "use noeviction"
        )
    return durability, warnings


def _persistence(config: Mapping[str, str], warnings: list[str]) -> str:
    fsync = config.get("appendfsync", "")
    if config["appendonly"] == "yes":
        if fsync == "always":
            return SAFE
        if fsync == "everysec":
            warnings.append(
                "appendfsync everysec: up to ~1 s of acknowledged writes can be lost in a "
                "crash; set appendfsync always"
            )
        else:
            warnings.append(
                f"appendfsync {fsync or 'unknown'}: the OS decides when to flush, so many "
                "seconds of acknowledged writes can be lost in a crash; set appendfsync always"
            )
        return f"appendonly yes, appendfsync {fsync or 'unknown'}: recent writes can be lost"
    if config.get("save", "").strip():
        warnings.append(
            "appendonly no: a crash loses every write since the last RDB snapshot; set "
            "appendonly yes and appendfsync always"
        )
        return f"RDB snapshots only (save {config['save']}): writes since the last one can be lost"
    warnings.append(
        "no persistence (appendonly no, no RDB save points): a restart loses everything; "
        "set appendonly yes and appendfsync always"
    )
    return "none: the data lives only in the server's memory"
