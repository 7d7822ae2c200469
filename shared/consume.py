"""The one loop every consumer of the store runs: wait for a NOTIFY or the poll, run the passes that can have
work, repeat a pass while it finds some, and outlive both an outage and a pass's bug.

A loop is its passes plus one `consume(...)` call. A pass is a coroutine function that reads the store,
acts, and returns something truthy when it did work (it runs again at once: a claim query has a LIMIT)
or falsy when there was nothing left. `passes_by_channel` says which passes a notification on a channel
can have given work; a channel it does not name, a RESYNC (the listener reconnected, or the
subscriber's queue overflowed: notifications were lost) and every poll run all of them, in the order
they are first named; passes registered under `POLL_ONLY` run only then. The first round runs all of
them too (what happened while nobody listened).

An outage is waited out through `Availability` (said once, with back-off), after which every pass runs
again; the loop never ends on one. Any other error of a pass is logged once — again only after the pass
has succeeded in between — and the loop goes on; the next poll tries that pass again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from shared import logs
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


def due_passes(notes: Sequence[Notification | None], passes_by_channel: Mapping[str, Sequence[Pass]]) -> list[Pass]:
    """The passes a wake-up calls for, in their order: None stands for the poll (pure)."""
    every = ordered_passes(passes_by_channel)
    if any(n is None or n is RESYNC or n.channel not in passes_by_channel for n in notes):
        return every
    wanted = {p for n in notes if n is not None for p in passes_by_channel[n.channel]}
    return [p for p in every if p in wanted]


def nudge(subscription: Subscription) -> None:
    """Wake a loop consuming `subscription` from inside the process (all its passes run): for a change that
    sends no NOTIFY of its own. A full queue is left as it is: its loop is about to run all of them."""
    with contextlib.suppress(asyncio.QueueFull):
        subscription.queue.put_nowait(RESYNC)


def _name(p: Pass) -> str:
    return getattr(p, "__name__", repr(p))


async def _next(subscription: Subscription, poll_s: float, stop: asyncio.Event | None,
                debounce_s: float) -> list[Notification | None]:
    """What woke the loop: every notification queued by then, or [None] for the poll (or the stop)."""
    getter = asyncio.ensure_future(subscription.get())
    waits: set[asyncio.Future[Any]] = {getter}
    if stop is not None:
        waits.add(asyncio.ensure_future(stop.wait()))
    try:
        await asyncio.wait(waits, timeout=poll_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()  # a cancelled Queue.get() leaves its item in the queue
    if not getter.done() or getter.cancelled():
        return [None]
    notes: list[Notification | None] = [getter.result()]
    if debounce_s > 0:
        await asyncio.sleep(debounce_s)  # let a burst land, then take it in one round
    while not subscription.queue.empty():
        notes.append(subscription.queue.get_nowait())
    return notes


async def consume(name: str, subscription: Subscription, passes_by_channel: Mapping[str, Sequence[Pass]],
                  poll_s: float, availability: Availability, stop: asyncio.Event | None = None, *,
                  debounce_s: float = 0.0) -> None:
    """Run the passes as their channels fire (and all of them every `poll_s`) until `stop` is set or the
    task is cancelled. `debounce_s`: after a notification, wait this long and take what came meanwhile
    together (a loop woken by every journal line)."""
    every = ordered_passes(passes_by_channel)
    due = every
    failing: dict[str, int] = {}  # pass → unexpected failures in a row (the first one is logged)
    recovering = False  # an outage was waited out: the first clean round says the database is back
    while stop is None or not stop.is_set():
        try:
            for p in due:
                await _drain(name, p, failing, stop)
        except OUTAGE_ERRORS as exc:
            recovering = True
            due = every  # what the outage interrupted, and what it hid
            await availability.pause(exc, name, stop)
            continue
        if recovering:
            recovering = False
            availability.succeeded()
        due = due_passes(await _next(subscription, poll_s, stop, debounce_s), passes_by_channel)


async def _drain(name: str, p: Pass, failing: dict[str, int], stop: asyncio.Event | None) -> None:
    """Run one pass until it finds nothing to do; an outage error is the caller's."""
    pass_name = _name(p)
    while stop is None or not stop.is_set():
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
