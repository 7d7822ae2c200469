"""The one timer loop: run an action at an interval, or at the next instant a function says is due, woken early
on demand, outliving the action's errors (or not), and driven by an injected clock so a test needs no sleep.

    timer = timers.every("watchdog", 1.0, self.tick, availability=availability)
    await timer.run(stop)          # in the owner's task group; `timer.wake()` cuts the current wait short

A timer is the clock-driven sibling of `shared.consume.consume` (the loops that wait on a queue's NOTIFY):
the watchdog's looks, the lease's renewals, the routines' clock, the warm turns' and the spares' upkeep.

- `due` is the wait before each run: seconds, or a function (plain or async) asked before every wait (the
  next scheduled instant, a delay the last run chose). A delay of 0 or less runs the action again at once.
  `due` itself must not raise: an error there ends the timer (a bug of the schedule, not of one run).
- The first run comes after the first wait, or at once with `at_start=True`.
- A `wake()` while the action runs makes the next wait return at once (nothing asked for meanwhile is lost).
- An outage (`shared.availability.OUTAGE_ERRORS`) with an `availability` is waited out through it (said once,
  with back-off; a wake does not cut the back-off short) and the next clean run says the database is back.
  Without one it counts as any other error.
- Any other error of the action is logged once per run of failures (`timer_failed`, then `timer_recovered`)
  and the next run comes after the usual wait; with `survive=False` it ends the timer instead (raised).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from shared import aio, logs
from shared.availability import OUTAGE_ERRORS, Availability

log = logs.get(__name__)

Action = Callable[[], Awaitable[object]]
Due = float | Callable[[], float | Awaitable[float]]


class Clock(Protocol):
    """Monotonic seconds and a sleep: the time a timer (or a consume loop's poll) reads and waits on."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real one: `time.monotonic` and `asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


MONOTONIC: Clock = SystemClock()


class ManualClock:
    """A clock a test moves by hand (`advance`): sleepers wake only when it passes their deadline, so a test
    of a timer or a poll waits on no real time. `asleep()` waits until some task sleeps on it: the point at
    which whatever ran before the sleep has run."""

    def __init__(self, start: float = 0.0):
        self._now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._changed = asyncio.Event()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        entry = (self._now + seconds, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        self._changed.set()
        try:
            await entry[1]
        finally:
            self._sleepers.remove(entry)

    @property
    def deadlines(self) -> list[float]:
        """When the tasks sleeping now wake, soonest first."""
        return sorted(at for at, f in self._sleepers if not f.done())

    async def asleep(self, count: int = 1, *, at: float | None = None, timeout_s: float = 5.0) -> list[float]:
        """Wait (real time, bounded) until at least `count` tasks sleep on this clock, or, with `at`, until one
        sleeps until then (a sleeper from before the awaited step may still be there); their deadlines."""
        async with asyncio.timeout(timeout_s):
            while len(self.deadlines) < count if at is None else at not in self.deadlines:
                self._changed.clear()
                await self._changed.wait()
        return self.deadlines

    def advance(self, seconds: float) -> None:
        """Move the time on; every sleeper whose deadline has come wakes (when the test next awaits)."""
        self._now += seconds
        for at, f in self._sleepers:
            if at <= self._now and not f.done():
                f.set_result(None)


class Timer:
    """One timer loop (made by `every`): `run(stop)` until `stop` is set or the task is cancelled."""

    def __init__(self, name: str, due: Due, action: Action, *, clock: Clock = MONOTONIC, survive: bool = True,
                 availability: Availability | None = None, at_start: bool = False):
        self.name = name
        self.due = due
        self.action = action
        self.clock = clock
        self.survive = survive
        self.availability = availability
        self.at_start = at_start
        self._woken = asyncio.Event()

    def wake(self) -> None:
        """Run the action now rather than at the end of the current wait (or right after the current run)."""
        self._woken.set()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        failures = 0  # errors in a row: the first is logged, and the recovery
        recovering = False  # an outage was waited out: the next clean run says the database is back
        if not self.at_start:
            await self._wait(await self._delay(), stop)
        while stop is None or not stop.is_set():
            self._woken.clear()  # a wake from here on asks for another run
            try:
                await self.action()
            except Exception as exc:  # noqa: BLE001 - said and outlived (survive), or raised below
                if self.availability is not None and isinstance(exc, OUTAGE_ERRORS):
                    recovering = True
                    await self._wait(self.availability.failed(exc, self.name), stop, wakeable=False)
                    continue
                if not self.survive:
                    raise
                failures += 1
                if failures == 1:  # once per run of failures: an action failing at every tick would flood
                    log.exception("timer_failed", timer=self.name)
            else:
                if recovering and self.availability is not None:
                    self.availability.succeeded()
                recovering = False
                if failures:
                    log.warning("timer_recovered", timer=self.name, failures=failures)
                    failures = 0
            await self._wait(await self._delay(), stop)

    async def _delay(self) -> float:
        if not callable(self.due):
            return self.due
        delay = self.due()
        return await delay if inspect.isawaitable(delay) else delay

    async def _wait(self, seconds: float, stop: asyncio.Event | None, *, wakeable: bool = True) -> None:
        """Until `seconds` have passed on the clock, `stop` is set or (when wakeable) `wake()` is called."""
        aio.raise_if_cancelled()  # a cancel the action swallowed (a pool's wait for a connection) ends the timer here
        if stop is not None and stop.is_set():
            return
        if wakeable and self._woken.is_set():
            await asyncio.sleep(0)  # a run asked for meanwhile: at once, but let the loop breathe
            return
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(self.clock.sleep(seconds))}
        if wakeable:
            waits.add(asyncio.ensure_future(self._woken.wait()))
        if stop is not None:
            waits.add(asyncio.ensure_future(stop.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()


def every(name: str, due: Due, action: Action, *, clock: Clock = MONOTONIC, survive: bool = True,
          availability: Availability | None = None, at_start: bool = False) -> Timer:
    """A timer that runs `action` after each wait of `due` (seconds, or a function giving them); see the
    module's docstring for waking, errors and outages."""
    return Timer(name, due, action, clock=clock, survive=survive, availability=availability, at_start=at_start)
