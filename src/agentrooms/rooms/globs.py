"""Path patterns for reservations: parsing, matching, and whether two patterns overlap.

A pattern is a ``/``-separated relative path whose segments are literal text, or hold
``*`` (any run of characters within one segment) and ``?`` (one character), or are
exactly ``**`` (any number of whole segments, zero included): ``src/**``, ``docs/*.md``,
``a/b.py``. Matching is case-sensitive and ``*`` matches a leading dot. Anything else
that reads like glob syntax (``[...]``, ``{...}``, ``\\``, ``**`` inside a segment) and
empty, ``.`` or ``..`` segments are refused with ``BadRequest``.

Two patterns *overlap* when some path matches both; :func:`witness` finds such a path
(one exists iff it returns one) by a product of the two patterns, segment by segment and,
within a segment, character by character, in time proportional to the product of their
sizes. Pure functions: no IO.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from agentrooms.errors import BadRequest

MAX_PATTERN = 512  # characters in one pattern
GLOBSTAR = "**"
_REFUSED = set("[]{}\\")
_FILL = "x"  # what a wildcard stands for in a witness when nothing else is asked


def parse(pattern: object) -> tuple[str, ...]:
    """The segments of a valid pattern; ``BadRequest`` naming what is wrong otherwise."""
    if not isinstance(pattern, str) or not pattern:
        raise BadRequest(f"a path pattern must be a non-empty string, got {pattern!r}")
    if len(pattern) > MAX_PATTERN:
        raise BadRequest(f"a path pattern is at most {MAX_PATTERN} characters")
    if bad := _REFUSED.intersection(pattern):
        raise BadRequest(
            f"path pattern {pattern!r} uses {''.join(sorted(bad))!r}: only literal text, "
            "'*', '?' and whole '**' segments are supported"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in pattern):
        raise BadRequest(f"path pattern {pattern!r} contains a control character")
    segments = tuple(pattern.split("/"))
    for segment in segments:
        if segment in ("", ".", ".."):
            raise BadRequest(
                f"path pattern {pattern!r} must be relative, with no empty, '.' or '..' segments"
            )
        if GLOBSTAR in segment and segment != GLOBSTAR:
            raise BadRequest(f"path pattern {pattern!r}: '**' must be a whole segment")
    return segments


def literal_prefix(segments: Sequence[str]) -> tuple[str, ...]:
    """The leading segments without a wildcard: every path a pattern matches starts
    with them, so two patterns can overlap only if one's prefix starts the other's."""
    out: list[str] = []
    for segment in segments:
        if "*" in segment or "?" in segment:
            break
        out.append(segment)
    return tuple(out)


def matches(pattern: str, path: str) -> bool:
    """Whether ``path`` (a literal relative path) matches ``pattern``."""
    return witness(pattern, _literal(path)) is not None


def overlap(p: str, q: str) -> bool:
    """Whether some path matches both patterns."""
    return witness(p, q) is not None


@functools.lru_cache(maxsize=65_536)
def witness(p: str, q: str) -> str | None:
    """A path that matches both patterns, ``None`` if there is none."""
    found = _segments(parse(p), parse(q))
    return None if found is None else "/".join(found)


def _literal(path: str) -> str:
    """``path`` as a pattern that matches only itself; ``BadRequest`` if it holds a
    character a pattern cannot escape."""
    if "*" in path or "?" in path:
        raise BadRequest(f"path {path!r} holds '*' or '?': pass it as a pattern")
    parse(path)
    return path


def _segments(a: tuple[str, ...], b: tuple[str, ...]) -> list[str] | None:
    @functools.cache
    def walk(i: int, j: int) -> tuple[str, ...] | None:
        if i == len(a) and j == len(b):
            return ()
        if i < len(a) and a[i] == GLOBSTAR and (rest := walk(i + 1, j)) is not None:
            return rest
        if j < len(b) and b[j] == GLOBSTAR and (rest := walk(i, j + 1)) is not None:
            return rest
        if i == len(a) or j == len(b) or a[i] == b[j] == GLOBSTAR:
            return None  # (two globstars: skipping either one was tried)
        if a[i] == GLOBSTAR:
            step, seg = (i, j + 1), _segment(b[j], b[j])
        elif b[j] == GLOBSTAR:
            step, seg = (i + 1, j), _segment(a[i], a[i])
        else:
            step, seg = (i + 1, j + 1), _segment(a[i], b[j])
        if seg is None or (rest := walk(*step)) is None:
            return None
        return (seg, *rest)

    found = walk(0, 0)
    return None if found is None else list(found)


def _segment(a: str, b: str) -> str | None:
    """A non-empty segment both segment patterns match, ``None`` if there is none."""

    @functools.cache
    def walk(i: int, j: int) -> str | None:
        if i == len(a) and j == len(b):
            return ""
        if i < len(a) and a[i] == "*" and (rest := walk(i + 1, j)) is not None:
            return rest
        if j < len(b) and b[j] == "*" and (rest := walk(i, j + 1)) is not None:
            return rest
        if i == len(a) or j == len(b) or a[i] == b[j] == "*":
            return None  # (two stars: skipping either one was tried)
        x, y = a[i], b[j]
        char = x if x not in "*?" else y if y not in "*?" else _FILL
        if x not in "*?" and y not in "*?" and x != y:
            return None
        rest = walk(i if x == "*" else i + 1, j if y == "*" else j + 1)
        return None if rest is None else char + rest

    found = walk(0, 0)
    if found == "":
        return _FILL  # only all-star segments match the empty string; they match any
    return found
