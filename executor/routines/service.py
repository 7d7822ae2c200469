"""The routines loop: schedule due instants, turn verified triggers into runs, start runs as thread turns
(within the routine's overlap policy and budgets), and record each run's end.

Passes, in order (one `consume` loop; a timer wakes it at the next instant a schedule waits for):
- `claim_triggers`: routine_queue rows (run now, fire, webhook) become queued runs, once.
- `schedule`: a routine whose next instant has come gets a queued run per instant the missed-instant policy
  keeps (`shared.routines.due`); the run's unique (routine, instant) makes it exactly once across the fleet.
- `start_runs`: a queued run is skipped (overlap, budget), failed (a template error) or started: its thread
  and first turn are created through `request_task`, in one commit with the run's `running` mark.
- `record_quota`: the account's rate-limit windows from the journal's rate_limit_event lines.
And a loop of its own, woken by task changes, so that it never holds an instant back:
- `finish_runs`: a running run whose thread has nothing open any more ends: succeeded, failed or gated,
  with its cost and the gate's denials, journaled as `routine.run_ended` (the notifier tells the user).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.projects import service as projects
from executor.settle import dispatch
from executor.sql import queries
from shared import consume, database, logs
from shared import routines as rules
from shared.availability import OUTAGE_ERRORS
from shared.listener import Notification, Subscription
from shared.models import NewEvent
from shared.query import Queries
from shared.work import Work, work

log = logs.get(__name__)

Clock = Callable[[], datetime]
CHANNELS = ("routine_queue", "routines")
# the most a rendered prompt may hold (a template that pastes a whole webhook payload fails the run instead)
MAX_PROMPT_CHARS = 200_000
# due routines one scheduling pass takes before the runs it made are started
SCHEDULE_BATCH = 20
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
    def __init__(self, pool: AsyncConnectionPool, config: RoutinesConfig):
        self.pool = pool
        self.config = config
        self.q = Queries(pool, queries)
        self._sub: Subscription | None = None

    async def run(self, sub: Subscription, ends: Subscription) -> None:
        """Two loops: starting (`sub`: routine_queue, routines, and the timer) and ending (`ends`:
        task_ended), so recording the ends of many runs never holds a schedule's instant back."""
        self._sub = sub
        availability = database.availability(self.pool)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._timer(sub))
            group.create_task(consume.consume("routine-ends", ends, {"task_ended": [self.finish_runs]},
                                              self.config.poll_s, availability, debounce_s=ENDS_DEBOUNCE_S))
            await consume.consume("routines", sub, self.passes_by_channel(), self.config.poll_s, availability)

    def passes_by_channel(self) -> dict[str, list[consume.Pass]]:
        # the order a wake-up runs them in is the first list's: a run is made before it is started
        return {consume.POLL_ONLY: [self.claim_triggers, self.schedule, self.record_quota, self.start_runs],
                "routine_queue": [self.claim_triggers, self.start_runs],
                "routines": [self.schedule, self.start_runs]}

    async def _timer(self, sub: Subscription) -> None:
        """Wake the loop at the next instant a schedule waits for (the poll is the backstop): as a note on the
        `routines` channel, so only scheduling and starting run, at once. Those notes keep the loop from ever
        waiting out its poll: at least once a poll the wake-up is a full one (every pass)."""
        full = time.monotonic()
        while True:
            delay = self.config.poll_s
            try:
                row = await self.q.one("get_next_routine_fire")
                if row and row["at"] is not None:
                    delay = min(delay, (row["at"] - self.config.clock()).total_seconds() / self.config.clock_rate)
            except OUTAGE_ERRORS:
                pass  # the loop waits the outage out; this only wakes it
            except Exception:  # noqa: BLE001 - the timer only hastens the loop: it must not end the executor
                log.exception("routine_timer_failed")
            if delay > 0:
                await asyncio.sleep(delay)
                if time.monotonic() - full >= self.config.poll_s:
                    full = time.monotonic()
                    consume.nudge(sub)
                elif delay < self.config.poll_s:
                    with contextlib.suppress(asyncio.QueueFull):
                        sub.queue.put_nowait(Notification("routines", "timer"))
            else:
                # due but not scheduled yet (a backlog, or another executor holds the routine): wake the loop
                # again, at most every 50 ms
                with contextlib.suppress(asyncio.QueueFull):
                    sub.queue.put_nowait(Notification("routines", "timer"))
                await asyncio.sleep(min(0.05, self.config.poll_s))

    # ---- triggers and schedules ---------------------------------------------------------------------

    async def claim_triggers(self) -> bool:
        async with self.q.transaction() as tx:
            made = await tx.all("claim_routine_triggers")
        for row in made:
            log.info("routine_triggered", routine=str(row["routine_id"]), trigger=row["trigger"], run=str(row["id"]))
        return bool(made)

    async def schedule(self) -> bool:
        """Up to SCHEDULE_BATCH due routines, each in a transaction of its own; then it yields (falsy), so
        starting the runs it made is never starved by instants coming faster than they are scheduled (the
        timer wakes the loop again while any is due)."""
        for _ in range(SCHEDULE_BATCH):
            if not await self._schedule_one():
                break
        return False

    async def _schedule_one(self) -> bool:
        now = self.config.clock()
        async with self.q.transaction() as tx:
            routine = await tx.one("claim_due_routine", {"now": now})
            if routine is None:
                return False
            plan = rules.due(rules.Schedule(routine["cron"], routine["tz"]), routine["scheduled_through"], now,
                             routine["missed"], self.config.missed_grace_s)
            made = []
            for instant in plan.instants:
                row = await tx.one("insert_scheduled_run", {
                    "routine_id": routine["id"], "scheduled_at": instant,
                    "event": Jsonb({"scheduled_at": instant.isoformat(), "missed": plan.skipped})})
                if row is not None:
                    made.append(instant)
            await tx.execute("mark_routine_scheduled", {"id": routine["id"], "through": plan.through,
                                                        "next_fire_at": plan.next_fire_at})
        log.info("routine_scheduled", routine=str(routine["id"]), runs=[i.isoformat() for i in made],
                 skipped=plan.skipped, next_fire_at=plan.next_fire_at.isoformat())
        return True

    # ---- starting a run -----------------------------------------------------------------------------

    async def record_quota(self) -> bool:
        """The account's rate-limit windows from the CLI's rate_limit_event lines (journaled by the runs)."""
        for row in await self.q.all("record_quota_windows"):
            log.info("quota_window", kind=row["kind"], status=row["status"], utilization=row["utilization"],
                     resets_at=row["resets_at"].isoformat() if row["resets_at"] else None)
        return False

    async def start_runs(self) -> bool:
        # unattended work waits while a window of the account's quota is exhausted (interactive chat does not:
        # the user decides); the poll starts the runs once the window has reset
        wait = await self.q.one("get_quota_wait", {"now": self.config.clock()})
        if wait is not None:
            until = wait["resets_at"].astimezone(UTC)
            waiting = await self.q.all("mark_runs_waiting", {
                "reason": f"waiting for quota until {until:%H:%M} UTC ({wait['kind']} window, {until.isoformat()})"})
            if waiting:
                log.info("routine_runs_wait_for_quota", runs=len(waiting), until=until.isoformat(), window=wait["kind"])
            return False
        async with work(self.q) as tx:
            run = await tx.one("claim_queued_run")
            if run is None:
                return False
            outcome = await self._start(tx, run)
        log.info("routine_run", run=str(run["id"]), routine=str(run["routine_id"]), trigger=run["trigger"],
                 outcome=outcome)
        return True

    async def _start(self, tx: Work, run: dict[str, Any]) -> str:
        """Skip, fail or start the claimed run, in `tx`; says which."""
        if run["deleted_at"] is not None:
            return await self._skip(tx, run, "the routine was deleted")
        if run["overlapping"] and run["overlap"] == "skip":
            return await self._skip(tx, run, "overlap: the previous run is still going")
        if run["usd_per_day"] is not None:
            spent = (await tx.one("get_routine_spend_today", {
                "routine_id": run["routine_id"], "since": rules.day_start(self.config.clock())}) or {}).get("usd", 0)
            if spent + float(run["usd_per_run"] or 0) > float(run["usd_per_day"]) or spent >= float(run["usd_per_day"]):
                return await self._skip(tx, run, f"budget: {spent:.2f} of {float(run['usd_per_day']):.2f} USD "
                                                 "spent today")
        cap = self.config.project_usd_per_day
        if cap is not None and run["project_id"] is not None:
            spent = (await tx.one("get_project_routine_spend_today", {
                "project_id": run["project_id"], "since": rules.day_start(self.config.clock())}) or {}).get("usd", 0)
            if spent + float(run["usd_per_run"] or 0) > cap or spent >= cap:
                return await self._skip(tx, run, f"budget: the project's routines spent {spent:.2f} of {cap:.2f} "
                                                 "USD today")
        try:
            prompt = rules.render(run["prompt"], run["event"] or {}, {"id": str(run["routine_id"]),
                                                                       "name": run["name"]})
            if not prompt.strip():
                raise rules.TemplateError("the rendered prompt is empty")
            if len(prompt) > MAX_PROMPT_CHARS:
                raise rules.TemplateError(f"the rendered prompt has {len(prompt)} characters (at most "
                                          f"{MAX_PROMPT_CHARS}): name the event's fields it needs, not all of it")
        except rules.TemplateError as exc:
            await tx.execute("mark_run_failed", {"id": run["id"], "reason": str(exc), "prompt": None})
            tx.emit(self._ended(run, "failed", str(exc)))
            return "failed"
        thread_id, turn_id = uuid.uuid4(), uuid.uuid4()
        project = await tx.one("get_routine_project", {"id": run["project_id"]}) if run["project_id"] else None
        brief = prompt
        if project is not None:
            brief = f"{prompt}\n\n{await projects.turn_context(self.pool, project)}"
        when = run["scheduled_at"] or run["created_at"]
        title = f"{run['name']} · {when.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        await tx.execute("create_routine_thread", {"id": thread_id, "title": title, "mode": run["mode"],
                                                   "project_id": run["project_id"]})
        facts = {"routine_id": str(run["routine_id"]), "run_id": str(run["id"]), "trigger": run["trigger"],
                 "scheduled_at": run["scheduled_at"].isoformat() if run["scheduled_at"] else None}
        tx.emit(NewEvent("thread.created", {"title": title, "mode": run["mode"], **facts,
                                            "project_id": str(run["project_id"]) if run["project_id"] else None},
                         session_id=thread_id, project_id=run["project_id"]),
                NewEvent("routine.run_started", {**facts, "prompt": prompt, "task_id": str(turn_id)},
                         session_id=thread_id, project_id=run["project_id"]),
                NewEvent("task.user_message", {"text": prompt, "thread_id": str(thread_id), "origin": "routine",
                                               **facts}, session_id=thread_id, task_id=turn_id))
        # marked first: the turn's insert finds the run through its thread (the routine's USD per run)
        await tx.execute("mark_run_started", {"id": run["id"], "prompt": prompt, "thread_id": thread_id,
                                              "task_id": turn_id})
        await dispatch.request_task(tx, dispatch.TaskRequest(
            dispatch.TURN_ROLE, brief, id=turn_id, project_id=run["project_id"], session_id=thread_id,
            requested_by=f"routine {run['name']} ({run['trigger']})", record={"messages": 1, **facts}))
        return "started"

    async def _skip(self, tx: Work, run: dict[str, Any], reason: str) -> str:
        await tx.execute("mark_run_skipped", {"id": run["id"], "reason": reason})
        tx.emit(self._ended(run, "skipped", reason))
        return f"skipped: {reason}"

    def _ended(self, run: dict[str, Any], status: str, reason: str | None, **facts: Any) -> NewEvent:
        return NewEvent("routine.run_ended", {
            "routine_id": str(run["routine_id"]), "run_id": str(run["id"]), "name": run["name"],
            "trigger": run["trigger"], "status": status, "reason": reason,
            "scheduled_at": run["scheduled_at"].isoformat() if run["scheduled_at"] else None, **facts},
            session_id=run.get("thread_id"), project_id=run.get("project_id"))

    # ---- a run's end --------------------------------------------------------------------------------

    async def finish_runs(self) -> bool:
        """Stop runs past their runtime, and record the end of every run whose work has all ended."""
        for row in await self.q.all("stop_overdue_runs", {"now": self.config.clock()}):
            log.info("routine_run_overdue", task=str(row["task_id"]))
        ended = await self.q.all("list_ended_runs")
        for row in ended:
            await self._finish(row["id"])
        return False  # what ends later comes with a task's change (or the poll)

    async def _finish(self, run_id: uuid.UUID) -> None:
        async with work(self.q) as tx:
            run = await tx.one("claim_running_run", {"id": run_id})
            if run is None:
                return  # another executor is ending it
            out = await tx.one("get_run_outcome", {"thread_id": run["thread_id"]}) or {}
            denials = out.get("gate_denials") or []
            if run["overran"]:
                status, reason = "failed", f"stopped at the routine's runtime cap ({run['runtime_s']} s)"
            elif out.get("budget_reason"):  # a process of the run found its USD per run spent
                status, reason = "failed", out["budget_reason"]
            elif denials:
                status, reason = "gated", f"the gate denied {len(denials)} tool call(s)"
            elif out.get("last_status") == "success":
                status, reason = "succeeded", None
            else:
                status = "failed"
                reason = f"the last turn ended {out.get('last_status')}" + (
                    f" ({out['last_reason']})" if out.get("last_reason") else "")
            ended = await tx.one("mark_run_ended", {"id": run_id, "status": status, "reason": reason,
                                                    "cost_usd": out.get("cost_usd"),
                                                    "gate_denials": Jsonb(denials)})
            duration = (ended["ended_at"] - run["started_at"]).total_seconds() if ended else None
            tx.emit(self._ended(run, status, reason, cost_usd=out.get("cost_usd"), gate_denials=denials,
                                duration_s=round(duration, 3) if duration is not None else None,
                                thread_id=str(run["thread_id"]), task_id=str(run["task_id"])))
        log.info("routine_run_ended", run=str(run_id), status=status, reason=reason)
