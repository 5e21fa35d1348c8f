"""The tools of named locks: list, acquire, extend, release."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field

from agentrooms.rooms import Lock, Room
from agentrooms.server.access import command_id, held_grant
from agentrooms.server.auth import Principal
from agentrooms.server.mcp.hints import (
    lost_lock,
)
from agentrooms.server.mcp.tools.base import (
    AfterArg,
    Body,
    LimitArg,
    LockNameArg,
    LockToken,
    RequestId,
    RoomArg,
    ToolsBase,
    _Answered,
    _rounded,
)

WAITERS_SHOWN = 20  # waiters list_locks names per lock, first first


class LockTools(ToolsBase):
    """Named locks."""

    async def acquire_lock(
        self,
        room: RoomArg,
        name: LockNameArg,
        ctx: Context[Any, Any],
        ttl: Annotated[float, Field(gt=0, le=86_400, description="seconds")] = 30.0,
        wait: Annotated[float, Field(ge=0, le=3600, description="seconds to queue")] = 0.0,
        request_id: RequestId = None,
    ) -> CallToolResult:
        """Take a named lock, queueing up to wait s if held. Returns token (for
        extend_lock/release_lock) and fence. lock_held: wait longer or work elsewhere."""

        async def body(principal: Principal, r: Room) -> Body:
            lock = await self._acquire(principal, r, name, ttl, wait, request_id)
            return {
                "token": lock.token,
                "fence": lock.fence,
                "expires_at": _rounded(lock.expires_at),
                "granted_at": _rounded(lock.granted_at),
            }

        return await self.run(ctx, room, "locks:write", body)

    async def _acquire(
        self,
        principal: Principal,
        r: Room,
        name: str,
        ttl: float,
        wait: float,
        request_id: str | None,
    ) -> Lock:
        locks, cmd = r.locks, command_id(principal, request_id)
        if wait > 0:
            timeout = min(wait, self.limits.max_lock_wait)
            return await locks.wait_acquire(
                name, principal.agent, ttl=ttl, timeout=timeout, command_id=cmd
            )
        return await locks.try_acquire(name, principal.agent, ttl=ttl, command_id=cmd)

    async def release_lock(
        self,
        room: RoomArg,
        name: LockNameArg,
        token: LockToken,
        ctx: Context[Any, Any],
    ) -> CallToolResult:
        """Release a lock you hold (the next waiter gets it). released=false: it had
        expired or changed hands already."""

        async def body(principal: Principal, r: Room) -> Body:
            held = await held_grant(r, name, principal.agent, token)
            if held is None:
                return {"released": False}
            lock = Lock(r.name, name, principal.agent, token, held.value["fence"], 0.0, 0.0)
            return {"released": await r.locks.release(lock)}

        return await self.run(ctx, room, "locks:write", body, "lock")

    async def extend_lock(
        self,
        room: RoomArg,
        name: LockNameArg,
        token: LockToken,
        ctx: Context[Any, Any],
        ttl: Annotated[float, Field(gt=0, le=86_400, description="seconds")] = 30.0,
    ) -> CallToolResult:
        """Keep a lock you hold ttl s more. stale_fence: acquire_lock again."""

        async def body(principal: Principal, r: Room) -> Body:
            held = await held_grant(r, name, principal.agent, token)
            if held is None:
                raise _Answered(lost_lock(name))
            value = held.value
            lock = Lock(r.name, name, principal.agent, token, value["fence"], 0.0, value["ttl"])
            extended = await r.locks.extend(lock, ttl)
            return {"fence": extended.fence, "expires_at": _rounded(extended.expires_at)}

        return await self.run(ctx, room, "locks:write", body, "lock")

    async def list_locks(
        self,
        room: RoomArg,
        ctx: Context[Any, Any],
        limit: LimitArg = 100,
        after: AfterArg = None,
    ) -> CallToolResult:
        """Held locks: holder, since, fence, expires_at, first waiters; next: pass as
        after for more."""

        async def body(principal: Principal, r: Room) -> Body:
            out = []
            held = await r.locks.held(limit, after)
            for info in held:
                line = await r.locks.waiters(info.name, WAITERS_SHOWN)
                out.append(
                    {
                        "name": info.name,
                        "holder": info.owner,
                        "since": _rounded(info.granted_at),
                        "fence": info.fence,
                        "expires_at": _rounded(info.expires_at),
                        "waiters": [w.owner for w in line] or None,
                    }
                )
            return {"locks": out, "next": held[-1].name if len(held) == limit else None}

        return await self.run(ctx, room, "rooms:read", body, "lock")
