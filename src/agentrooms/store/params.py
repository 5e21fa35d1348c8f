"""URL query parameters shared by the backends: strict names, checked numbers.

Every backend accepts only the parameters it documents; :func:`check_names` makes any
other (a typo, a parameter of another backend) a ``BadRequest`` at open, naming it and
the accepted ones, instead of being ignored or sent to a server that refuses the
connection with an error callers would retry forever.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from agentrooms.errors import BadRequest


def check_names(backend: str, given: Iterable[str], accepted: Iterable[str]) -> None:
    """``BadRequest`` for the first name of ``given`` that is not ``accepted``."""
    known = list(accepted)
    for name in given:
        if name not in known:
            shown = ", ".join(known) if known else "none"
            raise BadRequest(f"unknown {backend} URL parameter {name!r}; accepted: {shown}")


def seconds(options: Mapping[str, str], name: str, default: float) -> float:
    """The parameter ``name`` as a positive, finite number of seconds (``default`` when
    absent); ``BadRequest`` for anything else."""
    text = options.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise BadRequest(f"{name} must be a positive number of seconds, not {text!r}")
    return value
