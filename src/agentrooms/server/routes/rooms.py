"""Rooms: list, create, describe, archive, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, Security
from fastapi.security import HTTPAuthorizationCredentials

from agentrooms.errors import Forbidden, VersionConflict
from agentrooms.server.deps import RoomsRead, RoomsWrite, bearer, enter, principal_of, rooms_of
from agentrooms.server.envelope import error_response
from agentrooms.server.models import RoomCreate, RoomList, RoomOut
from agentrooms.server.routes import COMMON, errors

router = APIRouter(prefix="/rooms", tags=["rooms"], responses=errors(*COMMON))

Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]


@router.get("", summary="Rooms this token may enter")
async def list_rooms(
    request: Request,
    _: Bearer,
    archived: bool = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[str | None, Query(max_length=128)] = None,
) -> RoomList:
    """One page of the rooms this token may enter, by name: the token's rooms are
    chosen before any is described, and the page is described in one store call.
    ``next_after`` is the ``after`` of the next page, ``null`` at the end."""
    principal = principal_of(request)
    if not principal.has("rooms:read"):
        raise Forbidden("this token lacks the 'rooms:read' scope")
    page = await rooms_of(request).page(
        limit, after, include_archived=archived, among=principal.rooms
    )
    return RoomList(rooms=[RoomOut.of(r) for r in page.rooms], next_after=page.next_after)


@router.post(
    "",
    status_code=201,
    response_model=RoomOut,
    summary="Create a room",
    responses={**errors(409), 201: {"headers": {"Location": {"schema": {"type": "string"}}}}},
)
async def create_room(
    request: Request, body: RoomCreate, response: Response, _: Bearer
) -> RoomOut | Response:
    rooms = rooms_of(request)
    principal = principal_of(request)
    enter(principal, rooms, body.name, "rooms:write")
    try:
        room = await rooms.create(
            body.name, body.description, body.metadata, author=principal.agent
        )
    except VersionConflict as exc:  # no precondition was asked for: a conflict, not a 412
        return error_response(exc, status=409)
    response.headers["Location"] = f"/v1/rooms/{room.name}"
    return RoomOut.of(await room.describe())


@router.get("/{room}", summary="Describe a room")
async def describe_room(access: RoomsRead) -> RoomOut:
    return RoomOut.of(await access.room.describe())


@router.post("/{room}/archive", summary="Make a room read-only", responses=errors(409))
async def archive_room(request: Request, access: RoomsWrite) -> RoomOut:
    return RoomOut.of(await rooms_of(request).archive(access.room.name, author=access.agent))


@router.delete("/{room}", status_code=204, summary="Delete a room and everything in it")
async def delete_room(request: Request, access: RoomsWrite) -> Response:
    await rooms_of(request).delete(access.room.name)
    return Response(status_code=204)
