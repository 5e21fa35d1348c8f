"""Submissions grouped into one transact: the unnamed submissions to one queue that this
process makes in one step of its event loop through one store handle are sent as one
transact, as a group commit.

A submission's transact compares nothing of its own (only the room's existence and
archive state, the same for every submission to the room) and never conflicts with
another, so putting several in one changes what they cost, not what they do: each is its
``wq.submitted`` append and its member of the queued set, numbered by the store in the
order they were made. The group is all or nothing, as each submission alone was: a room
deleted or archived fails every member with its own error; a store failure leaves every
member in doubt, as it would have left each alone. A group the store refuses before
writing anything (``BadRequest``: one submission over a limit) is sent again one
submission at a time, so that only the one at fault is refused.

No submission waits for another: the group is sent at the next step of the event loop,
after the submitters that were ready in the same step (typically the waiters one batch of
outcomes woke) have joined it; groups are not serialized behind each other. A group is per
handle: submitters spread over several handles keep the connections they were given
(funnelled through one handle, the retries of conditional intents queued behind each
other on its connections, missed the batch after their read, and the queue's round
robin suffered), and a handle closed by its owner fails only its own submissions.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agentrooms.errors import BadRequest
from agentrooms.rooms.follow import following, tell
from agentrooms.rooms.scope import Scope
from agentrooms.store.types import Append, Put, SetAdd, appended

__all__ = ["GROUP", "member", "send"]

GROUP = 64  # submissions in one transact, at most


@dataclass(slots=True)
class _Member:
    queued: SetAdd
    submitted: Append
    marker: Put | None  # the queue's marker record, written by an IntentQueue's first
    done: asyncio.Future[None] | None = None  # its submission's outcome


@dataclass(slots=True)
class _Group:
    scope: Scope
    key: tuple[str, str, asyncio.AbstractEventLoop]
    members: list[_Member] = field(default_factory=list)
    task: asyncio.Future[None] | None = None


_GroupKey = tuple[str, str, asyncio.AbstractEventLoop]


async def send(scope: Scope, queue: str, member: _Member) -> None:
    """Send ``member`` (a submission to ``queue`` in ``scope``'s room) in this step's
    group; returns once its transact committed, raises what it raised."""
    groups: dict[_GroupKey, _Group] = scope.store.session.groups
    key = (scope.room, queue, asyncio.get_running_loop())
    group = groups.get(key)
    limits = scope.store.limits
    if group is None or len(group.members) >= min(GROUP, (limits.max_ops - 4) // 2):
        group = groups[key] = _Group(scope, key)
        group.task = asyncio.ensure_future(_flush(groups, group))
    member.done = asyncio.get_running_loop().create_future()
    group.members.append(member)
    await member.done  # cancelling it leaves the group alone


def member(queued: SetAdd, submitted: Append, marker: Put | None) -> _Member:
    return _Member(queued, submitted, marker)


async def _flush(groups: dict[_GroupKey, _Group], group: _Group) -> None:
    """Send the group (closed to newcomers first) and tell each member how it went."""
    if groups.get(group.key) is group:
        del groups[group.key]
    members = group.members
    try:
        await _transact(group.scope, members)
    except BadRequest as exc:
        if len(members) == 1:
            _tell(members[0], exc)
            return
    except BaseException as exc:
        for one in members:
            _tell(one, exc)
        if not isinstance(exc, Exception):
            raise
        return
    else:
        for one in members:
            _tell(one, None)
        return
    try:
        for one in members:  # refused before anything was written: find the one at fault
            try:
                await _transact(group.scope, [one])
            except Exception as exc:
                _tell(one, exc)
            else:
                _tell(one, None)
    finally:  # cancelled meanwhile: the members not sent yet are cancelled too
        for one in members:
            _tell(one, asyncio.CancelledError())


def _tell(member: _Member, error: BaseException | None) -> None:
    done = member.done
    if done is None or done.done():  # its submitter stopped waiting
        return
    if error is None:
        done.set_result(None)
    elif isinstance(error, Exception):
        done.set_exception(error)
    else:
        done.cancel()


async def _transact(scope: Scope, members: list[_Member]) -> None:
    """One transact of ``members``; its events are told to this process's follower of the
    room (which then need not read them back, see :func:`agentrooms.rooms.follow.tell`)."""
    markers = [m.marker for m in members if m.marker is not None]
    writes: list[Put | SetAdd] = [m.queued for m in members] + markers[:1]
    appends = [m.submitted for m in members]
    done = await scope.transact((), writes, appends)
    if following(scope.store, scope.room):
        tell(scope.store, scope.room, appended(done.seqs, appends, done.now))
