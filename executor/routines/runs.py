"""A routine run's start and end, in the caller's unit of work: a claimed queued run is skipped (deleted,
overlap, budgets), failed (its template) or started as the first turn of a thread of its own; a run whose
work has all ended gets its status from what its tasks came to. Each is journaled as `routine.run_ended`
(a start as `routine.run_started`) in the same commit."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor.projects import service as projects
from executor.routines.store import QueuedRun, RoutineRows, Run, RunningRun, RunOutcome
from executor.settle import dispatch
from shared import routines as rules
from shared.models import NewEvent
from shared.work import Work

# the most a rendered prompt may hold (a template that pastes a whole webhook payload fails the run instead)
MAX_PROMPT_CHARS = 200_000
NO_OUTCOME = RunOutcome(last_status=None, last_reason=None, budget_reason=None, cost_usd=None, gate_denials=None)


def run_ended(run: Run, status: str, reason: str | None, **facts: Any) -> NewEvent:
    """The record of a run's end (skipped, failed, gated or succeeded)."""
    return NewEvent("routine.run_ended", {
        "routine_id": str(run.routine_id), "run_id": str(run.id), "name": run.name, "trigger": run.trigger,
        "status": status, "reason": reason,
        "scheduled_at": run.scheduled_at.isoformat() if run.scheduled_at else None, **facts},
        session_id=run.thread_id if isinstance(run, RunningRun) else None, project_id=run.project_id)


def over_budget(spent: float, per_run: float, cap: float) -> bool:
    """Whether a run that may cost `per_run` would take the day's spend past `cap` (pure)."""
    return spent + per_run > cap or spent >= cap


def render_prompt(run: QueuedRun) -> str:
    """The run's prompt from its routine's template and its event (pure).

    Raises:
        rules.TemplateError: the template does not render, renders empty, or renders too much.
    """
    prompt = rules.render(run.prompt, run.event or {}, {"id": str(run.routine_id), "name": run.name})
    if not prompt.strip():
        raise rules.TemplateError("the rendered prompt is empty")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise rules.TemplateError(f"the rendered prompt has {len(prompt)} characters (at most "
                                  f"{MAX_PROMPT_CHARS}): name the event's fields it needs, not all of it")
    return prompt


def conclude(run: RunningRun, out: RunOutcome) -> tuple[str, str | None]:
    """A run's status and reason from what its tasks came to (pure)."""
    if run.overran:
        return "failed", f"stopped at the routine's runtime cap ({run.runtime_s} s)"
    if out.budget_reason:  # a process of the run found its USD per run spent
        return "failed", out.budget_reason
    if out.gate_denials:
        return "gated", f"the gate denied {len(out.gate_denials)} tool call(s)"
    if out.last_status == "success":
        return "succeeded", None
    return "failed", f"the last turn ended {out.last_status}" + (f" ({out.last_reason})" if out.last_reason else "")


class Starter:
    """Decides a claimed queued run and starts it (`start`), by the scheduler's clock and the project cap."""

    def __init__(self, pool: AsyncConnectionPool, clock: Callable[[], datetime], project_usd_per_day: float | None):
        self.pool = pool  # for the project's turn context (executor/projects)
        self.clock = clock
        self.project_usd_per_day = project_usd_per_day

    async def start(self, tx: Work, run: QueuedRun) -> str:
        """Skip, fail or start the claimed run, in `tx`; says which."""
        rows = RoutineRows(tx)
        refusal = await self._refusal(rows, run)
        if refusal is not None:
            await rows.mark_skipped(run.id, refusal)
            tx.emit(run_ended(run, "skipped", refusal))
            return f"skipped: {refusal}"
        try:
            prompt = render_prompt(run)
        except rules.TemplateError as exc:
            await rows.mark_failed(run.id, str(exc))
            tx.emit(run_ended(run, "failed", str(exc)))
            return "failed"
        await self._start_thread(tx, rows, run, prompt)
        return "started"

    async def _refusal(self, rows: RoutineRows, run: QueuedRun) -> str | None:
        """Why the run is skipped, or None."""
        if run.deleted_at is not None:
            return "the routine was deleted"
        if run.overlapping and run.overlap == "skip":
            return "overlap: the previous run is still going"
        per_run = float(run.usd_per_run or 0)
        if run.usd_per_day is not None:
            cap = float(run.usd_per_day)
            spent = await rows.spent_today(run.routine_id, rules.day_start(self.clock()))
            if over_budget(spent, per_run, cap):
                return f"budget: {spent:.2f} of {cap:.2f} USD spent today"
        cap_of_project = self.project_usd_per_day
        if cap_of_project is not None and run.project_id is not None:
            spent = await rows.project_spent_today(run.project_id, rules.day_start(self.clock()))
            if over_budget(spent, per_run, cap_of_project):
                return f"budget: the project's routines spent {spent:.2f} of {cap_of_project:.2f} USD today"
        return None

    async def _start_thread(self, tx: Work, rows: RoutineRows, run: QueuedRun, prompt: str) -> None:
        """The run's thread and its first turn (through `request_task`), and the run marked running."""
        thread_id, turn_id = uuid.uuid4(), uuid.uuid4()
        brief = prompt
        project = await rows.project(run.project_id) if run.project_id is not None else None
        if project is not None:
            brief = f"{prompt}\n\n{await projects.turn_context(self.pool, dataclasses.asdict(project))}"
        when = run.scheduled_at or run.created_at
        title = f"{run.name} · {when.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        await rows.create_thread(thread_id, title, run.mode, run.project_id)
        facts = {"routine_id": str(run.routine_id), "run_id": str(run.id), "trigger": run.trigger,
                 "scheduled_at": run.scheduled_at.isoformat() if run.scheduled_at else None}
        tx.emit(NewEvent("thread.created", {"title": title, "mode": run.mode, **facts,
                                            "project_id": str(run.project_id) if run.project_id else None},
                         session_id=thread_id, project_id=run.project_id),
                NewEvent("routine.run_started", {**facts, "prompt": prompt, "task_id": str(turn_id)},
                         session_id=thread_id, project_id=run.project_id),
                NewEvent("task.user_message", {"text": prompt, "thread_id": str(thread_id), "origin": "routine",
                                               **facts}, session_id=thread_id, task_id=turn_id))
        # marked first: the turn's insert finds the run through its thread (the routine's USD per run)
        await rows.mark_started(run.id, prompt, thread_id, turn_id)
        await dispatch.request_task(tx, dispatch.TaskRequest(
            dispatch.TURN_ROLE, brief, id=turn_id, project_id=run.project_id, session_id=thread_id,
            requested_by=f"routine {run.name} ({run.trigger})", record={"messages": 1, **facts}))
