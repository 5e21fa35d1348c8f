"""One reader of a room's log per process, shared by every local waiter.

A waiter that sleeps on ``Store.watch`` is woken by *every* append to the room, and then
has to read something to learn whether the append concerned it. With many waiters in one
process (48 agents queued on one lock) each append costs one store read per waiter, and
the store spends its time answering questions whose answer is "not yet".

A :class:`Follower` instead reads the room's log once per batch of new events, for all
the waiters of this process, and hands each waiter only the events meant for it:
one ``Store.follow_log`` per batch (one round trip on Redis; a watch and a read on the
other backends, or the watch alone when the batch is this process's own appends, told
already: see below), whatever the number of waiters.

Guarantee: a subscription sees every matching event appended after :func:`follow`
returned it (the follower's position was read before the subscription existed, and it
only ever moves forward over events it has dispatched). Events from a little earlier may
be delivered too; ``match`` should be cheap and the waiter tolerant of them.

An event this process appended itself can be handed to the local subscriptions at once
(:func:`tell`), from the write's own result, ahead of the follower reading it back from
the log: a lock handed to a waiter of the same process wakes it without waiting for the
log's round trip. Whichever comes first hands the event out, and the other skips it: the
follower does not hand out again an event it reads back after it was told, and ``tell``
skips one the follower has read already. Either way every subscription that existed then
got it, and a later one is not owed it (the event was appended before it existed).

Handles of one store share their followers: the follower is per room, event loop and
:attr:`Store.identity <agentrooms.store.base.Store.identity>` (the data a handle reaches),
not per handle (their sessions share them: :mod:`agentrooms.session`). A process that
opens several handles to one Redis or PostgreSQL store (agents hosted eight to a
handle, say) reads each room's log once, not once per handle,
and an event told by one handle wakes the waiters of the others. The follower reads
through the handle of one of its subscriptions; if that read fails, it moves to another
subscription's handle, in case the first was closed.

A subscription either has a ``match`` (every event is offered to it) or names *routes*:
keys that :func:`route` functions, registered per event type, compute from an event.
The follower hands an event to the subscriptions of its key with one dict lookup, so 48
waiters of one lock cost one lookup per handoff, where 48 ``match`` calls would run. An
event that concerns many waiters (one that settles a batch of intents) has many keys
(:func:`route_many`): one lookup per key.

When the follower cannot tell what it missed (the log was trimmed past its position, or
the store failed), every subscription is told to *resync*: re-read the state it waits on
instead of relying on events.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Hashable, Iterable
from dataclasses import dataclass, field

from agentrooms.errors import CursorCompacted
from agentrooms.store.base import Store
from agentrooms.store.types import Event

IDLE_WATCH = 5.0  # seconds one watch() waits before the follower looks again
PAGE = 1000  # events per read_log while catching up
FAILURE_PAUSE = 0.1  # seconds between tries after the store failed
TOLD_STEPS = 3  # steps of the event loop the follower waits for this process's tell()


_routes: dict[str, Callable[[Event], Hashable]] = {}
_many: dict[str, Callable[[Event], Iterable[Hashable]]] = {}


def route(event_type: str, key: Callable[[Event], Hashable]) -> None:
    """Route events of ``event_type`` by ``key(event)``: they go to the subscriptions
    that name that key (besides those whose ``match`` accepts them). ``key`` must not
    raise, and should return ``None`` for an event it cannot route (any data can be
    appended under any type)."""
    _routes[event_type] = key


def route_many(event_type: str, keys: Callable[[Event], Iterable[Hashable]]) -> None:
    """Route events of ``event_type`` by every key of ``keys(event)``, in its order: to
    the subscriptions of each (a subscription is handed the event once per key of its
    own in it). ``keys`` must not raise; an event it cannot route has none."""
    _many[event_type] = keys


@dataclass(eq=False)
class Subscription:
    """What one waiter has been handed: its events, or a request to resync."""

    match: Callable[[Event], bool] | None  # None: only the events of its routes
    store: Store  # the handle its waiter uses: the follower may read through it
    routes: tuple[Hashable, ...] = ()
    events: list[Event] = field(default_factory=list)
    resync: bool = False
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def _deliver(self, event: Event) -> None:
        self.events.append(event)
        self._ready.set()

    def _ask_resync(self) -> None:
        self.resync = True
        self._ready.set()

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for an event or a resync; ``True`` if either
        came (read and clear them with :meth:`take`)."""
        if not self._ready.is_set():
            # asyncio.timeout, not wait_for: no task of its own, so a wake-up is one
            # step of the event loop, not three
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, timeout)):
                    await self._ready.wait()
        return self._ready.is_set()

    def take(self) -> tuple[list[Event], bool]:
        """The events delivered since the last ``take``, and whether to resync."""
        events, resync = self.events, self.resync
        self.events, self.resync = [], False
        self._ready.clear()
        return events, resync


