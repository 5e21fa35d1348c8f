"""``sqlite://`` URLs, read the way SQLAlchemy reads them.

==========================================  =============================================
``sqlite:///relative/path.db``              relative to the working directory
``sqlite:////abs/path.db``                  absolute
``sqlite://`` or ``sqlite:///:memory:``     a private in-memory database (tests only)
``?synchronous=FULL``                       FULL (default, safe), EXTRA, or NORMAL (the
                                            last commits may be lost on power loss)
``?busy_timeout_ms=5000``                   how long SQLite itself waits for the lock
                                            before the engine's retry loop takes over
``?timeout=30``                             seconds a call retries a locked database
                                            before ``StoreUnavailable`` (the per-call
                                            timeout; a call may take up to this plus
                                            ``busy_timeout_ms``)
``?connect_timeout=30``                     the same for opening: setting WAL up and
                                            migrating
``?max_clock_skew=1``                       seconds this process's clock may differ from
                                            the clock of the file system holding the
                                            database (:mod:`.clock`); ``off`` for a file
                                            system that stamps no modification times
==========================================  =============================================

Any other parameter is a ``BadRequest``, naming it and the accepted ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from agentrooms.errors import BadRequest
from agentrooms.store.params import check_names, seconds

MEMORY = ":memory:"
SYNCHRONOUS = ("FULL", "EXTRA", "NORMAL")
DEFAULT_BUSY_TIMEOUT_MS = 5000
DEFAULT_TIMEOUT = 30.0  # seconds a call retries a locked database
DEFAULT_CONNECT_TIMEOUT = 30.0  # ... and opening does
DEFAULT_MAX_CLOCK_SKEW = 1.0  # seconds off the file system's clock a process may be
PARAMETERS = ("synchronous", "busy_timeout_ms", "timeout", "connect_timeout", "max_clock_skew")


@dataclass(frozen=True, slots=True)
class SqliteConfig:
    path: str  # a file path, or ":memory:"
    synchronous: str = "FULL"
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    max_clock_skew: float | None = DEFAULT_MAX_CLOCK_SKEW  # None: not checked

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
    check_names("sqlite", options, PARAMETERS)
    synchronous = options.get("synchronous", "FULL").upper()
    if synchronous not in SYNCHRONOUS:
        raise BadRequest(
            f"synchronous must be one of {', '.join(SYNCHRONOUS)}, not {synchronous!r}"
        )
    busy = options.get("busy_timeout_ms", str(DEFAULT_BUSY_TIMEOUT_MS))
    if not (busy.isascii() and busy.isdigit()):
        raise BadRequest(f"busy_timeout_ms must be a whole number of milliseconds: {busy!r}")
    call_timeout = seconds(options, "timeout", DEFAULT_TIMEOUT)
    connect_timeout = seconds(options, "connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    max_skew: float | None = None
    if options.get("max_clock_skew", "").lower() != "off":
        max_skew = seconds(options, "max_clock_skew", DEFAULT_MAX_CLOCK_SKEW)
    return SqliteConfig(
        path or MEMORY, synchronous, int(busy), call_timeout, connect_timeout, max_skew
    )
