"""MkDocs hooks of the docs site: pages made from the repository at build time.

- ``benchmarks.md`` is ``BENCHMARKS.md`` at the repository root (its ``docs/`` links
  rewritten to the site's), so the benchmarks have one source;
- ``http-api.md`` is made from the HTTP API's OpenAPI document, and the document itself
  is published as ``openapi.json``, so the API reference cannot drift from the routes;
- a page's link to ``../BENCHMARKS.md`` points at ``benchmarks.md``.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("get", "post", "put", "patch", "delete")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    benchmarks = (ROOT / "BENCHMARKS.md").read_text()
    benchmarks = re.sub(r"\]\(docs/", "](", benchmarks)
    files.append(File.generated(config, "benchmarks.md", content=benchmarks))
    document = asyncio.run(_openapi())
    files.append(File.generated(config, "openapi.json", content=json.dumps(document, indent=1)))
    files.append(File.generated(config, "http-api.md", content=_http_page(document)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return markdown.replace("](../BENCHMARKS.md", "](benchmarks.md")


async def _openapi() -> dict[str, Any]:
    from agentrooms.server import AuthConfig, HttpLimits
    from agentrooms.server.app import create_app
    from agentrooms.store import open_store

    store = await open_store("memory://")
    try:
        app = create_app(store, auth=AuthConfig(), limits=HttpLimits())
        return app.openapi()
    finally:
        await store.close()


def _http_page(document: dict[str, Any]) -> str:
    """The operations of ``document`` grouped by tag, each with its parameters, body and
    answers."""
    groups: dict[str, list[str]] = {}
    for path, item in document["paths"].items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            tag = (op.get("tags") or ["other"])[0]
            groups.setdefault(tag, []).append(_operation(method, path, op))
    lines = [
        "# The HTTP API",
        "",
        f"agentrooms {document['info']['version']}. Generated from the server's OpenAPI "
        "document, which every server also answers at `/openapi.json` "
        "([download](openapi.json)); use it with any OpenAPI viewer or client generator. "
        "Every route but `/healthz`, `/readyz` and `/metrics` needs "
        "`Authorization: Bearer <token>` (or `X-Agent` under `serve --dev`); errors are "
        'the envelope `{"error": {"type", "message", ...}}` '
        "([surfaces](surfaces.md)).",
        "",
    ]
    for tag, operations in groups.items():
        lines += [f"## {tag}", "", *operations]
    return "\n".join(lines)


def _operation(method: str, path: str, op: dict[str, Any]) -> str:
    out = [f"### `{method.upper()} {path}`", "", op.get("summary", ""), ""]
    description = op.get("description", "").strip()
    if description:
        out += [description.replace("``", "`"), ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | type | required |", "|---|---|---|---|"]
        for p in params:
            kind = _type(p.get("schema", {}))
            out.append(f"| `{p['name']}` | {p['in']} | {kind} | {p.get('required', False)} |")
        out.append("")
    body = op.get("requestBody", {}).get("content", {}).get("application/json")
    if body:
        out += [f"Body: {_type(body.get('schema', {}))}", ""]
    answers = [
        f"`{code}` {answer.get('description', '')}"
        for code, answer in sorted(op.get("responses", {}).items())
    ]
    out += ["Answers: " + "; ".join(answers), ""]
    return "\n".join(out)


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list of {_type(schema.get('items', {}))}"
    return f"`{schema.get('type', 'any')}`"
