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
from agentrooms.server.access import command_id
from agentrooms.server.auth import Principal
from agentrooms.server.mcp.hints import (
    document_conflict,
)
from agentrooms.server.mcp.tools.base import (
    AfterArg,
    Body,
    DocNameArg,
    LimitArg,
    OffsetArg,
    RequestId,
    RoomArg,
    ToolsBase,
    _Answered,
    part_of,
)
from agentrooms.server.models import MAX_INT, PARTITION


class DocumentTools(ToolsBase):
    """Documents."""

    async def read_document(
        self, room: RoomArg, name: DocNameArg, ctx: Context[Any, Any], offset: OffsetArg = 0
    ) -> CallToolResult:
        """A document's value and version (for write_document). A value too large for one
        result comes in parts ({json, next_offset}): call again with offset=next_offset
        and join them; if version changes meanwhile, start again."""

        async def body(principal: Principal, r: Room) -> Body:
            doc = await r.docs.get(name)
            part = part_of(doc.value, offset, self.limits.max_result_bytes - 512)
            return {**part, "version": doc.version}

        return await self.run(ctx, room, "docs:read", body, "document")

    async def write_document(
        self,
        room: RoomArg,
        name: DocNameArg,
        value: Annotated[JsonValue, Field(description="JSON")],
        version: Annotated[int, Field(ge=0, le=MAX_INT, description="as read; 0: create")],
        ctx: Context[Any, Any],
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Replace a document if still at version (0: create it). Returns the new
        version. version_conflict: re-read, re-apply your change, write again. forbidden:
        join_room says which documents you may write."""

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
        version: Annotated[int, Field(ge=1, le=MAX_INT, description="as read")],
        ctx: Context[Any, Any],
    ) -> CallToolResult:
        """Delete a document if still at version (else version_conflict: re-read)."""

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
        partition: Annotated[str | None, Field(pattern=PARTITION, max_length=64)] = None,
        limit: LimitArg = 100,
        after: AfterArg = None,
    ) -> CallToolResult:
        """Document names and versions; next: pass as after for more."""

        async def body(principal: Principal, r: Room) -> Body:
            page = await r.docs.page(limit, after, partition)
            docs = [{"name": d.name, "version": d.version} for d in page.documents]
            return {"documents": docs, "next": page.next_after}

        return await self.run(ctx, room, "docs:read", body, "document")
