"""One SQLite connection and the transactions it runs: the blocking half of the backend.

The engine runs *batches* of operations (see :mod:`.worker`), one transaction each:

* a read batch in one deferred ``BEGIN`` ... ``COMMIT`` (one WAL snapshot);
* a write batch in one ``BEGIN IMMEDIATE`` ... ``COMMIT``: concurrent writers of one
  store share one commit (group commit: one WAL sync for the whole batch), and nothing
  is acknowledged before that commit returns. An operation that fails a compare has
  written nothing (operations check before they write; the engine verifies it with
  ``total_changes``), so it simply reports its conflict while the others commit; any
  other failure rolls the batch back and re-runs it without the failed operation.

After a write transaction commits, :meth:`Engine.take_appended` names the rooms whose
logs it appended to (the worker wakes their watchers); :meth:`Engine.foreign_seqs` is the
slow poll that notices other processes' commits (``PRAGMA data_version``).

``SQLITE_BUSY`` (another process holds the lock for longer than ``busy_timeout``) makes
the engine roll the batch back and run it again after a short jittered sleep, until
``retry_for`` seconds have passed; only then does it give up with ``StoreUnavailable``.
Nothing was acknowledged before a retry, so a retry cannot apply anything twice.

:func:`outcome_of` is the one seam where driver errors (``sqlite3.Error``, ``OSError``)
become :class:`~agentrooms.errors.StoreUnavailable`, with the cause chained.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from agentrooms.errors import AgentroomsError, ClockSkew, StoreUnavailable
from agentrooms.store.sqlite.clock import ClockCheck
from agentrooms.store.sqlite.config import SqliteConfig
from agentrooms.store.sqlite.operations import Operations
from agentrooms.store.sqlite.sql import migrate

T = TypeVar("T")
Job = Callable[[Operations], Any]
"""One store operation, run inside a transaction the engine opened."""

MIN_SQLITE = (3, 35, 0)  # UPDATE ... RETURNING, json_each
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_DRIVER_ERRORS = (sqlite3.Error, OSError)


def is_busy(exc: BaseException) -> bool:
    """Is ``exc`` SQLite's "database is locked" (worth retrying)?"""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _BUSY_CODES
    return "locked" in str(exc) or "busy" in str(exc)


def outcome_of(exc: Exception) -> Exception:
    """What a caller receives for ``exc``: driver errors become ``StoreUnavailable``
    (cause chained); agentrooms errors, and bugs, pass unchanged."""
    if isinstance(exc, _DRIVER_ERRORS):
        retried = " (still, after retrying)" if is_busy(exc) else ""
        error = StoreUnavailable(f"sqlite: {exc}{retried}")
        error.__cause__ = exc  # as ``raise ... from exc`` would; it is raised on another thread
        error.__suppress_context__ = True
        return error
    return exc


def _with_cause(error: Exception, cause: BaseException) -> Exception:
    error.__cause__ = cause  # as ``raise ... from`` would; it is raised on another thread
    error.__suppress_context__ = True
    return error


def backoff(attempt: int) -> float:
    """Seconds to sleep before retry ``attempt`` (1, 2, ...): about 1 ms doubling to a
    50 ms cap, each jittered by +-50% so that retrying processes spread out."""
    delay: float = min(0.05, 0.001 * 2 ** min(attempt - 1, 6))
    return delay * random.uniform(0.5, 1.5)


class _JobFailed(Exception):
    """Job ``position`` of the transaction failed with ``error``; roll everything back."""

    def __init__(self, position: int, error: Exception) -> None:
        super().__init__(position, error)
        self.position, self.error = position, error


