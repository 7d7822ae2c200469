"""The one timer loop (shared/timers.py) on a clock moved by hand: when it runs its action, waking it early,
outliving an error or an outage (or not), and stopping. No test here waits on real time but to let the loop run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import psycopg
import pytest
from structlog.testing import capture_logs

from shared import availability as availability_module
from shared import timers
from shared.availability import Availability
from tests.wait import one_step


class Action:
    """An action that records the clock's time at each run, and can be told to raise."""

    def __init__(self, clock: timers.ManualClock):
        self.clock = clock
        self.at: list[float] = []
        self.raises: BaseException | None = None
        self.during: Callable[[], None] | None = None
        self._ran = asyncio.Event()

    async def __call__(self) -> None:
        self.at.append(self.clock.now())
        self._ran.set()
        if self.during is not None:
            self.during()
        if self.raises is not None:
            raise self.raises

    async def runs(self, count: int) -> list[float]:
        """The times of the runs once there are at least `count` of them (bounded in real time)."""
        async with asyncio.timeout(5):
            while len(self.at) < count:
                self._ran.clear()
                await self._ran.wait()
        return list(self.at)


@asynccontextmanager
async def running(timer: timers.Timer) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(timer.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        async with asyncio.timeout(5):
            await task  # ends on stop: a timer that needed cancelling would hang here


async def test_an_interval_timer_runs_its_action_after_each_interval_never_before() -> None:
    clock = timers.ManualClock()
    act = Action(clock)
    async with running(timers.every("t", 5.0, act, clock=clock)):
        assert await clock.asleep() == [5.0]
        clock.advance(4.9)
        await one_step()
        assert act.at == [] and clock.deadlines == [5.0]
        clock.advance(0.1)
        assert await clock.asleep() == [10.0] and act.at == [5.0]
        clock.advance(5.0)
        assert await clock.asleep() == [15.0] and act.at == [5.0, 10.0]


async def test_at_start_runs_at_once_and_a_due_function_chooses_each_wait() -> None:
    clock = timers.ManualClock()
    act = Action(clock)
    waits = iter([3.0, 7.0, 1.0])

    async def due() -> float:  # an async one, as a query for the next instant is
        return next(waits)

    async with running(timers.every("t", due, act, clock=clock, at_start=True)):
        assert await clock.asleep() == [3.0] and act.at == [0.0]
        clock.advance(3.0)
        assert await clock.asleep() == [10.0]
        clock.advance(7.0)
        assert await clock.asleep() == [11.0]
    assert act.at == [0.0, 3.0, 10.0]


async def test_a_due_delay_of_zero_runs_the_action_again_at_once() -> None:
    clock = timers.ManualClock()
    act = Action(clock)
    waits = iter([0.0, 0.0, 2.0])
    async with running(timers.every("t", lambda: next(waits), act, clock=clock, at_start=True)):
        assert await clock.asleep() == [2.0]
    assert act.at == [0.0, 0.0, 0.0]


async def test_a_wake_cuts_the_wait_short_and_one_during_a_run_asks_for_another_at_once() -> None:
    clock = timers.ManualClock()
    act = Action(clock)
    timer = timers.every("t", 60.0, act, clock=clock)
    async with running(timer):
        await clock.asleep()
        clock.advance(1.0)
        timer.wake()
        assert await act.runs(1) == [1.0]
        assert await clock.asleep() == [61.0]  # the next wait counts from the run

        def once() -> None:  # something changed while the action ran: it must look again
            act.during = None
            timer.wake()

        act.during = once
        clock.advance(60.0)
        await clock.asleep()
        assert act.at == [1.0, 61.0, 61.0] and clock.deadlines == [121.0]


async def test_an_error_is_logged_once_while_it_repeats_and_the_timer_goes_on() -> None:
    clock = timers.ManualClock()
    act = Action(clock)
    act.raises = ValueError("a bug")
    with capture_logs() as logged:
        async with running(timers.every("t", 1.0, act, clock=clock)):
            for _ in range(3):
                await clock.asleep()
                clock.advance(1.0)
            await clock.asleep()
            act.raises = None
            clock.advance(1.0)
            await clock.asleep()
    said = [(e["event"], e.get("timer"), e.get("failures")) for e in logged]
    assert act.at == [1.0, 2.0, 3.0, 4.0]
    assert said == [("timer_failed", "t", None), ("timer_recovered", "t", 3)]


async def test_with_survive_false_an_error_ends_the_timer() -> None:
    clock = timers.ManualClock()
    act = Action(clock)
    act.raises = ValueError("cannot go on")
    task = asyncio.create_task(timers.every("t", 1.0, act, clock=clock, survive=False, at_start=True).run())
    with pytest.raises(ValueError, match="cannot go on"):
        async with asyncio.timeout(5):
            await task
    assert act.at == [0.0]


async def test_an_outage_is_waited_out_through_availability_on_the_clock_and_said_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(availability_module, "OUTAGE_DELAYS_S", (2.0, 4.0))
    monkeypatch.setattr(availability_module, "SETTLE_S", 0.0)
    clock = timers.ManualClock()
    act = Action(clock)
    act.raises = psycopg.OperationalError("the server closed the connection")
    available = Availability("t")
    timer = timers.every("t", 10.0, act, clock=clock, availability=available, at_start=True)
    with capture_logs() as logged:
        async with running(timer):
            assert await clock.asleep() == [2.0]  # the back-off, not the interval
            timer.wake()  # a wake does not cut an outage's back-off short
            await one_step()
            assert act.at == [0.0]
            clock.advance(2.0)
            assert await clock.asleep() == [6.0]  # growing
            act.raises = None
            clock.advance(4.0)
            assert await clock.asleep() == [6.0 + 10.0]  # back: the interval again
            down_after = available.down
    said = [e["event"] for e in logged]
    assert act.at == [0.0, 2.0, 6.0] and not down_after
    assert said == ["database_unavailable", "database_available"]


async def test_without_an_availability_an_outage_is_an_error_like_any_other() -> None:
    clock = timers.ManualClock()
    act = Action(clock)
    act.raises = psycopg.OperationalError("gone")
    with capture_logs() as logged:
        async with running(timers.every("t", 1.0, act, clock=clock, at_start=True)):
            assert await clock.asleep() == [1.0]
    assert [e["event"] for e in logged] == ["timer_failed"]


async def test_stop_ends_the_timer_while_it_waits_and_before_a_first_run() -> None:
    clock = timers.ManualClock()
    act = Action(clock)
    async with running(timers.every("t", 3600.0, act, clock=clock)):
        await clock.asleep()
    assert act.at == []  # the context manager's exit proved the stop (it awaits the timer)
    stop = asyncio.Event()
    stop.set()
    await timers.every("t", 1.0, act, clock=clock, at_start=True).run(stop)
    assert act.at == []


async def test_the_system_clock_sleeps_for_real() -> None:
    before = timers.MONOTONIC.now()
    await timers.MONOTONIC.sleep(0.01)  # the one test of the real clock: it must really wait
    assert timers.MONOTONIC.now() - before >= 0.01


async def test_a_cancel_the_action_swallowed_ends_the_timer_before_its_next_wait() -> None:
    """As an action whose wait for a pool connection (Python 3.11's asyncio.wait_for) returned as the cancel came: the
    timer must not go on to wait out its interval (nothing would cancel it again)."""
    clock = timers.ManualClock()
    entered = asyncio.Event()

    async def swallowing() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return

    task = asyncio.create_task(timers.every("t", 5.0, swallowing, clock=clock, at_start=True).run())
    await entered.wait()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)
    assert done == {task} and task.cancelled()
