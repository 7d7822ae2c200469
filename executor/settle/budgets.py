"""Budgets that ask: a routine run at its USD cap pauses and asks the user instead of failing.

A run's process the CLI stopped at the cap (`max_budget_usd`), or one not started because the cap was spent
(`budget: …`), ends as always; its settlement (`ask`) then puts a question to the user — raise this run's cap by
the routine's USD per run, or stop here — as an escalation of kind `budget`. No process is held meanwhile, and
the run does not end while the ask is open. The answer (`act_on_answer`, the settler's escalation pass): a raise
adds to the run's cap and runs the stopped task again (a turn through the thread's Retry queue, any other task
as its next attempt), whose grant is taken from the new cap; anything else ends the run with the reason. An
unattended (autonomous) run's ask has a deadline (`PETAL_BUDGET_ASK_S`): past it, its question is closed
unanswered (`expire`) and the run ends as it would have without asking.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor import asks
from executor.settle import dispatch
from executor.settle.budget_store import BudgetRun, BudgetStore
from executor.settle.store import AnsweredEscalation, Ended, SettleStore
from shared import logs
from shared.models import NewEvent
from shared.work import Work

log = logs.get(__name__)

HEADER = "Budget"
STOP = "Stop here"
NO_ANSWER = "no answer by the budget ask's deadline"


def raise_label(usd: float) -> str:
    return f"Raise this run's cap by ${usd:.2f}"


def stopped_how(ended: Ended) -> str:
    if ended.status == "skipped":
        return f"its next {ended.role} could not start"
    return f"the CLI stopped its {ended.role} at the cap"


def question(run: BudgetRun, ended: Ended, raise_usd: float, wait_s: float | None) -> dict[str, Any]:
    """The ask (pure): where the run stands and the two answers the settler acts on."""
    unattended = (f" Unanswered within {wait_s:g} s, the run ends as it would without asking."
                  if wait_s is not None else "")
    return {
        "question": f"The run of routine “{run.name}” has spent ${run.spent:.2f} of its ${run.cap:.2f} cap: "
                    f"{stopped_how(ended)}. Raise the cap and go on?{unattended}",
        "header": HEADER,
        "multiSelect": False,
        "options": [
            {"label": raise_label(raise_usd),
             "description": f"the run may spend up to ${run.cap + raise_usd:.2f}; the stopped {ended.role} runs again"},
            {"label": STOP, "description": "end the run here, with what it has done"},
        ],
    }


def ends_reason(run: BudgetRun, how: str) -> str:
    return f"budget: the run spent {run.spent:.2f} of its {run.cap:.2f} USD ({how})"


async def ask(unit: Work, ended: Ended, *, wait_s: float | None) -> bool:
    """Put the budget ask for `ended` (a task of a running routine run, stopped at its cap) in `unit`; False when
    its run is gone (nothing asked: the end is settled as any other)."""
    assert ended.budget_run_id is not None
    store = BudgetStore(unit)
    run = await store.run_at_cap(ended.budget_run_id)
    if run is None or run.usd_per_run <= 0:
        return False
    raise_usd = run.usd_per_run  # one more run's worth
    posted = await asks.post(unit, [question(run, ended, raise_usd, wait_s)],
                             tool_use_id=f"budget-{ended.id}", task_id=ended.id, session_id=run.thread_id)
    if posted is None:  # asked already (a settlement retried after its commit): nothing twice
        return True
    await store.insert_ask(task_id=ended.id, thread_id=run.thread_id, question_id=posted.id,
                           run_id=ended.budget_run_id, raise_usd=raise_usd, wait_s=wait_s)
    unit.emit(posted.event, NewEvent("budget.asked", {
        "run_id": str(ended.budget_run_id), "question_id": str(posted.id), "status": ended.status,
        "reason": ended.status_reason, "spent_usd": round(run.spent, 6), "cap_usd": run.cap,
        "raise_usd": raise_usd, "wait_s": wait_s}, tier="derived", task_id=ended.id, session_id=run.thread_id))
    log.info("budget_asked", run_id=str(ended.budget_run_id), task_id=str(ended.id), spent=run.spent, cap=run.cap)
    return True


async def act_on_answer(unit: Work, esc: AnsweredEscalation) -> None:
    """Carry out an answered (or expired) budget ask in `unit`: raised — the cap grows and the stopped task runs
    again; else the run ends with the reason. Resolved and `budget.resolved` journaled either way."""
    assert esc.run_id is not None and esc.raise_usd is not None
    store, settle = BudgetStore(unit), SettleStore(unit)
    run = await store.run_at_cap(esc.run_id)
    assert run is not None
    stopped = await settle.settled_worker(esc.task_id)
    assert stopped is not None
    choice = asks.first_choice(esc.answers)  # None for an answer that is not the user's (list_answered_escalations)
    facts: dict[str, Any] = {"escalation_id": str(esc.id), "run_id": str(esc.run_id),
                             "question_id": str(esc.question_id), "answer": choice, "response": esc.response,
                             "answered_by": esc.answered_by, "spent_usd": round(run.spent, 6)}
    if choice == raise_label(esc.raise_usd):
        decision, reason = "raised", None
        facts["usd_raised"] = await store.raise_cap(esc.run_id, esc.raise_usd)
        facts["cap_usd"] = run.cap + esc.raise_usd
        facts["rerun"] = str(await _again(unit, settle, stopped.id, stopped.role, stopped.session_id))
    else:
        decision = "expired" if esc.response == NO_ANSWER else "stopped"
        how = "no answer by the deadline" if decision == "expired" else \
            f"the user answered {choice or esc.response or 'nothing'!r}"
        reason = ends_reason(run, how)
        facts["reason"] = reason
    facts["decision"] = decision
    await store.resolve(esc.id, decision, reason)
    unit.emit(NewEvent("budget.resolved", facts, tier="derived", task_id=esc.task_id, session_id=run.thread_id))
    log.info("budget_resolved", run_id=str(esc.run_id), decision=decision)


async def _again(unit: Work, settle: SettleStore, task_id: uuid.UUID, role: str,
                 session_id: uuid.UUID | None) -> uuid.UUID:
    """The stopped task run again: a turn through its thread's Retry queue (it waits for any open turn), any
    other task as its next attempt (the same request)."""
    if role == "orchestrator" and session_id is not None:
        return await settle.enqueue_turn_retry(session_id, task_id)
    return await dispatch.request_task(unit, await dispatch.retry_request(unit, task_id,
                                                                          requested_by="user (budget)"))


async def expire(pool: AsyncConnectionPool) -> int:
    """Close the questions of unattended budget asks past their deadline (the settler's poll): their runs then
    end as they would have without asking. How many."""
    return await BudgetStore.over(pool).close_expired(NO_ANSWER)
