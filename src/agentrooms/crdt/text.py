"""Collaborative text: a Yjs document (through ``pycrdt``) holding one text.

The value is the document's full update (its encoded state), so it is plain data: in
JSON it travels as base64. Edits made concurrently on different replicas merge by
Yjs's sequence CRDT (YATA): every replica that has seen the same edits shows the same
text, whatever order the edits arrived in, and no edit is lost (a deleted range stays
deleted, text inserted concurrently is kept).

Each edit names the node making it; the node id is mapped to the Yjs client id that
numbers its operations, so, as for every CRDT here, one node id must name one replica
that evolves sequentially (never edit two copies of a value with the same node id).
Indices and lengths are in Python characters (code points); they are converted to the
UTF-8 offsets ``pycrdt`` uses. Each edit rebuilds a document from the update, so an edit
costs time proportional to the document: fine for the documents agents share.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from pycrdt import Doc
from pycrdt import Text as YText

from agentrooms.crdt.codec import check_count, check_node, expect, register
from agentrooms.errors import BadRequest
from agentrooms.store.types import JSON

__all__ = ["Editor", "Text", "client_id"]

ROOT = "text"
EMPTY = b"\x00\x00"


def client_id(node: str) -> int:
    """The Yjs client id of ``node``: 53 bits of its BLAKE2b hash (JavaScript-safe)."""
    digest = hashlib.blake2b(check_node(node).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**53 - 1)


def _doc(update: bytes, client: int | None = None) -> tuple[Doc[YText], YText]:
    doc: Doc[YText] = Doc() if client is None else Doc(client_id=client)
    text = doc.get(ROOT, type=YText)
    try:
        doc.apply_update(update)
    except ValueError as exc:
        raise BadRequest(f"not a Yjs text update: {exc}") from exc
    return doc, text


def _canonical(*updates: bytes) -> bytes:
    """One update holding everything in ``updates``, encoded the same whatever the order."""
    doc, _ = _doc(EMPTY)
    for update in updates:
        try:
            doc.apply_update(update)
        except ValueError as exc:
            raise BadRequest(f"not a Yjs text update: {exc}") from exc
    return doc.get_update()


class Editor:
    """Edits of one replica in code points, applied to a ``pycrdt`` text."""

    def __init__(self, text: YText) -> None:
        self._text = text

    def __str__(self) -> str:
        return str(self._text)

    def _offset(self, current: str, index: object) -> int:
        index = check_count(index, "text index")
        if index > len(current):
            raise BadRequest(f"text index {index} is past the end ({len(current)})")
        return len(current[:index].encode())

    def insert(self, index: int, value: str) -> None:
        if not isinstance(value, str):
            raise BadRequest("inserted text must be a string")
        self._text.insert(self._offset(str(self._text), index), value)

    def delete(self, index: int, length: int) -> None:
        current = str(self._text)
        start = self._offset(current, index)
        end = self._offset(current, index + check_count(length, "delete length"))
        if end > start:
            del self._text[start:end]


@register
@dataclass(frozen=True, slots=True)
class Text:
    """A collaboratively edited text (Yjs)."""

    kind: ClassVar[str] = "text"
    update: bytes = EMPTY

    def __post_init__(self) -> None:
        if not isinstance(self.update, bytes):
            raise BadRequest("a text's update must be bytes")
        object.__setattr__(self, "update", _canonical(self.update))

    @classmethod
    def of(cls, node: str, value: str) -> Text:
        """A new text holding ``value``, written by ``node``."""
        return cls().insert(node, 0, value)

    @property
    def value(self) -> str:
        return str(_doc(self.update)[1])

    def edit(self, node: str, edits: Callable[[Editor], None]) -> Text:
        """Apply ``edits`` (any number of inserts and deletes) as ``node``."""
        doc, text = _doc(self.update, client_id(node))
        with doc.transaction():
            edits(Editor(text))
        return Text(doc.get_update())

    def insert(self, node: str, index: int, value: str) -> Text:
        return self.edit(node, lambda e: e.insert(index, value))

    def delete(self, node: str, index: int, length: int) -> Text:
        return self.edit(node, lambda e: e.delete(index, length))

    def merge(self, other: Text) -> Text:
        return Text(_canonical(self.update, other.update))

    def to_json(self) -> JSON:
        return {"crdt": self.kind, "update": base64.b64encode(self.update).decode("ascii")}

    @classmethod
    def from_json(cls, data: JSON) -> Text:
        encoded = expect(data, cls.kind, ("update",))["update"]
        if not isinstance(encoded, str):
            raise BadRequest("a text's update is a base64 string")
        try:
            return cls(base64.b64decode(encoded, validate=True))
        except binascii.Error as exc:
            raise BadRequest(f"a text's update is not base64: {exc}") from exc
