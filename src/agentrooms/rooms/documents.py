"""Versioned documents, written by compare-and-swap.

A document is one record ``doc/<name>``; its version is the record's version, so every
read returns value and version together and a write names the version it was computed
from (HTTP's ``If-Match``). Names may have one partition segment, ``<partition>/<name>``
(partitioning by agent type: the HTTP surface lets a role write only its own partition).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentrooms.commit import Change, View
from agentrooms.errors import BadRequest, NotFound, VersionConflict
from agentrooms.rooms import keys
from agentrooms.rooms.scope import Scope
from agentrooms.store.types import (
    JSON,
    Absent,
    Append,
    Compare,
    Delete,
    FenceAtMost,
    Present,
    Put,
    VersionIs,
)

_DOC_NAME = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._:-]{0,63}/)?[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def check_doc_name(name: object) -> str:
    if not isinstance(name, str) or not _DOC_NAME.fullmatch(name):
        raise BadRequest(
            "a document name is [partition/]name, each part letters, digits, '.', '_', ':' "
            f"or '-', starting with a letter or digit; got {name!r}"
        )
    return name


def partition_of(name: str) -> str | None:
    head, sep, _ = name.partition("/")
    return head if sep else None


@dataclass(frozen=True, slots=True)
class Document:
    name: str
    value: JSON
    version: int


@dataclass(frozen=True, slots=True)
class DocumentPage:
    """Documents by name; ``next_after`` is the ``after`` of the next page, ``None``
    when no document follows."""

    documents: list[Document]
    next_after: str | None


class Documents:
    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    async def get(self, name: str) -> Document:
        key = keys.doc(check_doc_name(name))
        record = (await self._scope.read([key])).get(key)
        if record is None:
            raise NotFound(f"no document {name!r} in room {self._scope.room!r}")
        return Document(name, record.value, record.version)

    async def list(self, partition: str | None = None) -> list[Document]:
        """Documents by name (optionally one partition's)."""
        await self._scope.read([])
        prefix = keys.doc("" if partition is None else f"{partition}/")
        out: list[Document] = []
        after: str | None = None
        while True:
            page = await self._scope.store.scan(self._scope.room, prefix, after, 1000)
            out += [Document(r.key[len("doc/") :], r.value, r.version) for r in page.records]
            if page.next_after is None:
                return out
            after = page.next_after

    async def page(
        self, limit: int = 100, after: str | None = None, partition: str | None = None
    ) -> DocumentPage:
        """Up to ``limit`` documents by name after the name ``after`` (optionally one
        partition's; one scan of the room). ``NotFound`` if the room does not exist,
        ``BadRequest`` for a bad ``limit``."""
        scoped = "" if partition is None else f"{partition}/"
        if after is not None and not after.startswith(scoped):
            raise BadRequest(f"after {after!r} is not a document of partition {partition!r}")
        rel = None if after is None else after[len(scoped) :]
        records, _, next_after = await self._scope.page(keys.doc(scoped), limit, rel)
        docs = [Document(r.key[len("doc/") :], r.value, r.version) for r in records]
        return DocumentPage(docs, None if next_after is None else scoped + next_after)

    async def put(
        self,
        name: str,
        value: JSON,
        *,
        if_match: int | None = None,
        create_only: bool = False,
        must_exist: bool = False,
        fence: FenceAtMost | None = None,
        event: bool = True,
        command_id: str | None = None,
        author: str | None = None,
    ) -> Document:
        """Write the document. ``if_match``: only if its version is still that one
        (``VersionConflict`` naming the current version otherwise); ``create_only``:
        only if it does not exist (``If-None-Match: *``); ``must_exist``: only if it
        exists, whatever its version (``If-Match: *``); ``fence``: only while that
        lease or lock is current (``StaleFence``). Without either condition the write is
        unconditional. Appends ``doc.written`` to the room's log unless ``event=False``.
        With ``command_id``, a repeated call returns the document as the first call wrote
        it (that version), whatever was written since, and writes nothing. ``author``: the
        agent writing, the author of the event."""
        key = keys.doc(check_doc_name(name))
        if (if_match is not None) + create_only + must_exist > 1:
            raise BadRequest("if_match, create_only and must_exist exclude each other")
        compares: list[Compare] = []
        if if_match is not None:
            compares.append(VersionIs(key, if_match))
        elif create_only:
            compares.append(Absent(key))
        elif must_exist:
            compares.append(Present(key))
        if fence is not None:
            compares.append(fence)
        appends = [Append("doc.written", {"doc": name}, author)] if event else []
        if command_id is None:
            done = await self._scope.transact(compares, [Put(key, value)], appends)
            return Document(name, value, done.versions[key])

        def write(view: View, _: JSON) -> Change:
            current = view.version(key)
            if (
                (if_match is not None and current != if_match)
                or (create_only and current)
                or (must_exist and current is None)
            ):
                raise VersionConflict({key: current})
            guard = [] if fence is None else [fence]
            return Change(writes=[Put(key, value)], appends=appends, requires=guard)

        request = {
            "op": "put",
            "doc": name,
            "value": value,
            "if_match": if_match,
            "create_only": create_only,
            "must_exist": must_exist,
            "fence": None if fence is None else [fence.key, fence.fence],
        }
        result = await self._scope.commit(write, request, [key], command_id=command_id)
        return Document(name, value, result.versions[key])

    async def delete(
        self,
        name: str,
        *,
        if_match: int | None = None,
        must_exist: bool = False,
        author: str | None = None,
    ) -> None:
        """Delete the document: only at version ``if_match`` if given (``VersionConflict``
        naming the current one otherwise), or, with ``must_exist``, whatever its version.
        ``NotFound`` if a condition was given and it does not exist. ``author``: the agent
        deleting, the author of the ``doc.deleted`` event."""
        key = keys.doc(check_doc_name(name))
        if if_match is not None and must_exist:
            raise BadRequest("if_match and must_exist exclude each other")
        compares: list[Compare] = [VersionIs(key, if_match)] if if_match is not None else []
        if must_exist:
            compares.append(Present(key))
        try:
            await self._scope.transact(
                compares, [Delete(key)], [Append("doc.deleted", {"doc": name}, author)]
            )
        except VersionConflict as exc:
            if exc.conflicts.get(key, 0) is None:
                raise NotFound(f"no document {name!r}") from exc
            raise
