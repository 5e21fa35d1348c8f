"""Cold start of ``agentrooms mcp``: spawn to the answer of ``initialize``, over stdio.

An MCP host spawns its servers once per session, so this is the wait a user sees. Each
round spawns, alternately, the MCP SDK's own minimal stdio server (one tool, nothing
else) and ``agentrooms mcp`` on an embedded SQLite store of this run, writes one
``initialize`` request and times until its answer is read. Reported: the median and
range of each, and the ratio of the medians (issue 27's goal: at most 1.5).

    python3 dev.py bench coldstart [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine, ms

MINIMAL = '''
from mcp.server.mcpserver import MCPServer

app = MCPServer("minimal")


@app.tool()
def echo(text: str) -> str:
    """Echo the text."""
    return text


app.run()
'''

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench-coldstart", "version": "0"},
    },
}


def initialize(command: list[str]) -> float:
    """Seconds from spawning ``command`` to reading its answer to ``initialize``."""
    t0 = time.perf_counter()
    child = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write((json.dumps(INITIALIZE) + "\n").encode())
    child.stdin.flush()
    line = child.stdout.readline()
    elapsed = time.perf_counter() - t0
    child.stdin.close()
    child.wait(timeout=30)
    answer = json.loads(line)
    if "result" not in answer:
        raise SystemExit(f"{command[0]} answered initialize with {line!r}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        minimal = Path(tmp) / "minimal.py"
        minimal.write_text(MINIMAL)
        arms = {
            "MCP SDK minimal server": [sys.executable, str(minimal)],
            "agentrooms mcp": [
                sys.executable,
                "-m",
                "agentrooms",
                "mcp",
                "--agent",
                "bench",
                "--url",
                f"sqlite:///{tmp}/bench.db",
            ],
        }
        for command in arms.values():  # warm the file cache and the store's schema
            initialize(command)
        times: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, command in arms.items():
                times[name].append(initialize(command))
    print(machine())
    print(f"{args.rounds} rounds, spawn to the answer of initialize over stdio\n")
    print(f"{'server':<26}{'median ms':>12}{'min':>10}{'max':>10}")
    for name, values in times.items():
        print(
            f"{name:<26}{ms(statistics.median(values)):>12}"
            f"{ms(min(values)):>10}{ms(max(values)):>10}"
        )
    base, ours = (statistics.median(v) for v in times.values())
    print(f"\nagentrooms mcp / minimal: {ours / base:.2f}x (goal: at most 1.50x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
