"""``python -m agentrooms.server.mcp stdio|http ...``: run the MCP server."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agentrooms.errors import AgentroomsError
from agentrooms.server.auth import AuthConfig
from agentrooms.server.limits import HttpLimits
from agentrooms.server.mcp.http import serve_mcp_http
from agentrooms.server.mcp.stdio import run_stdio


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m agentrooms.server.mcp")
    sub = parser.add_subparsers(dest="transport", required=True)
    stdio = sub.add_parser("stdio", help="serve one agent on stdin/stdout")
    stdio.add_argument("--store", required=True, help="store URL, e.g. sqlite:///team.db")
    stdio.add_argument("--agent", required=True, help="the agent every call acts as")
    stdio.add_argument("--rooms", help="comma-separated rooms it may enter (default: all)")
    stdio.add_argument("--profile", default="full", help="tool set: full or worker")
    stdio.add_argument("--role", help="the agent's role (its inbox, its writable partition)")
    http = sub.add_parser("http", help="serve streamable HTTP (stateless, bearer tokens)")
    http.add_argument("--store", required=True, help="store URL")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=int, default=8765)
    http.add_argument("--path", default="/mcp")
    http.add_argument("--dev", action="store_true", help="no tokens: X-Agent names the agent")
    http.add_argument("--json-response", action="store_true", help="JSON, not SSE (no push)")
    http.add_argument("--rate", type=float, default=50.0, help="calls/s per agent (0: off)")
    http.add_argument("--log-level", default="warning")
    http.add_argument("--profile", default="full", help="default tool set (?profile= overrides)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.transport == "stdio":
        rooms = None if args.rooms is None else [r for r in args.rooms.split(",") if r]
        run_stdio(args.store, args.agent, rooms=rooms, profile=args.profile, role=args.role)
        return 0
    limits = HttpLimits(rate=args.rate or None)
    try:
        serve_mcp_http(
            args.store,
            args.host,
            args.port,
            AuthConfig(dev=args.dev),
            limits,
            path=args.path,
            json_response=args.json_response,
            log_level=args.log_level,
            profile=args.profile,
        )
    except (ValueError, AgentroomsError) as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
