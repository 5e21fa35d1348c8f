"""RFC 9110 conditional requests over record versions (pure functions).

A versioned resource's strong entity tag is its version in quotes: ``"17"``. Writes to a
document must say what they expect:

* ``If-Match: "17"`` writes only over version 17 (compared by the store in the write
  itself: the fast path, and the one an ``Idempotency-Key`` retry replays through);
* ``If-None-Match: *`` creates only if absent (compared by the store as well);
* anything else (several tags, ``If-Match: *``, ``If-None-Match`` with tags) is decided
  from a read of the current version, and the write is then conditional on exactly
  the version read, so it is just as atomic;
* no condition at all: ``428 precondition_required``.

``If-Match`` uses the strong comparison (a weak tag never matches), ``If-None-Match`` the
weak one, as RFC 9110 §13.1 says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentrooms.errors import BadRequest

__all__ = ["ANY", "Expect", "Tags", "decide", "etag", "parse_tags", "weak_match"]

_TAG = re.compile(r'\s*(W/)?"([\x21\x23-\x7e\x80-\xff]*)"\s*(?:,|$)')


def etag(version: int) -> str:
    return f'"{version}"'


@dataclass(frozen=True, slots=True)
class Tags:
    """A parsed ``If-Match`` / ``If-None-Match`` value: ``*`` or a list of tags."""

    any: bool = False
    strong: frozenset[str] = frozenset()  # opaque tags without W/
    weak: frozenset[str] = frozenset()  # opaque tags with W/

    def strong_match(self, version: int | None) -> bool:
        if version is None:
            return False
        return self.any or str(version) in self.strong

    def weak_match(self, version: int | None) -> bool:
        if version is None:
            return False
        return self.any or str(version) in self.strong or str(version) in self.weak

    def single_version(self) -> int | None:
        """The version of a lone strong tag that names one, else ``None``."""
        if self.any or self.weak or len(self.strong) != 1:
            return None
        (tag,) = self.strong
        return int(tag) if tag.isdigit() and len(tag) < 19 else None


ANY = Tags(any=True)


def parse_tags(header: str | None, name: str) -> Tags | None:
    """``None`` when the header is absent; ``BadRequest`` when it is not a ``*`` or a
    comma-separated list of entity tags."""
    if header is None:
        return None
    text = header.strip()
    if text == "*":
        return ANY
    strong: set[str] = set()
    weak: set[str] = set()
    position = 0
    while position < len(text):
        match = _TAG.match(text, position)
        if match is None or match.end() == position:
            raise BadRequest(f'{name} must be * or entity tags such as "17", got {header!r}')
        (weak if match.group(1) else strong).add(match.group(2))
        position = match.end()
    if not strong and not weak:
        raise BadRequest(f"{name} is empty")
    return Tags(strong=frozenset(strong), weak=frozenset(weak))


def weak_match(tags: Tags | None, version: int | None) -> bool:
    return tags is not None and tags.weak_match(version)


@dataclass(frozen=True, slots=True)
class Expect:
    """What a write compares: ``version`` (that exact version), or ``absent``."""

    version: int | None = None
    absent: bool = False


def decide(current: int | None, if_match: Tags | None, if_none_match: Tags | None) -> Expect | None:
    """Evaluate the preconditions against the version read (``None``: absent), RFC 9110
    §13.2.2 order. ``None`` means 412; otherwise the write must compare what it returns."""
    if if_match is not None and not if_match.strong_match(current):
        return None
    if if_none_match is not None and if_none_match.weak_match(current):
        return None
    return Expect(absent=True) if current is None else Expect(version=current)
