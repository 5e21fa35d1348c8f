"""Where PostgreSQL's errors and session settings meet the store contract: driver
errors become ``BadRequest`` or ``StoreUnavailable`` (:func:`driver_errors`), and a session
the store cannot work in is refused at open (:func:`check_session`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import asyncpg

from agentrooms.errors import BadRequest, StoreUnavailable
from agentrooms.store.postgres.config import PostgresConfig

_WRONG_SESSION = "AR001"  # transact() refused the session's isolation level

_UNAVAILABLE = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


@contextlib.contextmanager
def driver_errors(what: str) -> Iterator[None]:
    """The one seam where driver errors become ours (:func:`translate`), the original
    chained."""
    try:
        yield
    except Exception as exc:
        ours = translate(exc, what)
        if ours is None:
            raise
        raise ours from exc


def translate(exc: Exception, what: str) -> Exception | None:
    """The store's error for driver error ``exc`` raised by ``what``; ``None`` for an
    error that is not the driver's (it propagates as it is).

    A data exception (SQLSTATE class 22, or an argument the driver cannot encode, such
    as a lone surrogate in a JSON string) is the caller's input: ``BadRequest``, and the
    statement failed, so nothing was written; so is ``transact()``'s refusal of a session
    at the wrong isolation level (a misconfiguration, not worth retrying). Anything else
    is ``StoreUnavailable``.
    """
    if isinstance(exc, asyncpg.exceptions.DataError):
        return BadRequest(f"PostgreSQL rejected the input of {what}: {exc}")
    if isinstance(exc, asyncpg.PostgresError):
        if exc.sqlstate == _WRONG_SESSION:
            return BadRequest(f"PostgreSQL {what}: {exc}")
        return StoreUnavailable(f"PostgreSQL {what} failed: {type(exc).__name__}: {exc}")
    if isinstance(exc, asyncpg.ClientConfigurationError):
        return BadRequest(f"bad PostgreSQL connection settings: {exc}")
    if isinstance(exc, TimeoutError):
        return StoreUnavailable(
            f"PostgreSQL {what} timed out ({str(exc) or 'no reply within the timeout'}; the URL's "
            "timeout and connect_timeout set the bounds): the outcome of a write is unknown"
        )
    if isinstance(exc, _UNAVAILABLE):
        return StoreUnavailable(f"PostgreSQL {what} failed: {type(exc).__name__}: {exc}")
    return None


def check_session(config: PostgresConfig, schema: str | None, isolation: str) -> None:
    """The open check: ``BadRequest`` unless the session is as the store needs it."""
    if isolation != "read committed":
        raise BadRequest(
            f"the PostgreSQL session's transaction_isolation is {isolation!r}, not 'read "
            "committed', which transact needs: set default_transaction_isolation to 'read "
            "committed' for the server, database or role (or in the pooler's connect_query)"
        )
    if config.pooler is None and schema != config.schema:
        raise BadRequest(
            f"the PostgreSQL session's current_schema() is {schema!r}, not the store's "
            f"{config.schema!r}: the startup settings were dropped on the way (a connection "
            "pooler?); behind a pooler, add pooler=transaction or pooler=session to the URL"
        )
