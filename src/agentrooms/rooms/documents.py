"""Versioned documents, written by compare-and-swap.

A document is one record ``doc/<name>``; its version is the record's version, so every
read returns value and version together and a write names the version it was computed
from (HTTP's ``If-Match``). Names may have one partition segment, ``<partition>/<name>``
(partitioning by agent type: the HTTP surface lets a role write only its own partition).

Every write also records its writer (the agent that wrote the current version) in
``docby/<name>``, in the same transact as the value, so the writer read with a document is
the one of that version however long ago it was written (see docs/why-ops.md).
"""

from __future__ import annotations

import asyncio
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
    Record,
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
    """A document's value and version; ``writer``: the agent that wrote that version
    (``None`` when the write named no author)."""

    name: str
    value: JSON
    version: int
    writer: str | None = None


def writer_of(record: Record | None) -> str | None:
    """The writer a ``docby/<name>`` record names (``None`` for none)."""
    value = None if record is None else record.value
    writer = value.get("writer") if isinstance(value, dict) else None
    return writer if isinstance(writer, str) else None


@dataclass(frozen=True, slots=True)
class DocumentPage:
    """Documents by name; ``next_after`` is the ``after`` of the next page, ``None``
    when no document follows."""

    documents: list[Document]
    next_after: str | None


async def _all(scope: Scope, prefix: str) -> list[Record]:
    out: list[Record] = []
    after: str | None = None
    while True:
        page = await scope.store.scan(scope.room, prefix, after, 1000)
        out += page.records
        if page.next_after is None:
            return out
        after = page.next_after


class Documents:
    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    async def get(self, name: str) -> Document:
        """The document with its writer (one read); ``NotFound`` if it or the room does
        not exist."""
        doc = await self.find(name)
        if doc is None:
            raise NotFound(f"no document {name!r} in room {self._scope.room!r}")
        return doc

    async def find(self, name: str) -> Document | None:
        """The document with its writer (one read), ``None`` if absent; ``NotFound`` if
        the room does not exist."""
        key, by = keys.doc(check_doc_name(name)), keys.doc_writer(name)
        snapshot = await self._scope.read([key, by])
        record = snapshot.get(key)
        if record is None:
            return None
        return Document(name, record.value, record.version, writer_of(snapshot.get(by)))

    async def list(self, partition: str | None = None) -> list[Document]:
        """Documents by name (optionally one partition's), each with its writer (read by
        a second scan: a write between the two may show the next version's writer)."""
        await self._scope.read([])
        scoped = "" if partition is None else f"{partition}/"
        docs, writers = await asyncio.gather(
            _all(self._scope, keys.doc(scoped)), _all(self._scope, keys.doc_writer(scoped))
        )
        by = {r.key[len("docby/") :]: writer_of(r) for r in writers}
        return [_document(r, by.get(r.key[len("doc/") :])) for r in docs]

    async def page(
        self, limit: int = 100, after: str | None = None, partition: str | None = None
    ) -> DocumentPage:
        """Up to ``limit`` documents by name after the name ``after`` (optionally one
        partition's; one scan of the room, then one read of their writers). ``NotFound``
        if the room does not exist, ``BadRequest`` for a bad ``limit``."""
        scoped = "" if partition is None else f"{partition}/"
        if after is not None and not after.startswith(scoped):
            raise BadRequest(f"after {after!r} is not a document of partition {partition!r}")
        rel = None if after is None else after[len(scoped) :]
        records, _, next_after = await self._scope.page(keys.doc(scoped), limit, rel)
        by: dict[str, str | None] = {}
        step = self._scope.store.limits.max_ops - 1  # the read adds the room's meta
        for i in range(0, len(records), step):
            wanted = [keys.doc_writer(r.key[len("doc/") :]) for r in records[i : i + step]]
            snapshot = await self._scope.read(wanted)
            by.update((k, writer_of(snapshot.get(k))) for k in wanted)
        docs = [_document(r, by.get(keys.doc_writer(r.key[len("doc/") :]))) for r in records]
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
        agent writing, the author of the event and the document's recorded writer (written
        in the same transact as the value)."""
        key, by = keys.doc(check_doc_name(name)), keys.doc_writer(name)
        writes = [Put(key, value), Put(by, {"writer": author})]
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
            done = await self._scope.transact(compares, writes, appends)
            return Document(name, value, done.versions[key], author)

        def write(view: View, _: JSON) -> Change:
            current = view.version(key)
            if (
                (if_match is not None and current != if_match)
                or (create_only and current)
                or (must_exist and current is None)
            ):
                raise VersionConflict({key: current})
            guard = [] if fence is None else [fence]
            return Change(writes=writes, appends=appends, requires=guard)

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
        return Document(name, value, result.versions[key], author)

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
        deleting, the author of the ``doc.deleted`` event. The recorded writer goes with
        the document, in the same transact."""
        key, by = keys.doc(check_doc_name(name)), keys.doc_writer(name)
        if if_match is not None and must_exist:
            raise BadRequest("if_match and must_exist exclude each other")
        compares: list[Compare] = [VersionIs(key, if_match)] if if_match is not None else []
        if must_exist:
            compares.append(Present(key))
        try:
            await self._scope.transact(
                compares,
                [Delete(key), Delete(by)],
                [Append("doc.deleted", {"doc": name}, author)],
            )
        except VersionConflict as exc:
            if exc.conflicts.get(key, 0) is None:
                raise NotFound(f"no document {name!r}") from exc
            raise


def _document(record: Record, writer: str | None) -> Document:
    return Document(record.key[len("doc/") :], record.value, record.version, writer)
