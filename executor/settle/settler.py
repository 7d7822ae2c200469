"""The settler: what must happen after a task ends, or after the user answers, is done by a loop over the
store, not by callbacks. It owns every follow-up of a worker's end:

- an end: a project worker's changes recorded (executor/settle/changes.py), then the step its end calls
  for, decided by a pure function (`route`): extraction, its validation, the policy, a thread's turn boundary,
  a fix round for a failed check (executor/settle/reviews.py);
- an answered escalation carried out (executor/settle/escalations.py);
- an answered approval carried out, and a late answer sent to its thread (executor/settle/approvals.py).

Each is claimed with `FOR UPDATE SKIP LOCKED` and writes its rows, its journal records and its marker
(`settled_at` and `changes_recorded_at`; the escalation's, approval's or late answer's own row) in ONE
unit of work (shared/work.py): every step takes it, writes through the stores and emits its records into it. A step that must start something (an extractor run, a retry) inserts the task row in that
transaction and the supervisor claims it. So an executor that dies between an end and its settlement
settles it after the restart, exactly once; a step that raises rolls back, is logged, and is retried with a
growing delay — never lost.

It is one `consume` loop (shared/consume.py): ends on `task_ended` (a status change into a final one, migration 0036),
the answers it acts on on `question_settle` (an approval's, an escalation's, a late one: migration 0035),
and everything on the poll.
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from psycopg_pool import AsyncConnectionPool

from executor.run.outcome import EXECUTOR_SHUTDOWN, PARKED_LIMIT
from executor.settle import approvals, budgets, changes, escalations, extraction, reviews
from executor.settle.store import Ended, SettleStore
from shared import consume, database, logs
from shared.listener import Subscription
from shared.work import Work

log = logs.get(__name__)


@dataclass(frozen=True)
class SettlerConfig:
    # whether finished workers are extracted and their extraction validated (off, an end is only marked settled)
    extract: bool = True
    backoff_base_s: float = 30.0
    # backstop for task_ended notifications lost while the LISTEN connection was down
    poll_interval_s: float = 1.0
    # a settlement that raised is retried after this, doubled per failure up to the cap
    retry_base_s: float = 1.0
    retry_cap_s: float = 60.0
    # whether a project worker's worktree stays after its changes are recorded (its branch always does)
    keep_worktrees: bool = False
    # how long an unattended (autonomous) routine run waits for the answer to its budget ask; None: it does not
    # ask (ends at its cap, as it always did). An interactive run's ask waits for the answer.
    budget_ask_s: float | None = 900.0


class Step(enum.StrEnum):
    VALIDATE = "validate"  # an extractor ended: validate its output, store the handoff or the failure, apply the policy
    EXTRACT = "extract"  # a worker with output ended: start its extractor (the policy waits for the handoff)
    POLICY = "policy"  # a thread's worker ended with nothing to extract: apply the policy to the end itself
    TELL_THREAD = "tell_thread"  # an orchestrator turn ended: the thread delivers what waited for the boundary
    RERUN_TURN = "rerun_turn"  # a turn cut off by the executor's shutdown: run its messages again
    TURN_FAILED = "turn_failed"  # a turn ended otherwise: record it in the chat and apply the turns' policy
    FIX_ROUND = "fix_round"  # a project worker's check failed, a round is left: a follow-up fixes it (no handoff yet)
    BUDGET_ASK = "budget_ask"  # a routine run's process stopped at (or not started for) its USD cap: ask the user
    NOTHING = "nothing"  # nobody acts on this end; it stays visible


def route(ended: Ended, *, extract: bool, unattended_asks: bool = True) -> Step:
    """The step an end calls for (pure). `unattended_asks`: whether an autonomous run asks at its USD cap."""
    if ended.budget_run_id is not None and (ended.budget_mode == "interactive" or unattended_asks):
        return Step.BUDGET_ASK
    if ended.thread_turn:
        # a deploy is never the turn's fault, and the messages it carried must not be dropped
        if ended.status == "crashed" and ended.status_reason == EXECUTOR_SHUTDOWN:
            return Step.RERUN_TURN
        # ended while it waited on the user, past PETAL_MAX_PARKED: a boundary, not a failure (the answer resumes it)
        if ended.status_reason == PARKED_LIMIT:
            return Step.TELL_THREAD
        return Step.TELL_THREAD if ended.status == "success" else Step.TURN_FAILED
    if ended.fix_round_due:
        return Step.FIX_ROUND
    if not extract:
        return Step.NOTHING
    if ended.is_extractor:
        return Step.VALIDATE
    if ended.extract_on_exit and ended.printed:
        return Step.EXTRACT
    if ended.thread_id is not None:
        return Step.POLICY
    return Step.NOTHING


def retry_delay(failures: int, base_s: float, cap_s: float) -> float:
    """How long a settlement that failed `failures` times in a row waits before the next try (pure)."""
    return min(cap_s, base_s * 2.0 ** max(0, failures - 1))


class Settler:
    def __init__(self, pool: AsyncConnectionPool, config: SettlerConfig, on_settled: Callable[[], None] = lambda: None):
        self.pool = pool
        self.store = SettleStore.over(pool)
        self.config = config
        self.on_settled = on_settled  # the threads loop: a turn boundary or a note to the orchestrator waits for it
        # task id → (failures in a row, monotonic time of the next try); memory only, the store keeps the work
        self._failures: dict[uuid.UUID, tuple[int, float]] = {}

    async def run(self, sub: Subscription) -> None:
        await consume.consume("settler", sub, self.passes_by_channel(), self.config.poll_interval_s,
                              database.availability(self.pool))

    def passes_by_channel(self) -> dict[str, list[consume.Pass]]:
        return {
            # an approval is owed also when its worker was stopped meanwhile (a status change)
            "task_ended": [self.settle_pending, self.apply_approvals],
            # only for the questions these passes act on (migration 0035): not on every answer
            "question_settle": [self.apply_escalations, self.apply_approvals, self.deliver_late_answers],
            # rare by construction; an unattended budget ask's deadline is kept by the poll (a second's slack)
            consume.POLL_ONLY: [self.record_leftover_changes, self.expire_budget_asks],
        }

    # ---- the passes: each does one batch and says whether it found work (consume runs it again) -------

    async def settle_pending(self) -> int:
        """Settle every ended task not yet settled (those whose last try failed wait for their retry time);
        returns how many were settled."""
        settled = 0
        tried: set[uuid.UUID] = set()
        while True:
            now = time.monotonic()
            skip = tried | {tid for tid, (_, at) in self._failures.items() if at > now}
            result = await self._settle_one(list(skip))
            if result is None:
                return settled
            task_id, ok = result
            tried.add(task_id)
            settled += ok

    async def apply_escalations(self) -> int:
        """Carry out one batch of answered escalations, each once (claimed, acted on and resolved in one unit
        of work); how many were acted on."""
        async with self.store.work() as (store, unit):
            rows = await store.answered_escalations()
            for row in rows:
                await escalations.act_on_answer(unit, row)
        return self._told(len(rows))

    async def apply_approvals(self) -> int:
        return self._told(await approvals.apply_answered(self.pool))

    async def deliver_late_answers(self) -> int:
        return self._told(await approvals.deliver_late_answers(self.pool))

    async def record_leftover_changes(self) -> bool:
        """Record the changes of one end settled without them; whether there was one."""
        async with self.store.work() as (store, unit):
            task_id = await store.claim_unrecorded_changes()
            if task_id is None:
                return False
            await changes.record(unit, task_id, keep_worktree=self.config.keep_worktrees)
        return True

    async def expire_budget_asks(self) -> int:
        """Close the questions of unattended budget asks past their deadline (their answers pass then acts)."""
        return await budgets.expire(self.pool)

    def _told(self, acted: int) -> int:
        if acted:
            self.on_settled()  # the notes it queued for orchestrators wait for a turn boundary
        return acted

    async def _settle_one(self, skip: list[uuid.UUID]) -> tuple[uuid.UUID, bool] | None:
        ended: Ended | None = None
        step = Step.NOTHING
        try:
            # the unit appends its records last: the journal head stays locked only until the commit
            async with self.store.work() as (store, unit):
                ended = await store.claim_unsettled(skip)
                if ended is None:
                    return None
                step = route(ended, extract=self.config.extract,
                             unattended_asks=self.config.budget_ask_s is not None)
                await self.settle(unit, ended, step)
        except Exception:
            if ended is None:
                raise  # the claim itself failed: the pass fails and the loop retries
            failures = self._failures.get(ended.id, (0, 0.0))[0] + 1
            delay = retry_delay(failures, self.config.retry_base_s, self.config.retry_cap_s)
            self._failures[ended.id] = (failures, time.monotonic() + delay)
            # rolled back: the end stays unsettled, and is tried again after the delay
            log.exception("settlement_failed", task_id=str(ended.id), step=str(step), failures=failures,
                          retry_in_s=delay)
            return ended.id, False
        self._failures.pop(ended.id, None)
        log.info("task_settled", task_id=str(ended.id), status=ended.status, step=str(step))
        if step is not Step.NOTHING:
            self.on_settled()
        return ended.id, True

    async def settle(self, unit: Work, ended: Ended, step: Step) -> None:
        """Settle a claimed end in `unit`: its changes recorded (first: validation reads them for the handoff's
        artifacts), the step carried out, the end marked settled."""
        if ended.changes_due:
            await changes.record(unit, ended.id, keep_worktree=self.config.keep_worktrees)
        await self._carry_out(unit, ended, step)
        await SettleStore(unit).mark_settled(ended.id)

    async def _carry_out(self, unit: Work, ended: Ended, step: Step) -> None:
        backoff = self.config.backoff_base_s
        if step is Step.VALIDATE:
            validated = await extraction.validate(unit, ended)
            if validated is not None:
                await escalations.apply_policy(unit, validated.worker_id, validated.record_type, validated.payload,
                                               backoff_base_s=backoff)
        elif step is Step.EXTRACT:
            await extraction.request_on(unit, ended.id)
        elif step is Step.POLICY:
            await escalations.apply_policy(unit, ended.id, "task.exited",
                                           {"status": ended.status, "reason": ended.status_reason},
                                           backoff_base_s=backoff, started=ended.started)
        elif step is Step.RERUN_TURN:
            await escalations.rerun_turn(unit, ended.id, requested_by="settler", reason=ended.status_reason)
        elif step is Step.FIX_ROUND:
            await reviews.fix_round(unit, ended.id)
        elif step is Step.BUDGET_ASK:
            wait_s = None if ended.budget_mode == "interactive" else self.config.budget_ask_s
            if not await budgets.ask(unit, ended, wait_s=wait_s):  # its run is gone: settled as any other end
                await self._carry_out(unit, ended, route(replace(ended, budget_run_id=None), extract=self.config.extract))
        elif step is Step.TURN_FAILED:
            await escalations.apply_turn_policy(unit, ended.id, backoff_base_s=backoff, started=ended.started)
        # TELL_THREAD, NOTHING: nothing to write; the threads loop reads the boundary from the store
