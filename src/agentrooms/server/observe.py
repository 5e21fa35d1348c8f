"""What the server says about each request: a request id, one log line, and its metrics.

:class:`Observe` (a pure ASGI middleware, outermost in the app) gives every HTTP request
a request id: the client's ``X-Request-Id`` if it is 1 to 128 printable ASCII characters
without spaces, else a new one; the response carries it back in ``X-Request-Id``. When
the request ends it counts it in :class:`~agentrooms.metrics.OperatorMetrics` by route
*template* and status class, and logs one line on ``agentrooms.access``: ``INFO``, or
``ERROR`` for a ``5xx``. An exception that escapes the app is logged with its traceback
and answered ``500 internal_error`` here, within the request (the same answer
:mod:`.envelope` gives).

Every log line written while a request runs (the request line, an unexpected error, an
MCP tool's error) carries that request's id, agent (once the token is known), room
(the path's ``{room}``) and error type (the envelope's ``type`` once an error answer is
made, or the exception's class): :class:`JsonFormatter` reads them from
:data:`current`. ``agentrooms serve --log-format json`` installs it for every logger
(:func:`configure_json_logging`): one JSON object per line on stderr.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrooms.metrics import operator_metrics

__all__ = [
    "LOG_FORMATS",
    "REQUEST_ID",
    "JsonFormatter",
    "Observe",
    "RequestContext",
    "Templates",
    "configure_json_logging",
    "current",
    "note_error",
]

REQUEST_ID = "X-Request-Id"
LOG_FORMATS = ("text", "json")
_CLIENT_ID = re.compile(r"[!-~]{1,128}")
_PRINCIPAL = "agentrooms.principal"  # the gate's scope key (gate.PRINCIPAL)
access_log = logging.getLogger("agentrooms.access")


@dataclass(slots=True)
class RequestContext:
    """One request, as its log lines describe it (mutable: filled in as it is known)."""

    request_id: str
    scope: Scope
    room: str | None = None
    error_type: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def agent(self) -> str | None:
        principal = self.scope.get(_PRINCIPAL)
        agent = getattr(principal, "agent", None)
        return agent if isinstance(agent, str) else None


current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "agentrooms_request", default=None
)


def note_error(kind: str) -> None:
    """Record the error type the current request is answered with (no request: nothing)."""
    context = current.get()
    if context is not None:
        context.error_type = kind


class Templates:
    """The app's route templates, matched against a request's path: the paths of its
    OpenAPI document (``/v1/rooms/{room}/tasks/{task}``) and its other routes and mounts
    (``/openapi.json``, ``/mcp``). Built on first use (every route is in by then);
    a template with fewer parameters wins (``.../tasks/claim-next`` over
    ``.../tasks/{task}``)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._extra: set[str] = set()
        self._table: list[tuple[re.Pattern[str], str]] | None = None

    def add(self, path: str) -> None:
        """Match ``path`` exactly as a template of its own (an endpoint served ahead of
        the app's routes, such as MCP's); before the first request."""
        if self._table is not None:
            raise RuntimeError("templates are added before the first request")
        self._extra.add(path)

    def _build(self) -> list[tuple[re.Pattern[str], str]]:
        paths = set(self.app.openapi().get("paths", {})) | self._extra
        mounts: set[str] = set()
        for route in self.app.router.routes:
            if isinstance(route, Mount):
                mounts.add(route.path)
            elif isinstance(route, Route):
                paths.add(route.path)
        table = [(_pattern(p, mount=False), p) for p in paths]
        table += [(_pattern(m, mount=True), m) for m in mounts]
        table.sort(key=lambda entry: (entry[1].count("{"), -len(entry[1])))
        return table

    def match(self, path: str) -> tuple[str | None, str | None]:
        """The template serving ``path`` and its ``{room}`` (``None`` for either when
        there is none)."""
        if self._table is None:
            self._table = self._build()
        for pattern, template in self._table:
            found = pattern.fullmatch(path)
            if found is not None:
                return template, found.groupdict().get("room")
        return None, None


def _pattern(template: str, *, mount: bool) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", template)
    regex = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts)
    )
    return re.compile(regex + ("(?:/.*)?" if mount else ""))


class Observe:
    """Request ids, the request log line and the request metrics (see the module)."""

    def __init__(self, app: ASGIApp, *, templates: Templates) -> None:
        self.app, self.templates = app, templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        given = _header(scope, b"x-request-id")
        request_id = given if given and _CLIENT_ID.fullmatch(given) else uuid.uuid4().hex
        template, room = self.templates.match(scope["path"])
        context = RequestContext(request_id, scope, room)
        token = current.set(context)
        status, started = 500, False

        async def observed(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = int(message["status"]), True
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, observed)
        except Exception as exc:
            # answered here, inside the request's context, so that the error line has
            # its request id and the 500 its X-Request-Id (the envelope module imports
            # this one)
            from agentrooms.server.envelope import unexpected

            response = unexpected(scope["method"], scope["path"], exc)
            if started:
                raise  # the answer is under way: the server can only cut it off
            await response(scope, receive, observed)
        finally:
            elapsed = time.monotonic() - start
            operator_metrics().request(scope["method"], template, status, elapsed)
            access_log.log(
                logging.ERROR if status >= 500 else logging.INFO,
                "%s %s %d",
                scope["method"],
                scope["path"],
                status,
                extra={
                    "http": {
                        "method": scope["method"],
                        "path": scope["path"],
                        "route": template,
                        "status": status,
                        "duration_ms": round(elapsed * 1000, 3),
                    }
                },
            )
            current.reset(token)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, then ``request_id``, ``agent``, ``room`` and ``error_type`` (``null``
    outside a request or where unknown), the request line's ``http`` fields, and a
    traceback as ``exception``. ASCII only; a newline in a message is escaped."""

    def format(self, record: logging.LogRecord) -> str:
        context = current.get()
        error_type = None if context is None else context.error_type
        if record.exc_info and record.exc_info[0] is not None and error_type is None:
            error_type = record.exc_info[0].__name__
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": None if context is None else context.request_id,
            "agent": None if context is None else context.agent,
            "room": None if context is None else context.room,
            "error_type": error_type,
        }
        http = getattr(record, "http", None)
        if isinstance(http, dict):
            line["http"] = http
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=True, default=str)


def configure_json_logging(level: int = logging.INFO) -> None:
    """Every logger's lines as :class:`JsonFormatter` objects on stderr (the root logger's
    only handler; uvicorn's loggers are left to propagate to it)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
