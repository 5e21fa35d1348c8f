"""``sqlite://`` URLs, read the way SQLAlchemy reads them.

==========================================  =============================================
``sqlite:///relative/path.db``              relative to the working directory
``sqlite:////abs/path.db``                  absolute
``sqlite://`` or ``sqlite:///:memory:``     a private in-memory database (tests only)
``?synchronous=FULL``                       FULL (default, safe), EXTRA, or NORMAL (the
                                            last commits may be lost on power loss)
``?busy_timeout_ms=5000``                   how long SQLite itself waits for a lock
==========================================  =============================================
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from agentrooms.errors import BadRequest

MEMORY = ":memory:"
SYNCHRONOUS = ("FULL", "EXTRA", "NORMAL")
DEFAULT_BUSY_TIMEOUT_MS = 5000


@dataclass(frozen=True, slots=True)
class SqliteConfig:
    path: str  # a file path, or ":memory:"
    synchronous: str = "FULL"
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS

    @property
    def in_memory(self) -> bool:
        return self.path == MEMORY


def parse_url(url: str) -> SqliteConfig:
    """The settings named by a ``sqlite://`` URL; ``BadRequest`` if it is malformed."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite":
        raise BadRequest(f"not a sqlite:// URL: {url!r}")
    if parts.netloc:
        raise BadRequest(
            f"a sqlite URL names no host: {url!r} (use sqlite:///relative.db "
            "or sqlite:////absolute/path.db)"
        )
    path = unquote(parts.path[1:]) if parts.path.startswith("/") else unquote(parts.path)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    synchronous = options.pop("synchronous", "FULL").upper()
    if synchronous not in SYNCHRONOUS:
        raise BadRequest(
            f"synchronous must be one of {', '.join(SYNCHRONOUS)}, not {synchronous!r}"
        )
    timeout = options.pop("busy_timeout_ms", str(DEFAULT_BUSY_TIMEOUT_MS))
    if not (timeout.isascii() and timeout.isdigit()):
        raise BadRequest(f"busy_timeout_ms must be a whole number of milliseconds: {timeout!r}")
    if options:
        raise BadRequest(f"unknown sqlite URL options {sorted(options)} in {url!r}")
    return SqliteConfig(path or MEMORY, synchronous, int(timeout))
