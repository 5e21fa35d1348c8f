"""The tools of documents: list, read, write, delete."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field, JsonValue

from agentrooms.errors import (
    VersionConflict,
)
from agentrooms.rooms import Room
from agentrooms.rooms import keys as room_keys
from agentrooms.rooms.documents import check_doc_name
from agentrooms.server.auth import Principal
from agentrooms.server.deps import command_id
from agentrooms.server.mcp.hints import (
    Verbatim,
    document_conflict,
)
from agentrooms.server.mcp.tools.base import (
    Body,
    DocNameArg,
    RequestId,
    RoomArg,
    ToolsBase,
    _Answered,
)
from agentrooms.server.models import MAX_INT, PARTITION


class DocumentTools(ToolsBase):
    async def read_document(
        self, room: RoomArg, name: DocNameArg, ctx: Context[Any, Any]
    ) -> CallToolResult:
        """A document's value and version. Write it back with write_document and that
        version."""

        async def body(principal: Principal, r: Room) -> Body:
            doc = await r.docs.get(name)
            return {"value": Verbatim(doc.value), "version": doc.version}

        return await self.run(ctx, room, "docs:read", body, "document")

    async def write_document(
        self,
        room: RoomArg,
        name: DocNameArg,
        value: Annotated[JsonValue, Field(description="the new value (JSON)")],
        version: Annotated[
            int,
            Field(
                ge=0,
                le=MAX_INT,
                description="the version you read (0 to create a new document); the write "
                "fails with version_conflict if it changed since",
            ),
        ],
        ctx: Context[Any, Any],
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Replace a document, only if it is still at the version you read (version 0:
        only if it does not exist yet). Returns the new version."""

        async def body(principal: Principal, r: Room) -> Body:
            check_doc_name(name)
            principal.check_doc_write(name)
            doc = await r.docs.put(
                name,
                value,
                if_match=version or None,
                create_only=version == 0,
                command_id=command_id(principal, request_id),
                author=principal.agent,
            )
            return {"version": doc.version}

        async def guarded(principal: Principal, r: Room) -> Body:
            try:
                return await body(principal, r)
            except VersionConflict as exc:
                current = exc.conflicts.get(room_keys.doc(name))
                raise _Answered(document_conflict(name, version, current)) from exc

        return await self.run(ctx, room, "docs:write", guarded, "document")

    async def delete_document(
        self,
        room: RoomArg,
        name: DocNameArg,
        version: Annotated[
            int, Field(ge=1, le=MAX_INT, description="the version you read (it must still be)")
        ],
        ctx: Context[Any, Any],
    ) -> CallToolResult:
        """Delete a document, only if it is still at the version you read."""

        async def body(principal: Principal, r: Room) -> Body:
            check_doc_name(name)
            principal.check_doc_write(name)
            try:
                await r.docs.delete(name, if_match=version, author=principal.agent)
            except VersionConflict as exc:
                current = exc.conflicts.get(room_keys.doc(name))
                raise _Answered(document_conflict(name, version, current)) from exc
            return {"deleted": name}

        return await self.run(ctx, room, "docs:write", body, "document")

    async def list_documents(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        partition: Annotated[
            str | None, Field(pattern=PARTITION, max_length=64, description="only this partition's")
        ] = None,
    ) -> CallToolResult:
        """The room's documents by name, with their versions (read_document for a value)."""

        async def body(principal: Principal, r: Room) -> Body:
            docs = await r.docs.list(partition)
            return {"documents": [{"name": d.name, "version": d.version} for d in docs]}

        return await self.run(ctx, room, "docs:read", body, "document")
