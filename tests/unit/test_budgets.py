"""Budgets that ask (executor/settle/budgets.py), on the fake query layer: the ask put for a routine run's end at
its cap, and the answer carried out — a raise grows the cap and runs the stopped task again, anything else (or
no answer by an unattended run's deadline) ends the run with the reason."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from executor.settle import budgets, escalations
from executor.settle.budget_store import BudgetRun
from executor.settle.store import AnsweredEscalation, Ended
from tests.fake_queries import FakeWork
from tests.unit.test_escalations import asked_row, inserted, turn_row, worker_row

RUN, THREAD, QUESTION, ESC = (uuid.uuid4() for _ in range(4))
TASK = uuid.uuid4()
RUN_ROW: dict[str, Any] = {"name": "nightly", "usd_per_run": 0.5, "usd_raised": 0.0, "thread_id": THREAD, "spent": 0.495}


def at_cap(**kw: Any) -> Ended:
    base: dict[str, Any] = {"id": TASK, "role": "extractor", "status": "skipped",
                            "status_reason": "budget: the run spent 0.50 of its 0.50 USD",
                            "budget_run_id": RUN, "budget_mode": "autonomous"}
    return Ended(**{**base, **kw})


def test_the_ask_says_where_the_run_stands_and_offers_a_raise_of_one_more_run_or_a_stop() -> None:
    q = budgets.question(BudgetRun.from_row(RUN_ROW), at_cap(), 0.5, 900.0)
    assert q["header"] == budgets.HEADER and q["multiSelect"] is False
    assert q["question"].startswith("The run of routine “nightly” has spent $0.49 of its $0.50 cap: its next extractor "
                                    "could not start. Raise the cap and go on? Unanswered within 900 s")
    assert [o["label"] for o in q["options"]] == ["Raise this run's cap by $0.50", budgets.STOP]
    stopped = budgets.question(BudgetRun.from_row(RUN_ROW), at_cap(status="partial", status_reason="max_budget_usd",
                                                                     role="worker"), 0.5, None)
    assert "the CLI stopped its worker at the cap. Raise the cap and go on?" in stopped["question"]
    assert "Unanswered" not in stopped["question"]  # an interactive run's ask has no deadline


@pytest.mark.parametrize(("mode", "wait_s"), [("autonomous", 900.0), ("interactive", None)])
async def test_an_end_at_the_cap_is_asked_about_in_its_unit_with_the_deadline_an_unattended_run_gets(
    mode: str, wait_s: float | None
) -> None:
    unit = FakeWork({"get_budget_run": RUN_ROW, "insert_question": {"id": QUESTION}, "insert_budget_escalation": 1})
    assert await budgets.ask(unit, at_cap(budget_mode=mode), wait_s=wait_s)
    assert unit.names() == ["get_budget_run", "insert_question", "insert_budget_escalation"]
    assert unit.params("insert_question")["tool_use_id"] == f"budget-{TASK}"
    assert unit.params("insert_budget_escalation") == {"task_id": TASK, "thread_id": THREAD, "question_id": QUESTION,
                                                       "run_id": RUN, "raise_usd": 0.5, "wait_s": wait_s}
    assert [e.event_type for e in unit.events] == ["question.asked", "budget.asked"]
    asked = unit.events[1].payload
    assert (asked["spent_usd"], asked["cap_usd"], asked["raise_usd"], asked["wait_s"]) == (0.495, 0.5, 0.5, wait_s)


async def test_an_end_already_asked_about_is_not_asked_twice() -> None:
    unit = FakeWork({"get_budget_run": RUN_ROW, "insert_question": None})
    assert await budgets.ask(unit, at_cap(), wait_s=None)
    assert unit.names() == ["get_budget_run", "insert_question"] and unit.events == []


def answered(answer: Any, response: str | None = None, by: str | None = "user") -> AnsweredEscalation:
    return AnsweredEscalation(id=ESC, task_id=TASK, thread_id=THREAD, question_id=QUESTION,
                              answers={"Raise?": answer} if answer is not None else {}, response=response,
                              answered_by=by, kind="budget", run_id=RUN, raise_usd=0.5)


async def test_a_raise_grows_the_run_s_cap_and_runs_the_stopped_task_again() -> None:
    row = worker_row(id=TASK, role="extractor", status="skipped")
    unit = FakeWork({"get_budget_run": RUN_ROW, "get_settled_worker": row, "update_run_usd_raised": {"usd_raised": 0.5},
                     "get_task_request": asked_row(row), "insert_task": inserted, "resolve_budget_escalation": 1})
    await escalations.act_on_answer(unit, answered("Raise this run's cap by $0.50"))
    assert unit.names() == ["get_budget_run", "get_settled_worker", "update_run_usd_raised", "get_task_request",
                            "insert_task", "resolve_budget_escalation"]
    assert unit.params("update_run_usd_raised") == {"run_id": RUN, "usd": 0.5}
    assert unit.params("insert_task")["retry_of"] == TASK
    assert unit.params("resolve_budget_escalation") == {"id": ESC, "decision": "raised", "reason": None}
    resolved = [e.payload for e in unit.events if e.event_type == "budget.resolved"][0]
    assert (resolved["decision"], resolved["cap_usd"], resolved["rerun"]) == (
        "raised", 1.0, str(unit.params("insert_task")["id"]))


async def test_a_raise_for_a_turn_goes_through_its_thread_s_retry_queue() -> None:
    unit = FakeWork({"get_budget_run": RUN_ROW, "get_settled_worker": turn_row(id=TASK, status="partial"),
                     "update_run_usd_raised": {"usd_raised": 0.5}, "enqueue_turn_retry": {"id": uuid.uuid4()},
                     "resolve_budget_escalation": 1})
    await escalations.act_on_answer(unit, answered("Raise this run's cap by $0.50"))
    assert "enqueue_turn_retry" in unit.names() and "insert_task" not in unit.names()


@pytest.mark.parametrize(("esc", "decision", "how"), [
    (answered(budgets.STOP), "stopped", "the user answered 'Stop here'"),
    (answered("only if it is cheap"), "stopped", "the user answered 'only if it is cheap'"),
    (answered(None, budgets.NO_ANSWER, by=None), "expired", "no answer by the deadline"),
    # a raise written some other way than by the ingress: its answers are not read (list_answered_escalations)
    (answered(None, "nothing the harness could act on", by=None), "stopped",
     "the user answered 'nothing the harness could act on'"),
])
async def test_anything_but_a_raise_ends_the_run_with_the_reason(esc: AnsweredEscalation, decision: str,
                                                                 how: str) -> None:
    unit = FakeWork({"get_budget_run": RUN_ROW, "get_settled_worker": worker_row(id=TASK),
                     "resolve_budget_escalation": 1})
    await escalations.act_on_answer(unit, esc)
    assert unit.names() == ["get_budget_run", "get_settled_worker", "resolve_budget_escalation"]
    assert unit.params("resolve_budget_escalation") == {
        "id": ESC, "decision": decision, "reason": f"budget: the run spent 0.49 of its 0.50 USD ({how})"}
