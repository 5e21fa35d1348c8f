"""The API's routes, one module per noun, each an ``APIRouter`` mounted under ``/v1``."""

from __future__ import annotations

from typing import Any

from agentrooms.server.envelope import ErrorEnvelope

__all__ = ["COMMON", "ETAG", "errors"]

_WHAT = {
    400: "the request is malformed or over a JSON limit (bad_request)",
    401: "missing, malformed, unknown, expired or revoked token (unauthorized)",
    403: "the token lacks a scope, or names another agent or partition (forbidden)",
    404: "no such room (or one the token may not enter), or no such resource (not_found)",
    409: "invalid transition, held lease or lock, stale fence, contention, existing room",
    410: "the log was trimmed past the position asked for (cursor_compacted)",
    412: "a precondition failed; details.current holds the current representation",
    413: "the body is over the size limit (payload_too_large)",
    422: "an Idempotency-Key was reused with another body (idempotency_mismatch)",
    428: "a write to a versioned resource without If-Match (precondition_required)",
    429: "the agent is over its request rate; see Retry-After (rate_limited)",
    503: "the store is unavailable; retry the same idempotent command (store_unavailable)",
}

COMMON = (400, 401, 403, 404, 413, 429, 503)

ETAG = {"ETag": {"description": 'the strong entity tag "<version>"', "schema": {"type": "string"}}}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for error statuses, all with the envelope."""
    return {s: {"model": ErrorEnvelope, "description": _WHAT[s]} for s in statuses}