class Follower:
    """The process's reader of one room's log; runs while it has subscriptions."""

    def __init__(self, store: Store, room: str) -> None:
        self.store = store
        self.room = room
        self.subscriptions: set[Subscription] = set()
        self._matching: dict[Subscription, Callable[[Event], bool]] = {}  # -> its match
        self._routed: dict[Hashable, set[Subscription]] = {}  # route -> its subscriptions
        self._position: int | None = None
        self._told: set[int] = set()  # seqs handed out by tell(), not yet read back
        self._telling = False  # the last events found were all told already
        self._started: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def subscribe(
        self, match: Callable[[Event], bool] | None, store: Store, routes: tuple[Hashable, ...]
    ) -> Subscription:
        subscription = Subscription(match, store, routes)
        self.subscriptions.add(subscription)
        if match is not None:
            self._matching[subscription] = match
        for key in routes:
            self._routed.setdefault(key, set()).add(subscription)
        try:
            if self._task is None or self._task.done():
                self._started = asyncio.get_running_loop().create_future()
                self._task = asyncio.get_running_loop().create_task(self._run())
            assert self._started is not None
            if not self._started.done():
                await asyncio.shield(self._started)
            self._started.result()  # raises if the follower could not start
        except BaseException:
            self.unsubscribe(subscription)
            raise
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self.subscriptions.discard(subscription)
        self._matching.pop(subscription, None)
        for key in subscription.routes:
            routed = self._routed.get(key)
            if routed is not None:
                routed.discard(subscription)
                if not routed:
                    del self._routed[key]
        if not self.subscriptions and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        started = self._started
        assert started is not None
        try:
            self._position = await self.store.last_seq(self.room)
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
                started.exception()  # retrieved here; the subscriber re-raises it
            raise
        started.set_result(None)
        while self.subscriptions:
            try:
                if self._position is None:  # lost track: start again from the newest
                    self._position = await self.store.last_seq(self.room)
                    self._resync_all()
                await self._step()
            except asyncio.CancelledError:
                raise
            except CursorCompacted:
                self._position = None
            except Exception:
                # The store failed: waiters fall back to reading their state themselves,
                # and the follower tries again after a pause, through another handle if
                # it has one (this one may have been closed).
                self._resync_all()
                self._switch_handle()
                await asyncio.sleep(FAILURE_PAUSE)

    async def _step(self) -> None:
        position = self._position
        assert position is not None
        # A store whose blocking read returns the events is read that way, unless the
        # last events were all told by this process: then the newest seq alone (watch)
        # may show that there is nothing to read.
        if self.store.follow_returns_events and not self._telling:
            events = await self.store.follow_log(self.room, position, IDLE_WATCH, PAGE)
            if events:
                self._telling = await self._told_soon(events[0].seq, events[-1].seq)
        else:
            seq = await self.store.watch(self.room, position, IDLE_WATCH)
            if seq <= position:
                return
            if await self._told_soon(position + 1, seq):
                self._all_told(position, seq)
                return
            self._telling = False
            events = await self.store.read_log(self.room, position, PAGE)
        if not events:
            return
        self._position = events[-1].seq
        told = self._told
        for event in events:
            if event.seq in told:
                told.discard(event.seq)
                continue
            self._hand_out(event)
        if told:  # told, then skipped over (the follower lost track and started anew)
            told.difference_update([seq for seq in told if seq <= self._position])

    def _hand_out(self, event: Event) -> None:
        """Give ``event`` to the subscriptions of its route and to those it matches
        (delivering only wakes them: none can subscribe or leave meanwhile)."""
        key = _routes.get(event.type)
        if key is not None:
            for subscription in self._routed.get(key(event), ()):
                subscription._deliver(event)
        keys = _many.get(event.type)
        if keys is not None:
            routed = self._routed
            for k in keys(event):
                for subscription in routed.get(k, ()):
                    subscription._deliver(event)
        for subscription, match in self._matching.items():
            if match(event):
                subscription._deliver(event)

    async def _told_soon(self, first: int, last: int) -> bool:
        """Whether the events ``first`` to ``last`` were all told, giving this process's
        own writes a few steps of the event loop to tell theirs (the store may wake the
        follower before the writer has its write's result)."""
        told = self._told
        for _ in range(TOLD_STEPS):
            if all(s in told for s in range(first, last + 1)):
                return True
            await asyncio.sleep(0)
        return all(s in told for s in range(first, last + 1))

    def _all_told(self, position: int, seq: int) -> bool:
        """If every event after ``position`` up to ``seq`` was told (this process
        appended them all, and they were handed out then), move past them without
        reading them back: ``True``. Else ``False``, and nothing changes."""
        told, new = self._told, range(position + 1, seq + 1)
        if len(new) > len(told) or any(s not in told for s in new):
            return False
        told.difference_update(new)
        self._position = seq
        return True

    def _switch_handle(self) -> None:
        for subscription in self.subscriptions:
            if subscription.store is not self.store:
                self.store = subscription.store
                return

    def _resync_all(self) -> None:
        for subscription in list(self.subscriptions):
            subscription._ask_resync()


