"""Path patterns: parsing, and overlap decided exactly (a property test against an
independent matcher on small alphabets)."""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrooms.errors import BadRequest
from agentrooms.rooms import globs


def oracle(pattern: str, path: str) -> bool:
    """Whether ``path`` matches ``pattern``: fnmatch per segment, recursion for ``**``."""
    p, s = pattern.split("/"), path.split("/")

    def go(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(s)
        if p[i] == "**":
            return any(go(i + 1, k) for k in range(j, len(s) + 1))
        return j < len(s) and fnmatch.fnmatchcase(s[j], p[i]) and go(i + 1, j + 1)

    return go(0, 0)


segment_pattern = (
    st.lists(st.sampled_from(["a", "b", "*", "?"]), min_size=1, max_size=3)
    .map("".join)
    .filter(lambda s: "**" not in s)
)
pattern = st.lists(st.one_of(segment_pattern, st.just("**")), min_size=1, max_size=4).map("/".join)
segment = st.lists(st.sampled_from("abx"), min_size=1, max_size=4).map("".join)
path = st.lists(segment, min_size=1, max_size=5).map("/".join)


def instance(draw: Callable[[st.SearchStrategy[Any]], Any], p: str) -> str:
    """A path that matches ``p``, its wildcards filled at random."""
    out: list[str] = []
    for seg in p.split("/"):
        if seg == "**":
            out += [draw(segment) for _ in range(draw(st.integers(0, 2)))]
            continue
        chars = [
            draw(st.sampled_from("abx"))
            if c == "?"
            else draw(st.text("abx", max_size=2))
            if c == "*"
            else c
            for c in seg
        ]
        out.append("".join(chars) or "x")
    return "/".join(out) or "x"


@settings(max_examples=400, deadline=None)
@given(st.data(), pattern, pattern)
def test_overlap_iff_some_path_matches_both(data: st.DataObject, p: str, q: str) -> None:
    found = globs.witness(p, q)
    if found is not None:
        assert oracle(p, found) and oracle(q, found), (p, q, found)
        assert globs.overlap(q, p)
    else:
        # nothing matches both: neither paths drawn freely nor instances of either one
        for candidate in [data.draw(path), instance(data.draw, p), instance(data.draw, q)]:
            assert not (oracle(p, candidate) and oracle(q, candidate)), (p, q, candidate)


def test_overlap_is_exact_on_every_small_pattern_pair() -> None:
    """Exhaustive over patterns of up to two segments of one token, against every path
    of up to three segments of one or two letters."""
    tokens = ["a", "b", "*", "?", "**", "a*", "*b"]
    patterns = ["/".join(t) for n in (1, 2) for t in itertools.product(tokens, repeat=n)]
    segs = ["a", "b", "ab", "ba", "aa"]
    paths = ["/".join(t) for n in (1, 2, 3) for t in itertools.product(segs, repeat=n)]
    for p, q in itertools.product(patterns, repeat=2):
        brute = any(oracle(p, s) and oracle(q, s) for s in paths)
        assert globs.overlap(p, q) == brute, (p, q)


@pytest.mark.parametrize(
    ("p", "q", "expected"),
    [
        ("src/**", "src/a.py", True),
        ("src/*.py", "docs/*.md", False),
        ("src/*.py", "src/**/x.py", True),  # src/x.py
        ("src/*.py", "src/*/x.py", False),
        ("src/*.md", "src/**/x.py", False),
        ("**", "anything/at/all", True),
        ("a/b.py", "a/b.py", True),
        ("a/b.py", "a/c.py", False),
        ("*.py", "src/a.py", False),
    ],
)
def test_examples(p: str, q: str, expected: bool) -> None:
    assert globs.overlap(p, q) is expected


def test_literal_prefix_and_matches() -> None:
    assert globs.literal_prefix(globs.parse("src/a/*.py")) == ("src", "a")
    assert globs.literal_prefix(globs.parse("**/x")) == ()
    assert globs.matches("src/**", "src/a/b.py") and not globs.matches("src/*", "src/a/b")
    with pytest.raises(BadRequest):
        globs.matches("src/**", "src/*.py")


@pytest.mark.parametrize("bad", ["[ab]", "{a,b}", "a\\b", "/a", "a/", "a//b", ".", "a/../b", "a**"])
def test_unsupported_syntax_is_refused(bad: str) -> None:
    with pytest.raises(BadRequest):
        globs.parse(bad)
