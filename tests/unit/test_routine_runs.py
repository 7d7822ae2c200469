"""A routine run's start and end on the fake query layer (executor/routines/runs.py), and the routines' clock
(executor/routines/service.py) on a clock moved by hand: it wakes the loop at a schedule's instant, never with
a notification."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from executor.routines import runs
from executor.routines.service import INSTANT, Routines, RoutinesConfig
from executor.routines.store import QueuedRun, RoutineRows, RunningRun, RunOutcome
from shared import timers
from tests.fake_queries import FakeWork

NOW = datetime(2025, 3, 4, 9, 30, tzinfo=UTC)
ROUTINE, RUN = uuid.uuid4(), uuid.uuid4()


def queued(**kw: Any) -> QueuedRun:
    row: dict[str, Any] = {
        "id": RUN, "routine_id": ROUTINE, "name": "nightly", "trigger": "schedule", "scheduled_at": NOW,
        "project_id": None, "created_at": NOW, "event": {"who": "cron"}, "mode": "ask", "prompt": "hi {{ event.who }}",
        "overlap": "skip", "overlapping": False, "usd_per_run": None, "usd_per_day": None, "deleted_at": None}
    return QueuedRun.from_row({**row, **kw})


def starter(project_usd_per_day: float | None = None) -> runs.Starter:
    return runs.Starter(cast(AsyncConnectionPool, None), lambda: NOW, project_usd_per_day)


def inserted(params: Any) -> dict[str, Any]:
    return {"id": params["id"]}


@pytest.mark.parametrize(("run", "answers", "reason"), [
    (queued(deleted_at=NOW), {}, "the routine was deleted"),
    (queued(overlapping=True), {}, "overlap: the previous run is still going"),
    (queued(usd_per_day=Decimal("5"), usd_per_run=Decimal("1")), {"get_routine_spend_today": {"usd": 4.5}},
     "budget: 4.50 of 5.00 USD spent today"),
    (queued(usd_per_day=Decimal("5")), {"get_routine_spend_today": {"usd": 5.0}}, "budget: 5.00 of 5.00 USD spent today"),
])
async def test_a_run_that_may_not_start_is_skipped_and_says_why(run: QueuedRun, answers: dict[str, Any],
                                                                 reason: str) -> None:
    unit = FakeWork({**answers, "mark_run_skipped": 1})
    assert await starter().start(unit, run) == f"skipped: {reason}"
    assert unit.params("mark_run_skipped") == {"id": RUN, "reason": reason}
    (ended,) = unit.events
    assert (ended.event_type, ended.payload["status"], ended.payload["reason"]) == ("routine.run_ended", "skipped",
                                                                                     reason)


async def test_a_project_cap_counts_every_routine_of_the_project() -> None:
    project = uuid.uuid4()
    unit = FakeWork({"get_project_routine_spend_today": {"usd": 9.5}, "mark_run_skipped": 1})
    outcome = await starter(project_usd_per_day=10.0).start(unit, queued(project_id=project, usd_per_run=Decimal("1")))
    assert outcome == "skipped: budget: the project's routines spent 9.50 of 10.00 USD today"
    assert unit.params("get_project_routine_spend_today") == {"project_id": project, "since": NOW.replace(hour=0,
                                                                                                           minute=0)}


@pytest.mark.parametrize(("prompt", "why"), [
    ("  ", "the rendered prompt is empty"),
    ("{{ event.missing }}", "missing"),
    ("x" * (runs.MAX_PROMPT_CHARS + 1), "at most"),
])
async def test_a_template_that_does_not_render_fails_the_run(prompt: str, why: str) -> None:
    unit = FakeWork({"mark_run_failed": 1})
    assert await starter().start(unit, queued(prompt=prompt)) == "failed"
    assert why in unit.params("mark_run_failed")["reason"]
    assert [e.payload["status"] for e in unit.events] == ["failed"]


async def test_a_run_that_starts_gets_its_thread_and_first_turn_in_one_unit_of_work() -> None:
    unit = FakeWork({"create_routine_thread": 1, "mark_run_started": 1, "insert_task": inserted})
    assert await starter().start(unit, queued()) == "started"
    assert unit.names() == ["create_routine_thread", "mark_run_started", "insert_task"]
    assert unit.params("create_routine_thread")["title"] == "nightly · 2025-03-04 09:30 UTC"
    started = unit.params("mark_run_started")
    assert started["prompt"] == "hi cron" and started["task_id"] == unit.params("insert_task")["id"]
    assert unit.params("insert_task")["session_id"] == started["thread_id"]
    assert [e.event_type for e in unit.events] == ["thread.created", "routine.run_started", "task.user_message",
                                                   "task.dispatch_requested"]


def running(**kw: Any) -> RunningRun:
    row: dict[str, Any] = {"id": RUN, "routine_id": ROUTINE, "name": "nightly", "trigger": "schedule",
                           "scheduled_at": None, "project_id": None, "thread_id": uuid.uuid4(),
                           "task_id": uuid.uuid4(), "started_at": NOW, "runtime_s": 60, "overran": False}
    return RunningRun.from_row({**row, **kw})


def outcome(**kw: Any) -> RunOutcome:
    return RunOutcome.from_row({"last_status": "success", "last_reason": None, "budget_reason": None,
                                "cost_usd": 0.1, "gate_denials": [], **kw})


@pytest.mark.parametrize(("run", "out", "concluded"), [
    (running(), outcome(), ("succeeded", None)),
    (running(overran=True), outcome(), ("failed", "stopped at the routine's runtime cap (60 s)")),
    (running(), outcome(budget_reason="budget: 1.00 of 1.00"), ("failed", "budget: 1.00 of 1.00")),
    (running(), outcome(gate_denials=[{"tool": "Bash"}]), ("gated", "the gate denied 1 tool call(s)")),
    (running(), outcome(last_status="failed", last_reason="exit 1"), ("failed", "the last turn ended failed (exit 1)")),
    (running(), runs.NO_OUTCOME, ("failed", "the last turn ended None")),
])
def test_a_runs_end_is_what_its_tasks_came_to(run: RunningRun, out: RunOutcome,
                                              concluded: tuple[str, str | None]) -> None:
    assert runs.conclude(run, out) == concluded


def test_an_ended_record_names_the_thread_only_of_a_run_that_had_one() -> None:
    assert runs.run_ended(queued(), "skipped", "x").session_id is None
    run = running()
    assert runs.run_ended(run, "succeeded", None).session_id == run.thread_id


# ---- the routines' clock -------------------------------------------------------------------------------


def clocked(next_fire: Any, poll_s: float = 1.0) -> tuple[Routines, timers.ManualClock]:
    clock = timers.ManualClock()
    routines = Routines(cast(AsyncConnectionPool, None), RoutinesConfig(clock=lambda: NOW, poll_s=poll_s),
                        timer_clock=clock)
    routines.rows = RoutineRows(FakeWork({"get_next_routine_fire": next_fire}))
    return routines, clock


async def rung(routines: Routines) -> list[str | None]:
    async with asyncio.timeout(5):
        await routines.wake.wait()
    return routines.wake.take()


async def test_the_clock_wakes_the_loop_at_the_next_instant_for_scheduling_and_starting() -> None:
    routines, clock = clocked({"at": NOW + timedelta(seconds=0.3)})
    stop = asyncio.Event()
    ticking = asyncio.create_task(routines.clock_timer.run(stop))
    assert await clock.asleep() == [0.3]
    clock.advance(0.3)
    assert await rung(routines) == [INSTANT]
    assert INSTANT in routines.passes_by_channel() and routines.passes_by_channel()[INSTANT] == [
        routines.schedule, routines.start_runs]
    stop.set()
    await ticking


@pytest.mark.parametrize(("next_fire", "waits", "rings"), [
    ({"at": NOW + timedelta(seconds=30)}, 1.0, False),  # nothing within a poll: the poll is the loop's own
    ({"at": None}, 1.0, False),  # no schedule at all
    ({"at": NOW - timedelta(seconds=1)}, 0.05, True),  # come but not scheduled yet: looked at again soon
    (lambda _: (_ for _ in ()).throw(psycopg.OperationalError("gone")), 1.0, False),  # an outage: the loop's
])
async def test_the_clock_waits_at_most_a_poll_and_rings_only_for_an_instant(next_fire: Any, waits: float,
                                                                           rings: bool) -> None:
    routines, clock = clocked(next_fire)
    stop = asyncio.Event()
    ticking = asyncio.create_task(routines.clock_timer.run(stop))
    assert await clock.asleep() == [waits]
    clock.advance(waits)
    await clock.asleep(at=2 * waits)  # it rang (or not) and waits again
    assert routines.wake.take() == ([INSTANT] if rings else [])
    stop.set()
    await ticking