def tell(store: Store, room: str, events: list[Event]) -> None:
    """Hand ``events``, just appended to ``room`` by this process, to this event loop's
    subscriptions now (see the module's docstring)."""
    follower = store.session.shared.followers.get((room, asyncio.get_running_loop()))
    if follower is None:
        return
    position = follower._position
    for event in events:
        if position is not None and event.seq <= position:
            continue  # the follower has read it back already, and handed it out
        follower._told.add(event.seq)
        follower._hand_out(event)


def following(store: Store, room: str) -> bool:
    """Whether this event loop has a running follower of (``store``'s identity,
    ``room``): a subscription made now would not have to start one (and read the log's
    position first)."""
    follower = store.session.shared.followers.get((room, asyncio.get_running_loop()))
    return follower is not None and follower._task is not None and not follower._task.done()


@contextlib.asynccontextmanager
async def follow(
    store: Store,
    room: str,
    match: Callable[[Event], bool] | None = None,
    *,
    routes: tuple[Hashable, ...] = (),
) -> AsyncIterator[Subscription]:
    """Subscribe to the room's events that ``match`` accepts, or whose key (see
    :func:`route`) is one of ``routes``, through the one follower of (``store``'s
    identity, ``room``) in this event loop."""
    if (match is None) == (not routes):
        raise ValueError("follow: a match or routes (one of them)")
    key = (room, asyncio.get_running_loop())
    followers = store.session.shared.followers
    follower = followers.get(key)
    if follower is None:
        follower = followers[key] = Follower(store, room)
    try:
        subscription = await follower.subscribe(match, store, routes)
    except BaseException:
        _forget(followers, key, follower)
        raise
    try:
        yield subscription
    finally:
        follower.unsubscribe(subscription)
        _forget(followers, key, follower)


def _forget(
    followers: dict[tuple[str, asyncio.AbstractEventLoop], Follower],
    key: tuple[str, asyncio.AbstractEventLoop],
    follower: Follower,
) -> None:
    """Drop ``follower`` from the registry once it has no subscriptions left."""
    if not follower.subscriptions and followers.get(key) is follower:
        del followers[key]
