"""Path reservations: reserve a set of path patterns (or renew one reservation), release,
check paths against other agents' reservations (for a commit hook), and list.

The reserving agent is the token's; renew and release act only on the token agent's own
reservations (the library compares the owner in the write).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from agentrooms.rooms.paths import DEFAULT_TTL, MAX_PATTERNS, PathConflict, Reservation
from agentrooms.server.deps import LocksWrite, RoomsRead, act_as
from agentrooms.server.models import NAME_PATTERN, In, Name, Released, Seconds
from agentrooms.server.routes import COMMON, errors

router = APIRouter(prefix="/rooms/{room}/paths", tags=["paths"], responses=errors(*COMMON))

Mode = Literal["exclusive", "shared"]
Patterns = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=512)]],
    Field(min_length=1, max_length=MAX_PATTERNS),
]
ReservationId = Annotated[str, Path(pattern=NAME_PATTERN, min_length=1, max_length=128)]


class ReserveIn(In):
    paths: Patterns = Field(description="globs: literal segments, '*', '?', whole '**'")
    mode: Mode = "exclusive"
    ttl: Seconds = DEFAULT_TTL
    agent: Name | None = Field(default=None, description="must be the token's agent when given")


class RenewIn(In):
    ttl: Seconds | None = Field(default=None, description="default: the reservation's own")


class CheckIn(In):
    paths: Patterns
    mode: Mode = "exclusive"


class ReservationOut(BaseModel):
    room: str
    id: str
    owner: str
    mode: str
    paths: list[str]
    fence: int
    ttl: float
    expires_at: float = Field(description="store clock: it lapses then unless renewed")

    @classmethod
    def of(cls, r: Reservation) -> ReservationOut:
        return cls(
            room=r.room,
            id=r.id,
            owner=r.owner,
            mode=r.mode,
            paths=list(r.patterns),
            fence=r.fence,
            ttl=r.ttl,
            expires_at=r.expires_at,
        )


class ConflictOut(BaseModel):
    path: str = Field(description="the pattern or path asked about")
    holder: str
    held: str = Field(description="the holder's overlapping pattern")
    reservation: str
    mode: str
    expires_at: float

    @classmethod
    def of(cls, c: PathConflict) -> ConflictOut:
        return cls(
            path=c.pattern,
            holder=c.holder,
            held=c.held,
            reservation=c.reservation,
            mode=c.mode,
            expires_at=c.expires_at,
        )


class CheckOut(BaseModel):
    conflicts: list[ConflictOut]


class ReservationsOut(BaseModel):
    reservations: list[ReservationOut]


@router.post(
    "/reserve",
    summary="Reserve a set of path patterns, all or none",
    responses=errors(409),
)
async def reserve(access: LocksWrite, body: ReserveIn) -> ReservationOut:
    """``409 paths_reserved`` names the holder, its pattern and the pattern asked for."""
    agent = act_as(access.principal, body.agent)
    reservation = await access.room.paths.reserve(body.paths, agent, mode=body.mode, ttl=body.ttl)
    return ReservationOut.of(reservation)


@router.post(
    "/{reservation}/renew",
    summary="Extend a reservation still held",
    responses=errors(409),
)
async def renew(access: LocksWrite, reservation: ReservationId, body: RenewIn) -> ReservationOut:
    """``409 paths_lost`` if it lapsed, was released or reclaimed, or is another agent's."""
    return ReservationOut.of(await access.room.paths.renew(reservation, access.agent, body.ttl))


@router.post("/{reservation}/release", summary="Release a reservation")
async def release(access: LocksWrite, reservation: ReservationId) -> Released:
    """``released: false`` when it had lapsed, was gone, or is another agent's."""
    return Released(released=await access.room.paths.release(reservation, access.agent))


@router.post("/check", summary="Conflicts with other agents' reservations")
async def check(access: RoomsRead, body: CheckIn) -> CheckOut:
    """What would stand in the way of the token's agent reserving ``paths`` in
    ``mode`` (exclusive, the default: it is about to write them)."""
    found = await access.room.paths.check(body.paths, access.agent, mode=body.mode)
    return CheckOut(conflicts=[ConflictOut.of(c) for c in found])


@router.get("", summary="The live reservations")
async def held(
    access: RoomsRead, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000
) -> ReservationsOut:
    reservations = await access.room.paths.held(limit)
    return ReservationsOut(reservations=[ReservationOut.of(r) for r in reservations])
