"""One JSON error body for every failure the HTTP surface answers::

    {"error": {"type": "<code>", "message": "...", "details": {...}}}

``type`` is the :class:`~agentrooms.errors.AgentroomsError` ``code`` and the status its
``http_status``, so a client tells errors apart exactly as a Python caller does. FastAPI's
and Starlette's own failures are mapped here too: a request that does not validate is
``400 bad_request`` (never 422, which is kept for ``idempotency_mismatch``), an unknown
route ``404 not_found``, a known route with another method ``405 method_not_allowed``
(``OPTIONS`` on a known route: ``204`` with the same ``Allow`` list). Each
error answered is counted in ``agentrooms_http_errors_total{type}``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, JsonValue
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Match

from agentrooms.errors import (
    AgentroomsError,
    BadRequest,
    RateLimited,
    RequestError,
    StoreUnavailable,
    Unauthorized,
)
from agentrooms.metrics import count_http_error, default_metrics
from agentrooms.server.observe import note_error

__all__ = [
    "ErrorBody",
    "ErrorEnvelope",
    "HeadersTooLarge",
    "MethodNotAllowed",
    "PreconditionRequired",
    "RequestTimeout",
    "envelope",
    "error_response",
    "install_handlers",
    "unexpected",
]

log = logging.getLogger("agentrooms.server")


class PreconditionRequired(RequestError):
    """A write to a versioned resource came without ``If-Match`` (RFC 6585: 428)."""

    code = "precondition_required"
    http_status = 428


class MethodNotAllowed(RequestError):
    code = "method_not_allowed"
    http_status = 405


class RequestTimeout(RequestError):
    """The client did not send its headers or its body within the server's deadline."""

    code = "request_timeout"
    http_status = 408


class HeadersTooLarge(RequestError):
    """The request line and headers are over the server's size limit (RFC 6585: 431)."""

    code = "headers_too_large"
    http_status = 431


class ErrorBody(BaseModel):
    type: str = Field(description="the error's code, e.g. version_conflict")
    message: str
    details: dict[str, JsonValue] = Field(default_factory=dict)


class ErrorEnvelope(BaseModel):
    error: ErrorBody


class _EnvelopeResponse(JSONResponse):
    """ASCII-only JSON: a message quoting odd input can never fail to encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False).encode()


def _json_safe(value: Any) -> Any:
    """``details`` as plain JSON (non-finite floats and unknown objects as strings)."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def envelope(
    status: int,
    kind: str,
    message: str,
    details: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    count_http_error(kind)
    note_error(kind)
    body = {"error": {"type": kind, "message": message, "details": _json_safe(details or {})}}
    return _EnvelopeResponse(body, status_code=status, headers=dict(headers or {}))


def error_response(
    exc: AgentroomsError,
    *,
    status: int | None = None,
    details: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """The envelope for ``exc`` (its ``http_status`` unless ``status`` is given)."""
    extra = dict(headers or {})
    if isinstance(exc, RateLimited):
        default_metrics().count("rate_limited")
        extra.setdefault("Retry-After", str(max(1, math.ceil(exc.retry_after))))
    elif isinstance(exc, Unauthorized):
        extra.setdefault("WWW-Authenticate", 'Bearer realm="agentrooms"')
    elif isinstance(exc, StoreUnavailable):
        extra.setdefault("Retry-After", "1")
    merged = {**exc.details(), **(details or {})}
    return envelope(status or exc.http_status, exc.code, str(exc), merged, extra)


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [
        {
            "loc": [str(part) for part in e.get("loc", ())],
            "msg": e.get("msg"),
            "type": e.get("type"),
        }
        for e in exc.errors()
    ]


async def _on_agentrooms_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, AgentroomsError)
    return error_response(exc)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = _validation_errors(exc)
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"])
    return error_response(
        BadRequest(f"{where}: {first['msg']}" if where else str(first["msg"])),
        details={"errors": errors},
    )


async def _on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
        return envelope(404, "not_found", message, headers=headers)
    if exc.status_code == 405:
        headers["Allow"] = ", ".join([*_allowed(request), "OPTIONS"])
        if request.method == "OPTIONS":  # the route exists: list what it serves
            return Response(status_code=204, headers=headers)
        message = f"{request.method} is not allowed on {request.url.path}"
        return error_response(MethodNotAllowed(message), headers=headers)
    if exc.status_code == 400:
        return error_response(BadRequest(str(exc.detail)), headers=headers)
    return envelope(exc.status_code, f"http_{exc.status_code}", str(exc.detail), headers=headers)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _allowed(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette names only the first)."""
    path = request.scope["path"]
    return [
        method
        for method in _METHODS
        if any(
            route.matches({"type": "http", "path": path, "method": method})[0] is Match.FULL
            for route in request.app.router.routes
        )
    ]


def unexpected(method: str, path: str, exc: BaseException) -> Response:
    """Log ``exc`` with its traceback and answer ``500 internal_error`` (no detail)."""
    log.exception("unexpected error on %s %s", method, path, exc_info=exc)
    return envelope(500, "internal_error", "internal error (logged on the server)")


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    return unexpected(request.method, request.url.path, exc)


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(AgentroomsError, _on_agentrooms_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(Exception, _on_unexpected)
