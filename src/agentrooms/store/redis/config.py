"""The Redis store's URL parameters and timeouts (the key prefix is in ``keys.py``)."""

from __future__ import annotations

import inspect
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis.asyncio.connection import SSLConnection

from agentrooms.errors import BadRequest
from agentrooms.store.params import check_names, seconds

DEFAULT_TIMEOUT = 5.0
"""Seconds a reply may take (and a dial, unless the URL says otherwise), unless the URL
gives ``timeout`` (or ``socket_timeout``)."""

SSL_PARAMETERS = tuple(
    name for name in inspect.signature(SSLConnection.__init__).parameters if name.startswith("ssl_")
)


PARAMETERS = (
    "prefix",
    "timeout",
    "connect_timeout",
    "socket_timeout",
    "socket_connect_timeout",
    "db",
    "username",
    "password",
    "client_name",
    "max_connections",
    "wait",
    "wait_timeout",
    *SSL_PARAMETERS,
)
"""The URL parameters a Redis store accepts (any other is a ``BadRequest`` at open):
ours, then redis-py's that agentrooms' connections apply (``ssl_*`` on ``rediss://``)."""


def timeouts(url: str) -> tuple[str, float, float]:
    """Check the URL's parameter names and take its timeouts off it: (the URL for
    redis-py, seconds a reply may take, seconds a dial may take). ``timeout`` and
    ``connect_timeout`` are also accepted as redis-py's ``socket_timeout`` and
    ``socket_connect_timeout``; the connect timeout defaults to the reply timeout."""
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    given = dict(params)
    check_names("redis", given, PARAMETERS)
    found: list[float | None] = []
    for ours, theirs in (
        ("timeout", "socket_timeout"),
        ("connect_timeout", "socket_connect_timeout"),
    ):
        if ours in given and theirs in given:
            raise BadRequest(f"give {ours} or {theirs} in a Redis URL, not both")
        name = ours if ours in given else theirs
        found.append(seconds(given, name, DEFAULT_TIMEOUT) if name in given else None)
    timeout = DEFAULT_TIMEOUT if found[0] is None else found[0]
    connect = timeout if found[1] is None else found[1]
    taken = {"timeout", "socket_timeout", "connect_timeout", "socket_connect_timeout"}
    taken |= {"wait", "wait_timeout"}
    rest = urlencode([(k, v) for k, v in params if k not in taken])
    return urlunsplit(parts._replace(query=rest)), timeout, connect


DEFAULT_WAIT_TIMEOUT_MS = 1000
"""Milliseconds a write waits for its replicas' acknowledgements (``wait_timeout``),
unless the URL says otherwise; never more than half the reply timeout."""


def replica_wait(url: str, timeout: float) -> tuple[int, int]:
    """``(replicas, ms)`` from the URL's ``wait`` and ``wait_timeout``: after each write
    the store sends ``WAIT replicas ms`` (:mod:`.durability`); ``(0, 0)`` without
    ``wait``. ``BadRequest`` for a negative or non-integer count, a non-positive
    timeout, or a timeout the reply deadline (``timeout``) would cut short."""
    given = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
    replicas = _whole(given, "wait", 0, 0)
    default = min(DEFAULT_WAIT_TIMEOUT_MS, max(1, int(timeout * 500)))
    ms = _whole(given, "wait_timeout", default, 1)
    if "wait_timeout" in given and "wait" not in given:
        raise BadRequest("wait_timeout is given without wait (the replicas to wait for)")
    if ms >= timeout * 1000:
        raise BadRequest(
            f"wait_timeout={ms} ms must be shorter than the reply timeout ({timeout:g} s)"
        )
    return replicas, (ms if replicas else 0)


def _whole(given: dict[str, str], name: str, default: int, least: int) -> int:
    text = given.get(name)
    if text is None:
        return default
    if not text.isdigit() or int(text) < least:
        raise BadRequest(f"{name} must be a whole number of at least {least}, not {text!r}")
    return int(text)
