"""Strict tool arguments, and one set of size limits whatever the transport.

The SDK builds each tool's argument model from the function's signature, laxly: an
unknown argument is dropped (``claim_task {"taskId": "k2"}`` claims the next ready task),
``"1"`` passes for an integer and ``"yes"`` for a boolean, and a string that holds JSON
is parsed before validation (a document value ``'{"a": 1}'`` is stored as an object).
:func:`strict_tool` registers a tool whose model forbids unknown arguments (also inside
nested objects), validates in strict mode (a JSON string is a string, a number a number)
and parses nothing out of strings.

Sizes are checked on the arguments themselves, before the tool runs, so stdio and HTTP
answer the same call alike (:func:`check_call`); the numbers come from the server's
:class:`~agentrooms.server.limits.HttpLimits`:

* the arguments of one call, as compact JSON, at most :func:`call_limit` bytes: the body
  limit less a sixteenth, left for the JSON-RPC envelope, so that a call under this limit
  always fits in an HTTP request;
* inside them the HTTP API's JSON rules: every string at most ``max_string_bytes``,
  nesting at most ``max_json_depth``, at most ``max_items`` per array or object.

Each schema states its limits: ``maxLength``, ``maximum``/``minimum`` and ``maxItems``
on the typed arguments, and for a free JSON value (which a schema cannot bound) its
description (:func:`publish_limits`). The tool list is read into every model's context,
so it is published compactly (:func:`compact`): no ``title``, no docstring indentation,
an optional argument as its own type (not ``anyOf`` with ``null``, no ``default: null``:
omit it), a free JSON value as a description without the ``$ref`` to an empty schema,
a name's or request id's ``pattern`` left out (its ``maxLength`` stays; the server
still applies the pattern, and a name that breaks it is refused naming the rule), and
the ``maximum`` of a sequence number, version or fence (the largest JSON safe integer).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp_types import ToolAnnotations
from pydantic import ConfigDict

from agentrooms.errors import BadRequest
from agentrooms.server.limits import HttpLimits, _check_shape
from agentrooms.server.mcp.hints import Hint
from agentrooms.server.models import DOC_PATTERN, MAX_INT, NAME_PATTERN, PARTITION

REQUEST_ID_PATTERN = r"^[!-~]{1,64}$"

__all__ = [
    "body_too_large",
    "call_limit",
    "check_call",
    "compact",
    "publish_limits",
    "strict_tool",
    "untitled",
]

_JSON_VALUE = "#/$defs/JsonValue"
_UNPUBLISHED = frozenset({NAME_PATTERN, DOC_PATTERN, PARTITION, REQUEST_ID_PATTERN})


class _StrictArguments(FuncMetadata):
    """The SDK's metadata, minus its lenience: strings are not parsed as JSON."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        return data


def strict_tool(fn: Callable[..., Any], annotations: ToolAnnotations, limits: HttpLimits) -> Tool:
    """The tool for ``fn`` (unstructured output), with strict arguments and a schema that
    forbids unknown ones and states every limit."""
    tool = Tool.from_function(fn, annotations=annotations, structured_output=False)
    lax = tool.fn_metadata.arg_model
    config = ConfigDict(extra="forbid", strict=True)
    namespace = {"model_config": config, "__module__": lax.__module__}
    strict = cast(type[ArgModelBase], type(lax.__name__, (lax,), namespace))
    schema = compact(untitled(publish_limits(strict.model_json_schema(by_alias=True), limits)))
    description = " ".join((tool.description or "").split())
    return tool.model_copy(
        update={
            "fn_metadata": _StrictArguments(arg_model=strict),
            "parameters": schema,
            "description": description,
        }
    )


def untitled(node: Any) -> Any:
    """``node`` without the ``title`` of each schema (pydantic's, derived from the name
    beside it: it costs a model's context and says nothing); a property named ``title``
    stays."""
    if isinstance(node, dict):
        return {
            k: untitled(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))
        }
    if isinstance(node, list):
        return [untitled(v) for v in node]
    return node


def compact(node: Any) -> Any:
    """``node`` as published: an optional ``X`` (``anyOf [X, null]``) as ``X``, without
    ``default: null``, and a free JSON value without its ``$ref`` (an empty schema
    accepts any value; its description says what it is). What the server accepts is
    unchanged: validation uses the argument model, not the published schema."""
    if isinstance(node, list):
        return [compact(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    options = out.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        del out["anyOf"]
        out = {**next(o for o in options if o != {"type": "null"}), **out}
    if "default" in out and out["default"] is None:
        del out["default"]
    if out.get("$ref") == _JSON_VALUE:
        del out["$ref"]
    if out.get("pattern") in _UNPUBLISHED:
        del out["pattern"]
    if out.get("type") == "integer" and out.get("maximum") == MAX_INT:
        del out["maximum"]  # the JSON safe integer: any counter a model sees fits
    defs = out.get("$defs")
    if isinstance(defs, dict) and "JsonValue" in defs:
        # a model's docstring says nothing the argument's own description does not
        defs = {
            k: {n: d for n, d in v.items() if n != "description"}
            for k, v in defs.items()
            if k != "JsonValue"
        }
        if defs:
            out["$defs"] = defs
        else:
            del out["$defs"]
    return {k: compact(v) if k != "default" else v for k, v in out.items()}


def call_limit(limits: HttpLimits) -> int:
    """Bytes of compact JSON the arguments of one call may take."""
    return limits.max_body_bytes - limits.max_body_bytes // 16


def publish_limits(schema: dict[str, Any], limits: HttpLimits) -> dict[str, Any]:
    """``schema`` with the size limits added to the description of each free JSON value."""
    note = (
        f"call <= {call_limit(limits)} B, strings <= {limits.max_string_bytes} B, "
        f"depth <= {limits.max_json_depth}"
    )

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("$ref") == _JSON_VALUE:
                what = str(node.get("description", "JSON")).removesuffix(" (JSON)")
                node["description"] = (
                    f"{what}; {note}" if what == "JSON" else f"{what} (JSON; {note})"
                )
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


def check_call(tool: str, arguments: dict[str, Any], limits: HttpLimits) -> Hint | None:
    """The typed refusal of a call whose arguments are over a size limit, else ``None``."""
    try:
        text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:  # only an in-process caller can pass non-JSON
        return Hint("bad_request", f"the arguments are not JSON ({exc})", "pass JSON values")
    size = len(text.encode("utf-8", "surrogatepass"))
    limit = call_limit(limits)
    if size > limit:
        return Hint(
            "payload_too_large",
            f"the arguments of this {tool} call are {size} bytes of JSON, over the "
            f"{limit}-byte limit of one call",
            _SEND_LESS,
            {"size": size, "limit": limit},
        )
    for name, value in arguments.items():
        try:
            _check_shape({name: value}, limits)  # nested as in an HTTP body
        except BadRequest as exc:
            return Hint(
                exc.code,
                f"argument {name} of {tool}: {exc}",
                "make it fit (a long text or list can be split over several documents or "
                "events) and call again",
                {"argument": name},
            )
    return None


_SEND_LESS = (
    "send less in one call: split a large value over several documents or events, or "
    "add tasks in smaller batches"
)


def body_too_large(limits: HttpLimits) -> Hint:
    """An HTTP request over the body limit (read no further, so its size is unknown)."""
    return Hint(
        "payload_too_large",
        f"the request is over the {limits.max_body_bytes}-byte body limit (the arguments "
        f"of one call may take at most {call_limit(limits)} bytes of JSON)",
        _SEND_LESS,
        {"limit": call_limit(limits), "max_body_bytes": limits.max_body_bytes},
    )
