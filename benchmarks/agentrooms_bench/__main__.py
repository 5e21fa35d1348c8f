"""``python -m agentrooms_bench``: the same command as ``agentrooms bench``."""

from agentrooms_bench.cli import main

main()
