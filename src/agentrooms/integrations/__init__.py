"""Adapters that put agentrooms under frameworks agents are already built with.

Each lives in its own subpackage with its own extra (``agentrooms[langgraph]``), and none
is imported by ``import agentrooms``: the core install stays lean.
"""
