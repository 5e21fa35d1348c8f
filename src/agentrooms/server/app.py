"""The application factory: one stateless FastAPI app over one store.

Everything lives in the store; the only process state is the per-agent rate buckets and
a cache of token hashes (both only ever make a request *cheaper* to refuse), so any
number of processes can serve one store.

Besides ``/v1`` the app answers ``/healthz`` (the process is up), ``/readyz`` (the store
answers a read within ``READY_TIMEOUT``, else 503), ``/metrics`` (Prometheus text:
the default registry, which holds the commit loop's error counters, the HTTP error
counter and :class:`~agentrooms.metrics.OperatorMetrics`), ``/openapi.json`` and the
operator dashboard at ``/ui`` (:mod:`.ui`). Every answer carries an ``X-Request-Id`` and
is logged and counted (:mod:`.observe`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.responses import Response

from agentrooms import __version__
from agentrooms.errors import AgentroomsError, StoreUnavailable
from agentrooms.metrics import default_metrics
from agentrooms.rooms import Rooms
from agentrooms.rooms.keys import REGISTRY as ROOM_REGISTRY
from agentrooms.server import ui
from agentrooms.server.auth import AuthConfig
from agentrooms.server.envelope import error_response, install_handlers
from agentrooms.server.gate import Gate
from agentrooms.server.limits import HttpLimits
from agentrooms.server.models import Status
from agentrooms.server.observe import Observe, Templates
from agentrooms.server.routes import docs, events, locks, paths, presence, rooms, tasks, tokens
from agentrooms.server.routes import errors as error_responses
from agentrooms.server.routes import ops as operator
from agentrooms.store.base import Store

__all__ = ["READY_TIMEOUT", "create_app"]

READY_TIMEOUT = 2.0
_DESCRIPTION = """Shared state for teams of agents: rooms with a plan of tasks (leases and
fencing tokens), versioned documents, an event log read through per-agent cursors,
presence and locks.

Every error is `{"error": {"type", "message", "details"}}` with the status of its type.
Reads of documents and tasks carry a strong `ETag`; document writes need `If-Match`
(or `If-None-Match: *`). Commands take an `Idempotency-Key`."""


def create_app(store: Store, *, auth: AuthConfig, limits: HttpLimits) -> FastAPI:
    """The HTTP API over ``store`` (which the caller opens and closes). A path with a
    trailing slash is a 404, never a redirect. :func:`agentrooms.server.serve` also puts
    :class:`~agentrooms.server.perimeter.Perimeter` around it."""
    app = FastAPI(
        title="agentrooms",
        version=__version__,
        description=_DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        redirect_slashes=False,
    )
    app.state.store = store
    app.state.rooms = Rooms(store)
    app.state.limits = limits
    app.state.auth = auth
    default_metrics()  # register the commit loop's counters with the default registry
    install_handlers(app)
    for module in (rooms, tasks, docs, events, presence, locks, paths, operator, tokens):
        app.include_router(module.router, prefix="/v1")
    app.include_router(ui.tickets, prefix="/v1")
    app.include_router(ui.pages)
    _operations(app, store)
    app.add_middleware(Gate, store=store, auth=auth, limits=limits)
    app.state.templates = Templates(app)  # mount_mcp adds /mcp to it
    app.add_middleware(Observe, templates=app.state.templates)  # outermost: sees every answer
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _operations(app: FastAPI, store: Store) -> None:
    @app.get("/healthz", tags=["operations"], summary="The process is up")
    async def healthz() -> Status:
        return Status(status="ok")

    @app.get(
        "/readyz",
        tags=["operations"],
        summary="The store answers a read",
        response_model=Status,
        responses=error_responses(503),
    )
    async def readyz() -> Status | Response:
        try:
            await asyncio.wait_for(store.read(ROOM_REGISTRY, []), READY_TIMEOUT)
        except (AgentroomsError, TimeoutError, OSError) as exc:
            return error_response(StoreUnavailable(f"the store did not answer a read: {exc!r}"))
        return Status(status="ready")

    @app.get(
        "/metrics",
        tags=["operations"],
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with its 422 validation response replaced by our 400, integer
    bounds written as integers, and ``If-Match`` required where its absence is 428 (a
    document write, which may instead send ``If-None-Match: *``, says so)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    envelope_ref = {"$ref": "#/components/schemas/ErrorEnvelope"}
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            responses = operation.get("responses", {})
            for status, response in responses.items():
                if status[0] in "45" and "ErrorEnvelope" in str(response.get("content")):
                    # errors are JSON even where the route streams (FastAPI uses its type)
                    response["content"] = {"application/json": {"schema": envelope_ref}}
            _preconditions(operation)
            if "HTTPValidationError" not in str(responses.get("422")):
                continue
            del responses["422"]
            if "400" not in responses:
                responses["400"] = {
                    "description": "the request is malformed (bad_request)",
                    "content": {"application/json": {"schema": envelope_ref}},
                }
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    _integer_bounds(schema)
    app.openapi_schema = schema
    return schema


def _preconditions(operation: dict[str, Any]) -> None:
    if "428" not in operation.get("responses", {}):
        return
    headers = {p["name"]: p for p in operation.get("parameters", []) if p.get("in") == "header"}
    if "If-Match" not in headers:
        return
    if "If-None-Match" not in headers:
        headers["If-Match"]["required"] = True
        return
    for name in ("If-Match", "If-None-Match"):
        headers[name]["description"] = (
            headers[name].get("description", "")
            + " (one of If-Match or If-None-Match: * is required: 428 without either)"
        ).strip()


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _integer_bounds(node: Any) -> None:
    """Pydantic writes the bounds of an integer as floats (``9007199254740991.0``)."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for bound in _BOUNDS:
                value = node.get(bound)
                if isinstance(value, float) and value.is_integer():
                    node[bound] = int(value)
        for child in node.values():
            _integer_bounds(child)
    elif isinstance(node, list):
        for child in node:
            _integer_bounds(child)
