"""Keeping a lease alive while work runs: the one renewal loop behind
:meth:`agentrooms.rooms.Plan.keep_alive` and the HTTP client's ``keep_alive``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from agentrooms.errors import InvalidTransition, NotFound, StaleFence, StoreUnavailable
from agentrooms.rooms import keys
from agentrooms.rooms.tasks import Lease, LeaseKeeper

Renew = Callable[[Lease, float], Awaitable[Lease]]


@contextlib.asynccontextmanager
async def keep_lease(
    lease: Lease, renew: Renew, *, length: float, interval: float
) -> AsyncIterator[LeaseKeeper]:
    """Call ``renew(lease, length)`` every ``interval`` seconds while the body runs,
    keeping the latest lease in the yielded keeper.

    ``StoreUnavailable`` (the outcome is unknown) is tried again at the next interval. A
    refusal (``StaleFence``, ``InvalidTransition``, ``NotFound``: the lease was taken
    over, the task cancelled or deleted) sets ``keeper.lost``, cancels the body at once
    and raises ``StaleFence`` from this block. The renewer stops when the block ends."""
    keeper = LeaseKeeper(lease)
    body = asyncio.current_task()
    assert body is not None

    async def renew_forever() -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                keeper.lease = await renew(keeper.lease, length)
            except StoreUnavailable:
                continue
            except (StaleFence, InvalidTransition, NotFound) as exc:
                keeper.lost = exc
                keeper.lost_event.set()
                body.cancel()
                return

    renewer = asyncio.create_task(renew_forever())
    try:
        yield keeper
    except asyncio.CancelledError:
        if keeper.lost is not None and body.uncancel() == 0:
            raise StaleFence(keys.task(lease.task_id), lease.fence, None) from keeper.lost
        raise
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer
