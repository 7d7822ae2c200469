"""The one loop every consumer of the store runs: wait for a NOTIFY or the poll, run the passes that can have
work, repeat a pass while it finds some, and outlive both an outage and a pass's bug.

A loop is its passes plus one `consume(...)` call. A pass is a coroutine function that reads the store,
acts, and returns something truthy when it did work (it runs again at once: a claim query has a LIMIT)
or falsy when there was nothing left. `passes_by_channel` says which passes a notification on a channel
can have given work; a channel it does not name, a RESYNC (the listener reconnected, or the
subscriber's queue overflowed: notifications were lost) and every poll run all of them, in the order
they are first named; passes registered under `POLL_ONLY` run only then. The first round runs all of
them too (what happened while nobody listened).

The poll comes `poll_s` after the last round that ran every pass, however many notifications came
between (a loop woken more often than its poll still gets its backstop). A `Wake` wakes the loop from inside
the process without a notification: for the passes of one key (a timer's instant, shared/timers.py) or all
of them. Time is read from an injected clock (`shared.timers.Clock`), so a unit test moves it by hand.

An outage is waited out through `Availability` (said once, with back-off), after which every pass runs
again; the loop never ends on one. Any other error of a pass is logged once — again only after the pass
has succeeded in between — and the loop goes on; the next poll tries that pass again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from shared import aio, logs, timers
from shared.availability import OUTAGE_ERRORS, Availability
from shared.listener import RESYNC, Notification, Subscription

log = logs.get(__name__)

Pass = Callable[[], Awaitable[object]]
# The key for passes only the poll (and a resync) runs: no notification comes on a channel named so.
POLL_ONLY = ""


def ordered_passes(passes_by_channel: Mapping[str, Sequence[Pass]]) -> list[Pass]:
    """Every registered pass once, in the order first named (pure)."""
    seen: list[Pass] = []
    for passes in passes_by_channel.values():
        seen.extend(p for p in passes if p not in seen)
    return seen


def due_passes(keys: Sequence[str | None], passes_by_channel: Mapping[str, Sequence[Pass]]) -> list[Pass]:
    """The passes a wake-up calls for, in their order: a key is a notification's channel or a `Wake`'s key;
    None (the poll, a resync, a wake for everything) and a key no pass names call for all of them (pure)."""
    every = ordered_passes(passes_by_channel)
    if _is_full(keys, passes_by_channel):
        return every
    wanted = {p for k in keys if k is not None for p in passes_by_channel[k]}
    return [p for p in every if p in wanted]


def _is_full(keys: Sequence[str | None], passes_by_channel: Mapping[str, Sequence[Pass]]) -> bool:
    return any(k is None or k not in passes_by_channel for k in keys)


def channel_key(note: Notification) -> str | None:
    """The key a notification wakes: its channel, or None (every pass) for a RESYNC."""
    return None if note is RESYNC else note.channel


class Wake:
    """Wakes a consume loop from inside the process, without a notification: `ring(key)` runs the passes
    registered under `key` (a timer's instant: shared/timers.py), `ring()` all of them. A ring while the loop
    runs a round is kept for the next."""

    def __init__(self) -> None:
        self._keys: list[str | None] = []
        self._rung = asyncio.Event()

    def ring(self, key: str | None = None) -> None:
        if key not in self._keys:
            self._keys.append(key)
        self._rung.set()

    async def wait(self) -> None:
        await self._rung.wait()

    def take(self) -> list[str | None]:
        """The keys rung since the last take."""
        keys, self._keys = self._keys, []
        self._rung.clear()
        return keys


def _name(p: Pass) -> str:
    return getattr(p, "__name__", repr(p))


def _queued(subscription: Subscription) -> list[str | None]:
    keys: list[str | None] = []
    while not subscription.queue.empty():
        keys.append(channel_key(subscription.queue.get_nowait()))
    return keys


async def _next(subscription: Subscription, wait_s: float, stop: asyncio.Event | None, debounce_s: float,
                wake: Wake | None, clock: timers.Clock) -> list[str | None] | None:
    """What woke the loop: the keys of every notification queued by then and of the wake's rings, or None
    when the wait ran out (the poll: what is queued is taken with it) or the loop is stopping."""
    if wait_s <= 0:  # the poll is due now, whatever else is waiting
        _queued(subscription)
        if wake is not None:
            wake.take()
        return None
    getter = asyncio.ensure_future(subscription.get())
    waits: set[asyncio.Future[Any]] = {getter, asyncio.ensure_future(clock.sleep(wait_s))}
    if stop is not None:
        waits.add(asyncio.ensure_future(stop.wait()))
    if wake is not None:
        waits.add(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()  # a cancelled Queue.get() leaves its item in the queue
    got = getter.done() and not getter.cancelled()
    keys = [channel_key(getter.result())] if got else []
    if got and debounce_s > 0:
        await clock.sleep(debounce_s)  # let a burst land, then take it in one round
    keys += _queued(subscription)
    if wake is not None:
        keys += wake.take()
    return keys or None


async def consume(name: str, subscription: Subscription, passes_by_channel: Mapping[str, Sequence[Pass]],
                  poll_s: float, availability: Availability, stop: asyncio.Event | None = None, *,
                  debounce_s: float = 0.0, wake: Wake | None = None, clock: timers.Clock = timers.MONOTONIC) -> None:
    """Run the passes as their channels fire (and all of them every `poll_s`) until `stop` is set or the
    task is cancelled. `debounce_s`: after a notification, wait this long and take what came meanwhile
    together (a loop woken by every journal line). `wake`: rung from inside the process (see `Wake`)."""
    every = ordered_passes(passes_by_channel)
    due, full = every, True
    full_at = clock.now()  # the end of the last round that ran every pass: the poll counts from there
    failing: dict[str, int] = {}  # pass → unexpected failures in a row (the first one is logged)
    recovering = False  # an outage was waited out: the first clean round says the database is back
    while stop is None or not stop.is_set():
        aio.raise_if_cancelled()  # a cancel a pass swallowed (a pool's wait for a connection) ends the loop here
        try:
            for p in due:
                await _drain(name, p, failing, stop)
        except OUTAGE_ERRORS as exc:
            recovering = True
            due, full = every, True  # what the outage interrupted, and what it hid
            await availability.pause(exc, name, stop)
            continue
        if recovering:
            recovering = False
            availability.succeeded()
        if full:
            full_at = clock.now()
        aio.raise_if_cancelled()  # not to wait for the next notification first
        keys = await _next(subscription, full_at + poll_s - clock.now(), stop, debounce_s, wake, clock)
        full = keys is None or _is_full(keys, passes_by_channel)
        due = every if keys is None else due_passes(keys, passes_by_channel)


async def _drain(name: str, p: Pass, failing: dict[str, int], stop: asyncio.Event | None) -> None:
    """Run one pass until it finds nothing to do; an outage error is the caller's."""
    pass_name = _name(p)
    while stop is None or not stop.is_set():
        aio.raise_if_cancelled()
        try:
            worked = await p()
        except OUTAGE_ERRORS:
            raise
        except Exception:  # noqa: BLE001 - the loop outlives a pass's bug; the next poll tries the pass again
            failing[pass_name] = failing.get(pass_name, 0) + 1
            if failing[pass_name] == 1:  # once per run of failures: a pass failing at every poll would flood
                log.exception("loop_pass_failed", loop=name, step=pass_name)
            return
        if pass_name in failing:
            log.warning("loop_pass_recovered", loop=name, step=pass_name, failures=failing.pop(pass_name))
        if not worked:
            return
