"""A remote room's versioned documents."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from agentrooms.client.rooms.base import Part, parse
from agentrooms.errors import BadRequest
from agentrooms.rooms.documents import Document
from agentrooms.store.types import JSON, FenceAtMost


def _guard(fence: FenceAtMost | None) -> dict[str, Any] | None:
    """A library fence (``lease.guard()``, ``lock.guard()``) as the API's ``guard``."""
    if fence is None:
        return None
    for prefix, kind in (("task/", "task"), ("lockfence/", "lock")):
        if fence.key.startswith(prefix):
            return {kind: fence.key[len(prefix) :], "fence": fence.fence}
    raise BadRequest(f"a document write is fenced by a lease or a lock, not {fence.key!r}")


class Documents(Part):
    """Versioned documents (:class:`agentrooms.rooms.Documents`)."""

    def _doc(self, name: str) -> str:
        return f"{self._room.path}/docs/{quote(name, safe='/')}"

    async def get(self, name: str) -> Document:
        return parse(Document, await self._http.json("GET", self._doc(name), safety="idempotent"))

    async def list(self, partition: str | None = None) -> list[Document]:
        """Documents by name (optionally one partition's)."""
        body = await self._http.json(
            "GET", f"{self._room.path}/docs", safety="idempotent", params={"partition": partition}
        )
        return [parse(Document, d) for d in body["documents"]]

    async def put(
        self,
        name: str,
        value: JSON,
        *,
        if_match: int | None = None,
        create_only: bool = False,
        must_exist: bool = False,
        fence: FenceAtMost | None = None,
        command_id: str | None = None,
    ) -> Document:
        """Write the document under one condition: ``if_match`` (that version),
        ``create_only`` (absent) or ``must_exist`` (any version); ``fence`` (a lease's or
        lock's ``guard()``): only while it is current (``StaleFence``). A failed
        condition is ``VersionConflict`` naming the current version."""
        if (if_match is not None) + create_only + must_exist > 1:
            raise BadRequest("if_match, create_only and must_exist exclude each other")
        headers = self._key(command_id)
        if if_match is not None:
            headers["If-Match"] = f'"{if_match}"'
        elif create_only:
            headers["If-None-Match"] = "*"
        elif must_exist:
            headers["If-Match"] = "*"
        body: dict[str, Any] = {"value": value}
        if fence is not None:
            body["guard"] = _guard(fence)
        data = await self._http.json(
            "PUT", self._doc(name), safety="keyed", body=body, headers=headers
        )
        return parse(Document, data)

    async def delete(
        self, name: str, *, if_match: int | None = None, must_exist: bool = False
    ) -> None:
        """Delete the document at version ``if_match`` (``VersionConflict`` otherwise)
        or, with ``must_exist``, at any version. Not retried once sent (the server keys
        no delete): an unknown outcome is ``StoreUnavailable``."""
        if (if_match is None) == (not must_exist):
            raise BadRequest("delete needs exactly one of if_match or must_exist")
        header = "*" if must_exist else f'"{if_match}"'
        await self._http.call(
            "DELETE", self._doc(name), safety="once", headers={"If-Match": header}
        )
