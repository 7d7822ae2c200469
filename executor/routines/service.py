"""The routines loop: schedule due instants, turn verified triggers into runs, start runs as thread turns
(within the routine's overlap policy and budgets), and record each run's end.

Passes, in order (one `consume` loop; the routines' clock, a timer of shared/timers.py, wakes it at the next
instant a schedule waits for):
- `claim_triggers`: routine_queue rows (run now, fire, webhook) become queued runs, once.
- `schedule`: a routine whose next instant has come gets a queued run per instant the missed-instant policy
  keeps (`shared.routines.due`); the run's unique (routine, instant) makes it exactly once across the fleet.
- `start_runs`: a queued run is skipped (overlap, budget), failed (a template error) or started: its thread
  and first turn are created through `request_task`, in one commit with the run's `running` mark
  (executor/routines/runs.py).
- `record_quota`: the account's rate-limit windows from the journal's rate_limit_event lines.
And a loop of its own, woken by task changes, so that it never holds an instant back:
- `finish_runs`: a running run whose thread has nothing open any more ends: succeeded, failed or gated,
  with its cost and the gate's denials, journaled as `routine.run_ended` (the notifier tells the user).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from psycopg_pool import AsyncConnectionPool

from executor.routines import runs, store
from executor.routines.store import RoutineRows
from shared import consume, database, logs, timers
from shared import routines as rules
from shared.availability import OUTAGE_ERRORS
from shared.listener import Subscription
from shared.work import work

log = logs.get(__name__)

Clock = Callable[[], datetime]
CHANNELS = ("routine_queue", "routines")
# the key the routines' clock wakes the loop with (no channel: no notification comes by that name)
INSTANT = "instant"
# due routines one scheduling pass takes before the runs it made are started
SCHEDULE_BATCH = 20
# an instant that has come but is not scheduled yet (a backlog, or another executor holds the routine) is
# looked at again this soon
OVERDUE_RECHECK_S = 0.05
# a burst of task changes (a run's workers ending together) is taken in one round
ENDS_DEBOUNCE_S = 0.2


def system_clock() -> datetime:
    return datetime.now(UTC)


class FileClock:
    """Test-only: "now" is the ISO timestamp in a file (the real time while there is none), so a test drives
    schedules across instants, days and DST changes without waiting for them. A file caught half-written
    keeps the time read before."""

    def __init__(self, path: Path):
        self.path = path
        self._last: datetime | None = None

    def __call__(self) -> datetime:
        try:
            at = datetime.fromisoformat(self.path.read_text().strip())
        except FileNotFoundError:
            return self._last or system_clock()
        except ValueError:
            return self._last or system_clock()
        self._last = at if at.tzinfo else at.replace(tzinfo=UTC)
        return self._last


@dataclass(frozen=True)
class RoutinesConfig:
    """How routines are scheduled: the clock, how late an instant may be noticed and still count as on time
    (older ones are "missed", and follow the routine's policy), and the loop's poll."""

    clock: Clock = field(default=system_clock)
    missed_grace_s: float = 60.0
    poll_s: float = 1.0
    # clock seconds per real second: 1 but for a test clock that runs fast (the timer sleeps real seconds)
    clock_rate: float = 1.0
    # what the runs of all routines of one project may cost in a (UTC) day; None: no cap
    project_usd_per_day: float | None = None


class Routines:
    def __init__(self, pool: AsyncConnectionPool, config: RoutinesConfig, *,
                 timer_clock: timers.Clock = timers.MONOTONIC):
        self.pool = pool
        self.config = config
        self.q = store.over(pool)
        self.rows = RoutineRows(self.q)
        self.starter = runs.Starter(pool, config.clock, config.project_usd_per_day)
        self.wake = consume.Wake()
        self._instant_due = False  # the clock's wait ends at a schedule's instant (not at the poll's backstop)
        self.clock_timer = timers.every("routines-clock", self._until_instant, self._ring, clock=timer_clock)

    async def run(self, sub: Subscription, ends: Subscription) -> None:
        """Two loops: starting (`sub`: routine_queue, routines, and the clock's instants) and ending (`ends`:
        task_ended), so recording the ends of many runs never holds a schedule's instant back."""
        availability = database.availability(self.pool)
        async with asyncio.TaskGroup() as group:
            group.create_task(self.clock_timer.run())
            group.create_task(consume.consume("routine-ends", ends, {"task_ended": [self.finish_runs]},
                                              self.config.poll_s, availability, debounce_s=ENDS_DEBOUNCE_S))
            await consume.consume("routines", sub, self.passes_by_channel(), self.config.poll_s, availability,
                                  wake=self.wake)

    def passes_by_channel(self) -> dict[str, list[consume.Pass]]:
        # the order a wake-up runs them in is the first list's: a run is made before it is started
        return {consume.POLL_ONLY: [self.claim_triggers, self.schedule, self.record_quota, self.start_runs],
                "routine_queue": [self.claim_triggers, self.start_runs],
                "routines": [self.schedule, self.start_runs],
                INSTANT: [self.schedule, self.start_runs]}

    # ---- the clock ----------------------------------------------------------------------------------

    async def _until_instant(self) -> float:
        """How long the clock waits: until the next instant a schedule waits for, at most a poll (the loop's
        own backstop); an instant already come is looked at again within OVERDUE_RECHECK_S."""
        self._instant_due = False
        try:
            at = await self.rows.next_fire()
        except OUTAGE_ERRORS:
            return self.config.poll_s  # the loop waits the outage out; the clock only wakes it
        except Exception:  # noqa: BLE001 - the clock only hastens the loop: it must not end the executor
            log.exception("routine_timer_failed")
            return self.config.poll_s
        if at is None:
            return self.config.poll_s
        delay = (at - self.config.clock()).total_seconds() / self.config.clock_rate
        if delay >= self.config.poll_s:
            return self.config.poll_s
        self._instant_due = True
        return delay if delay > 0 else min(OVERDUE_RECHECK_S, self.config.poll_s)

    async def _ring(self) -> None:
        """An instant has come: scheduling and starting run, at once (the poll runs every pass anyway)."""
        if self._instant_due:
            self.wake.ring(INSTANT)

    # ---- triggers and schedules ---------------------------------------------------------------------

    async def claim_triggers(self) -> bool:
        async with self.q.transaction() as tx:
            made = await RoutineRows(tx).claim_triggers()
        for row in made:
            log.info("routine_triggered", routine=str(row.routine_id), trigger=row.trigger, run=str(row.id))
        return bool(made)

    async def schedule(self) -> bool:
        """Up to SCHEDULE_BATCH due routines, each in a transaction of its own; then it yields (falsy), so
        starting the runs it made is never starved by instants coming faster than they are scheduled (the
        clock wakes the loop again while any is due)."""
        for _ in range(SCHEDULE_BATCH):
            if not await self._schedule_one():
                break
        return False

    async def _schedule_one(self) -> bool:
        now = self.config.clock()
        async with self.q.transaction() as tx:
            rows = RoutineRows(tx)
            routine = await rows.claim_due(now)
            if routine is None:
                return False
            plan = rules.due(rules.Schedule(routine.cron, routine.tz), routine.scheduled_through, now,
                             routine.missed, self.config.missed_grace_s)
            made = [i for i in plan.instants if await rows.insert_scheduled_run(routine.id, i, plan.skipped)]
            await rows.mark_scheduled(routine.id, plan.through, plan.next_fire_at)
        log.info("routine_scheduled", routine=str(routine.id), runs=[i.isoformat() for i in made],
                 skipped=plan.skipped, next_fire_at=plan.next_fire_at.isoformat())
        return True

    # ---- starting a run -----------------------------------------------------------------------------

    async def record_quota(self) -> bool:
        """The account's rate-limit windows from the CLI's rate_limit_event lines (journaled by the runs)."""
        for row in await self.rows.record_quota_windows():
            log.info("quota_window", kind=row.kind, status=row.status, utilization=row.utilization,
                     resets_at=row.resets_at.isoformat() if row.resets_at else None)
        return False

    async def start_runs(self) -> bool:
        # unattended work waits while a window of the account's quota is exhausted (interactive chat does not:
        # the user decides); the poll starts the runs once the window has reset
        wait = await self.rows.quota_wait(self.config.clock())
        if wait is not None:
            until = wait.resets_at.astimezone(UTC)
            waiting = await self.rows.mark_runs_waiting(
                f"waiting for quota until {until:%H:%M} UTC ({wait.kind} window, {until.isoformat()})")
            if waiting:
                log.info("routine_runs_wait_for_quota", runs=waiting, until=until.isoformat(), window=wait.kind)
            return False
        async with work(self.q) as tx:
            run = await RoutineRows(tx).claim_queued_run()
            if run is None:
                return False
            outcome = await self.starter.start(tx, run)
        log.info("routine_run", run=str(run.id), routine=str(run.routine_id), trigger=run.trigger, outcome=outcome)
        return True

    # ---- a run's end --------------------------------------------------------------------------------

    async def finish_runs(self) -> bool:
        """Stop runs past their runtime, and record the end of every run whose work has all ended."""
        for task_id in await self.rows.stop_overdue_runs(self.config.clock()):
            log.info("routine_run_overdue", task=str(task_id))
        for run_id in await self.rows.ended_runs():
            await self._finish(run_id)
        return False  # what ends later comes with a task's change (or the poll)

    async def _finish(self, run_id: uuid.UUID) -> None:
        async with work(self.q) as tx:
            rows = RoutineRows(tx)
            run = await rows.claim_running_run(run_id)
            if run is None:
                return  # another executor is ending it
            out = await rows.outcome(run.thread_id) or runs.NO_OUTCOME
            status, reason = runs.conclude(run, out)
            denials = out.gate_denials or []
            ended_at = await rows.mark_ended(run_id, status, reason, out.cost_usd, denials)
            duration = (ended_at - run.started_at).total_seconds() if ended_at else None
            tx.emit(runs.run_ended(run, status, reason, cost_usd=out.cost_usd, gate_denials=denials,
                                   duration_s=round(duration, 3) if duration is not None else None,
                                   thread_id=str(run.thread_id), task_id=str(run.task_id)))
        log.info("routine_run_ended", run=str(run_id), status=status, reason=reason)