class Engine:
    """The connection and its transactions; every method runs on the worker's thread."""

    def __init__(self, config: SqliteConfig, clock: Callable[[], float], retry_for: float) -> None:
        self.config = config
        self.retry_for = retry_for
        self._clock = clock
        # every process sharing a file checks its clock against the file system's
        self.clock_check: ClockCheck | None = None
        if not config.in_memory and config.max_clock_skew is not None:
            self.clock_check = ClockCheck(config.path, clock, config.max_clock_skew)
        self._conn: sqlite3.Connection | None = None
        self._ops: Operations | None = None
        self._appended: dict[str, int] = {}  # committed appends not yet taken
        # at start, then at the last foreign_seqs that read seqs: a change is a commit of
        # another connection since
        self._data_version: int | None = None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> Exception | None:
        """Connect, set WAL and the synchronous level, migrate. Returns the error that
        every later operation should fail with, or ``None``."""
        try:
            if sqlite3.sqlite_version_info < MIN_SQLITE:
                raise StoreUnavailable(
                    f"SQLite {sqlite3.sqlite_version} is too old; agentrooms needs "
                    f"{'.'.join(map(str, MIN_SQLITE))} or newer"
                )
            conn = self._connect()
            self._retrying(self._configure, self.config.connect_timeout)
            self._retrying(lambda: migrate(conn), self.config.connect_timeout)
            assert self._ops is not None
            self._data_version = self._ops.data_version()
        except Exception as exc:
            self.close()
            return outcome_of(exc)
        return None

    def _connect(self) -> sqlite3.Connection:
        if not self.config.in_memory:
            Path(self.config.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = conn = sqlite3.connect(
            self.config.path,
            timeout=self.config.busy_timeout_ms / 1000.0,
            isolation_level=None,  # we issue BEGIN / COMMIT ourselves
        )
        self._ops = Operations(conn, self._clock)
        return conn

    def _configure(self) -> None:
        conn = self._connection()
        if not self.config.in_memory:
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
        conn.execute(f"PRAGMA synchronous = {self.config.synchronous}")
        conn.execute("PRAGMA journal_size_limit = 67108864")  # trim the WAL file to 64 MiB

    def close(self) -> None:
        conn, self._conn, self._ops = self._conn, None, None
        if conn is None:
            return
        try:
            if conn.in_transaction:  # only after a crash of this thread's own code
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # closing anyway; nothing unacknowledged depends on it
        finally:
            conn.close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailable("the sqlite store is closed")
        return self._conn

    # -- batches --------------------------------------------------------------------

    def run(self, jobs: list[Job], write: bool) -> list[Any]:
        """Run ``jobs`` in one transaction, retrying it while the database is busy.

        Returns one outcome per job, in order: its result, or the exception its caller
        should receive (a failed compare, a compacted cursor, ``StoreUnavailable``).
        A job that fails otherwise (a driver error, a bug) aborts the transaction: it
        gets its error, and the others run again without it, so no job's outcome
        depends on another's failure.
        """
        refused = self._clock_refusal()
        if refused is not None:
            return [refused() for _ in jobs]
        outcomes: list[Any] = [None] * len(jobs)
        pending = list(range(len(jobs)))
        while pending:
            try:
                done = self._retrying(lambda: self._attempt([jobs[i] for i in pending], write))
            except _JobFailed as failed:
                outcomes[pending.pop(failed.position)] = outcome_of(failed.error)
                continue
            except Exception as exc:
                done = [outcome_of(exc) for _ in pending]
            for i, outcome in zip(pending, done, strict=True):
                outcomes[i] = outcome
            break
        return outcomes

    def _clock_refusal(self) -> Callable[[], Exception] | None:
        """What makes the error each job of a batch gets (a fresh one each) if this
        process's clock is off or cannot be checked (see :mod:`.clock`); ``None`` if it
        agrees or is not checked."""
        if self.clock_check is None:
            return None
        try:
            self.clock_check.check()
        except ClockSkew as exc:
            skew = exc
            return lambda: ClockSkew(str(skew), skew.offset, skew.tolerance)
        except OSError as exc:
            cause = exc
            message = (
                f"sqlite: could not compare this process's clock with the file system "
                f"holding {self.config.path}: {exc} (?max_clock_skew=off skips the check)"
            )
            return lambda: _with_cause(StoreUnavailable(message), cause)
        return None

    def _attempt(self, jobs: list[Job], write: bool) -> list[Any]:
        conn = self._connection()
        ops = self._ops
        assert ops is not None
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            if write:
                ops.begin_write()
            outcomes = [self._job(conn, ops, job, n) for n, job in enumerate(jobs)]
            if write:
                ops.end_write()
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        if write:
            self._appended.update(ops.appended())
        return outcomes

    # -- watch ----------------------------------------------------------------------

    def take_appended(self) -> dict[str, int]:
        """``room -> last sequence number`` of the appends committed (by this
        connection) since the last call."""
        appended, self._appended = self._appended, {}
        return appended

    def foreign_seqs(self, rooms: list[str]) -> dict[str, int] | None:
        """The last sequence number of each of ``rooms`` that has a log, if another
        connection (another process) has committed since the last time they were read;
        else ``None``. Cheap when nothing changed: one ``PRAGMA data_version``. Run
        outside any transaction; an error just leaves it to the next poll."""
        ops = self._ops
        if ops is None or not rooms:
            return None
        try:
            version = ops.data_version()  # before the seqs: a later commit changes it
            if version == self._data_version:
                return None
            seqs = ops.seqs(rooms)
        except sqlite3.Error:
            return None
        self._data_version = version
        return seqs

    @staticmethod
    def _job(conn: sqlite3.Connection, ops: Operations, job: Job, position: int) -> Any:
        """The job's result, or the AgentroomsError it raised having written nothing;
        any other error aborts the transaction (a busy one to retry it)."""
        changes = conn.total_changes
        try:
            return job(ops)
        except AgentroomsError as exc:
            if conn.total_changes == changes:
                return exc
            raise _JobFailed(position, exc) from exc  # it wrote first: roll it back
        except Exception as exc:
            if is_busy(exc):
                raise
            raise _JobFailed(position, exc) from exc

    def _rollback(self) -> None:
        conn = self._conn
        if conn is not None and conn.in_transaction:
            # SQLite may already have rolled back; the caller sees the first error
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    def _retrying(self, attempt: Callable[[], T], retry_for: float | None = None) -> T:
        """``attempt()``, again after a jittered sleep each time it raises a busy error,
        for at most ``retry_for`` seconds (default: the engine's); then the busy error
        propagates."""
        deadline = time.monotonic() + (self.retry_for if retry_for is None else retry_for)
        tries = 0
        while True:
            try:
                return attempt()
            except sqlite3.OperationalError as exc:
                tries += 1
                if not is_busy(exc) or time.monotonic() >= deadline:
                    raise
                self._rollback()
            time.sleep(backoff(tries))
