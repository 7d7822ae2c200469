"""The watchdog's judgement of one live run (executor/run/watchdog.py `assess`, pure), and its loop on a clock moved
by hand."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any, cast

from executor.run.watchdog import (AWAITING_USER, MAX_RUNTIME, RUNNING, STALLED, Limits, Verdict, Watched, Watchdog,
                                   assess)
from shared import timers
from shared.availability import Availability
from shared.models import NewEvent

LIMITS = Limits(stall_timeout_s=60.0, max_runtime_s=None)


def _watched(**kw: object) -> Watched:
    base: dict[str, object] = {"started": 0.0, "last_output": 0.0, "stalled_since": None,
                               "awaiting_user": False, "asking": False}
    return Watched(**{**base, **kw})  # type: ignore[arg-type]  # each field's value, checked when Watched is built


def test_a_run_that_speaks_is_left_alone() -> None:
    assert assess(_watched(last_output=100.0), 120.0, LIMITS) == Verdict(None, None, False, 100.0, None, None)


def test_silence_up_to_the_threshold_is_not_a_stall_and_past_it_is_said_once() -> None:
    assert assess(_watched(last_output=100.0), 159.9, LIMITS).stalled_since is None
    v = assess(_watched(last_output=100.0), 160.0, LIMITS)
    assert (v.activity, v.stalled_since, v.stalled_after_s) == (STALLED, 160.0, 60.0)
    # already stalled: nothing more until it speaks again
    again = assess(_watched(last_output=100.0, stalled_since=160.0), 500.0, LIMITS)
    assert again == Verdict(None, None, False, 100.0, 160.0, None)


def test_a_pending_question_is_not_a_stall_and_its_silence_counts_from_the_answer() -> None:
    asked = assess(_watched(last_output=0.0, asking=True), 1_000.0, LIMITS)
    assert asked == Verdict(None, AWAITING_USER, True, 1_000.0, None, None)
    # still waiting: recorded already, the clock keeps being reset
    waiting = assess(_watched(last_output=1_000.0, awaiting_user=True, asking=True), 1_500.0, LIMITS)
    assert waiting == Verdict(None, None, True, 1_500.0, None, None)
    # answered: running again, and silent only since the last look
    answered = assess(_watched(last_output=1_500.0, awaiting_user=True), 1_501.0, LIMITS)
    assert answered == Verdict(None, RUNNING, False, 1_500.0, None, None)
    assert assess(_watched(last_output=1_500.0), 1_559.0, LIMITS).activity is None
    assert assess(_watched(last_output=1_500.0), 1_560.0, LIMITS).activity == STALLED


def test_past_the_runtime_cap_the_run_is_stopped_whatever_else_it_is_doing() -> None:
    capped = Limits(stall_timeout_s=60.0, max_runtime_s=300.0)
    assert assess(_watched(started=0.0, last_output=299.0), 300.0, capped).stop is None
    assert assess(_watched(started=0.0, last_output=300.0), 300.5, capped).stop == MAX_RUNTIME
    assert assess(_watched(started=0.0, last_output=0.0, asking=True), 301.0, capped).stop == MAX_RUNTIME
    assert assess(_watched(started=0.0, stalled_since=200.0), 301.0, capped).stop == MAX_RUNTIME
    # no cap: never
    assert assess(_watched(started=0.0, last_output=10**6), 10**6, LIMITS).stop is None


def test_looked_at_every_interval_a_run_is_stopped_within_one_interval_past_its_cap_never_before() -> None:
    # the watchdog's looks, one interval apart from a start that is not on the interval's grid: the first
    # look that stops the run comes after the cap and at most one interval past it (then the grace, then
    # SIGKILL: cap + interval + grace bounds a run, tests/fault/test_graceful_stop.py measures it for real)
    cap, interval = 300.0, 0.2
    for started in (0.0, 0.05, 0.13, 7.19):
        capped = Limits(stall_timeout_s=60.0, max_runtime_s=cap)
        looks = (started + i * interval for i in range(1, 10_000))
        stopped_at = next(t for t in looks if assess(_watched(started=started, last_output=t), t, capped).stop)
        assert cap < stopped_at - started <= cap + interval + 1e-9, (started, stopped_at - started)


def test_a_stalled_run_that_was_awaiting_the_user_ends_stalled() -> None:
    v = assess(_watched(last_output=0.0, awaiting_user=True), 100.0, LIMITS)
    assert (v.activity, v.awaiting_user, v.stalled_since) == (STALLED, False, 100.0)


# ---- the loop: looks every interval on a clock moved by hand, over fakes of the store, the runner and the writer


class _Proc:
    returncode: int | None = None


class _Run:
    """The fields of a live run the watchdog reads and writes."""

    def __init__(self, started: float):
        self.task_id, self.session_id, self.project_id = uuid.uuid4(), uuid.uuid4(), None
        self.proc = _Proc()
        self.started = self.last_output = started
        self.stalled_since: float | None = None
        self.awaiting_user = False
        self.unsaved = self.output_dirty = False
        self.last_output_at = None


class _Fakes:
    def __init__(self) -> None:
        self.asking: set[uuid.UUID] = set()
        self.activity: list[tuple[uuid.UUID, str]] = []
        self.stops: list[tuple[uuid.UUID, str]] = []
        self.events: list[NewEvent] = []
        self.looks = 0
        self.looked = asyncio.Event()

    # the store
    async def asking_tasks(self, task_ids: list[uuid.UUID]) -> set[uuid.UUID]:
        self.looks += 1
        self.looked.set()
        return self.asking & set(task_ids)

    # the runner
    async def set_activity(self, r: _Run, activity: str) -> None:
        self.activity.append((r.task_id, activity))

    async def request_stop(self, r: _Run, reason: str) -> None:
        self.stops.append((r.task_id, reason))

    # the writer
    async def put(self, event: NewEvent) -> None:
        self.events.append(event)

    async def look(self, count: int) -> None:
        async with asyncio.timeout(5):
            while self.looks < count:
                self.looked.clear()
                await self.looked.wait()


async def test_the_watchdog_looks_every_interval_and_says_a_stall_once_and_stops_a_run_past_its_cap() -> None:
    clock = timers.ManualClock()
    fakes = _Fakes()
    run = _Run(started=0.0)
    # the fakes stand in for the store, the writer and the runner; the run for a Running
    dog = Watchdog(cast(Any, fakes), cast(Any, fakes), cast(Any, fakes), lambda: [cast(Any, run)],
                   Limits(stall_timeout_s=60.0, max_runtime_s=90.0), 1.0, Availability("t"), clock=clock)
    looking = asyncio.create_task(dog.run())
    try:
        assert await clock.asleep() == [1.0]  # the first look after an interval
        assert fakes.looks == 0
        clock.advance(59.0)  # one look, at 59 s: still speaking within the threshold
        await fakes.look(1)
        assert fakes.activity == [] and await clock.asleep(at=60.0) == [60.0]
        clock.advance(1.0)
        await fakes.look(2)
        await clock.asleep(at=61.0)
        assert fakes.activity == [(run.task_id, STALLED)] and run.stalled_since == 60.0
        assert [(e.event_type, e.payload["silent_s"]) for e in fakes.events] == [("task.stalled", 60.0)]
        clock.advance(1.0)  # at 61: stalled already, nothing more is said
        await clock.asleep(at=62.0)
        assert len(fakes.activity) == len(fakes.events) == 1 and fakes.stops == []
        clock.advance(29.0)  # at 90: not past the cap yet
        await clock.asleep(at=91.0)
        assert fakes.stops == []
        clock.advance(1.0)  # at 91: past it
        await clock.asleep(at=92.0)
        assert fakes.stops == [(run.task_id, MAX_RUNTIME)]
    finally:
        looking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await looking
