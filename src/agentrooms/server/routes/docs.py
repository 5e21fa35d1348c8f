"""Versioned documents with RFC 9110 conditional requests.

Every read answers a strong ``ETag`` (``"<version>"``). A write must be conditional:
``If-Match`` (``412`` with the current ``ETag`` and representation when stale) or
``If-None-Match: *`` to create (``412`` if it exists); neither is ``428``. A name may be
``partition/name``; a token writes only its role's partition (see :mod:`..auth`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response
from fastapi.responses import JSONResponse

from agentrooms.errors import (
    BadRequest,
    ContentionExhausted,
    NotFound,
    VersionConflict,
)
from agentrooms.rooms import Document, Room
from agentrooms.rooms import keys as room_keys
from agentrooms.server.conditional import Expect, Tags, decide, etag, parse_tags, weak_match
from agentrooms.server.deps import Access, DocsRead, DocsWrite, IdempotencyKey, command_id
from agentrooms.server.envelope import PreconditionRequired, error_response
from agentrooms.server.models import DOC_PATTERN, PARTITION, DocList, DocOut, DocPut, Guard, dump
from agentrooms.server.routes import COMMON, ETAG, errors
from agentrooms.store.types import FenceAtMost

router = APIRouter(prefix="/rooms/{room}/docs", tags=["docs"], responses=errors(*COMMON))

DocName = Annotated[
    str,
    Path(pattern=DOC_PATTERN, min_length=1, max_length=193, description="[partition/]name"),
]
IfMatch = Annotated[
    str | None,
    Header(alias="If-Match", max_length=4096, description='e.g. "17", or *'),
]
IfNoneMatch = Annotated[
    str | None,
    Header(alias="If-None-Match", max_length=4096, description='* to create; or "17"'),
]
REDECIDE = 32  # writes a precondition other than one version is decided again for, at most
WRITTEN: dict[int | str, dict[str, Any]] = {
    200: {"description": "replaced", "headers": ETAG},
    201: {"description": "created", "headers": ETAG, "model": DocOut},
}


@router.get("", summary="Documents, by name (optionally one partition)")
async def list_docs(
    access: DocsRead, partition: Annotated[str | None, Query(pattern=PARTITION)] = None
) -> DocList:
    docs = await access.room.docs.list(partition)
    return DocList(documents=[DocOut.of(d) for d in docs])


@router.get(
    "/{name:path}",
    summary="One document",
    responses={200: {"headers": ETAG}, 304: {"description": "If-None-Match matched"}},
    response_model=DocOut,
)
async def get_doc(
    access: DocsRead, name: DocName, if_none_match: IfNoneMatch = None
) -> Response | DocOut:
    doc = await access.room.docs.get(name)
    if weak_match(parse_tags(if_none_match, "If-None-Match"), doc.version):
        return Response(status_code=304, headers={"ETag": etag(doc.version)})
    return _answer(doc, 200)


@router.put(
    "/{name:path}",
    summary="Write a document (If-Match, or If-None-Match: * to create)",
    responses={**WRITTEN, **errors(409, 412, 422, 428)},
    response_model=DocOut,
)
async def put_doc(
    access: DocsWrite,
    name: DocName,
    body: DocPut,
    if_match: IfMatch = None,
    if_none_match: IfNoneMatch = None,
    key: IdempotencyKey = None,
) -> Response:
    _check_partition(access, name)
    im, inm = parse_tags(if_match, "If-Match"), parse_tags(if_none_match, "If-None-Match")
    if im is None and inm is None:
        raise PreconditionRequired(
            'writing a document needs If-Match: "<version>" (or If-None-Match: * to create it)'
        )
    docs, cmd, fence = access.room.docs, command_id(access.principal, key), _fence(body.guard)
    version = None if im is None or inm is not None else im.single_version()
    create = im is None and inm is not None and inm.any
    try:
        exists = inm is None and im is not None and im.any  # If-Match: *
        if version is not None or create or exists:  # one compare says it all
            doc = await docs.put(
                name,
                body.value,
                if_match=version,
                create_only=create,
                must_exist=exists,
                fence=fence,
                command_id=cmd,
                author=access.agent,
            )
            return _answer(doc, 201 if create else 200)
        for _ in range(REDECIDE):  # decide on the version read; write only if still it
            expect = await _expect(access.room, name, im, inm)
            try:
                doc = await docs.put(
                    name,
                    body.value,
                    if_match=expect.version,
                    create_only=expect.absent,
                    fence=fence,
                    command_id=cmd,
                    author=access.agent,
                )
            except VersionConflict:
                continue  # it changed since the read: decide again on what it is now
            return _answer(doc, 201 if expect.absent else 200)
    except VersionConflict as exc:
        return await _precondition_failed(access.room, name, exc)
    raise ContentionExhausted(REDECIDE, 0.0, [room_keys.doc(name)])


@router.delete(
    "/{name:path}",
    status_code=204,
    summary="Delete a document (If-Match required)",
    responses=errors(409, 412, 428),
)
async def delete_doc(access: DocsWrite, name: DocName, if_match: IfMatch = None) -> Response:
    _check_partition(access, name)
    im = parse_tags(if_match, "If-Match")
    if im is None:
        raise PreconditionRequired('deleting a document needs If-Match: "<version>"')
    try:
        version = im.single_version()
        if version is not None:
            await access.room.docs.delete(name, if_match=version, author=access.agent)
            return Response(status_code=204)
        if im.any:  # If-Match: * holds while the document exists, whatever its version
            try:
                await access.room.docs.delete(name, must_exist=True, author=access.agent)
            except NotFound:
                raise VersionConflict({room_keys.doc(name): None}) from None
            return Response(status_code=204)
        for _ in range(REDECIDE):
            expect = await _expect(access.room, name, im, None)
            if expect.version is None:  # If-Match on an absent document
                raise VersionConflict({room_keys.doc(name): None})
            try:
                await access.room.docs.delete(name, if_match=expect.version, author=access.agent)
            except VersionConflict:
                continue
            return Response(status_code=204)
    except VersionConflict as exc:
        return await _precondition_failed(access.room, name, exc)
    raise ContentionExhausted(REDECIDE, 0.0, [room_keys.doc(name)])


# ----------------------------------------------------------------------------- helpers


def _check_partition(access: Access, name: str) -> None:
    access.principal.check_doc_write(name)


def _fence(guard: Guard | None) -> FenceAtMost | None:
    if guard is None:
        return None
    if (guard.task is None) == (guard.lock is None):
        raise BadRequest("a guard names exactly one of 'task' or 'lock'")
    if guard.task is not None:
        return FenceAtMost(room_keys.task(guard.task), guard.fence)
    assert guard.lock is not None
    return FenceAtMost(room_keys.lock_fence(guard.lock), guard.fence)


async def _current(room: Room, name: str) -> Document | None:
    """The document now, ``None`` if absent (``NotFound`` only for a missing room)."""
    return await room.docs.find(name)


async def _expect(room: Room, name: str, im: Tags | None, inm: Tags | None) -> Expect:
    """What a write must compare for the preconditions to hold on the document as read
    now; ``VersionConflict`` (412) if they do not hold on it. A write that then fails its
    compare met another version, and is decided again on that one (:data:`REDECIDE`
    times at most): ``If-Match: *`` or a list of tags fails only on a version read that
    fails it, never on a change between the read and the write."""
    current = await _current(room, name)
    expect = decide(None if current is None else current.version, im, inm)
    if expect is None:
        raise VersionConflict({room_keys.doc(name): None if current is None else current.version})
    return expect


async def _precondition_failed(room: Room, name: str, exc: VersionConflict) -> Response:
    """412 with the current ETag and the current representation (``null`` if absent)."""
    current = await _current(room, name)
    headers = {} if current is None else {"ETag": etag(current.version)}
    shown = None if current is None else dump(DocOut.of(current))
    now = "does not exist" if current is None else f"is at version {current.version}"
    failed = VersionConflict(exc.conflicts, f"precondition failed: document {name!r} {now}")
    return error_response(failed, status=412, details={"current": shown}, headers=headers)


def _answer(doc: Document, status: int) -> Response:
    return JSONResponse(
        dump(DocOut.of(doc)), status_code=status, headers={"ETag": etag(doc.version)}
    )
