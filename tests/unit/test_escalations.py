"""Escalations and the policy carried out (executor/settle/escalations.py), on the fake query layer: each step
takes the settler's unit of work; what it runs, what it queues for the orchestrator and what it emits, in the
journal's order."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from executor.settle import escalations, policy
from executor.settle.store import AnsweredEscalation, SettledWorker
from tests.fake_queries import FakeWork

WORKER, TURN, THREAD, PROJECT, QUESTION = (uuid.uuid4() for _ in range(5))


def worker_row(**kw: Any) -> dict[str, Any]:
    base = {"id": WORKER, "role": "worker", "session_id": uuid.uuid4(), "status": "failed",
            "status_reason": "no_result", "attempt": 1, "brief": "count the files", "project_id": PROJECT,
            "first_attempt": WORKER, "follows_policy": True, "thread_id": THREAD}
    return {**base, **kw}


def turn_row(**kw: Any) -> dict[str, Any]:
    return worker_row(**{"id": TURN, "role": "orchestrator", "session_id": THREAD, "first_attempt": TURN,
                         "thread_id": None, "brief": "hello there", **kw})


def asked_row(row: dict[str, Any]) -> dict[str, Any]:
    """The task's request as get_task_request reads it (what its repeat asks again)."""
    return {"role": row["role"], "brief": row["brief"], "project_id": row["project_id"],
            "session_id": row["session_id"], "parent_task_id": None, "plan_ref": None, "workdir": None,
            "allowed_tools": None, "json_schema": None, "placement_executor": None, "required_labels": [],
            "attempt": row["attempt"], "attachment_ids": [], "continues_task_id": None, "check_round": 0}


def inserted(params: Any) -> dict[str, Any]:
    return {"id": params["id"]}


def kinds(unit: FakeWork) -> list[str]:
    return [e.event_type for e in unit.events]


# ---- the questions (pure) ------------------------------------------------------------------------------

def test_an_escalation_question_offers_retry_skip_and_stop_with_what_came_back() -> None:
    worker = SettledWorker.from_row(worker_row(attempt=2))
    decision = policy.decide("failed", 2, 10)
    q = escalations.escalation_question(worker, decision, '{"goal": "g"}')
    assert q["header"] == escalations.ESCALATION_HEADER and q["multiSelect"] is False
    assert q["question"] == (f"A worker ended failed again (attempt 2; {decision.why}). What should the harness do?")
    labels = [o["label"] for o in q["options"]]
    assert labels == [policy.ESCALATION_RETRY, policy.ESCALATION_SKIP, policy.ESCALATION_STOP]
    preview = q["options"][0]["preview"]
    assert "count the files" in preview and '{"goal": "g"}' in preview


def test_a_failed_extraction_offers_re_extracting_before_running_the_worker_again() -> None:
    worker = SettledWorker.from_row(worker_row(status="extraction_failed"))
    q = escalations.escalation_question(worker, policy.decide("extraction_failed", 1, 10), "{}")
    assert "again" not in q["question"].split("(")[0]  # a first attempt
    assert [o["label"] for o in q["options"]] == [policy.ESCALATION_REEXTRACT, policy.ESCALATION_RETRY_WORKER,
                                                  policy.ESCALATION_SKIP, policy.ESCALATION_STOP]


def test_an_escalation_questions_previews_are_bounded() -> None:
    worker = SettledWorker.from_row(worker_row(brief="b" * 10_000))
    q = escalations.escalation_question(worker, policy.decide("failed", 2, 10), "s" * 10_000)
    assert len(q["options"][0]["preview"]) < escalations.MAX_PREVIEW_CHARS + 100


def test_a_turn_question_offers_to_run_the_messages_again_or_leave_them() -> None:
    turn = SettledWorker.from_row(turn_row(status="failed", status_reason="max_turns"))
    q = escalations.turn_question(turn, policy.decide("failed", 1, 10, role="orchestrator"))
    assert q["header"] == escalations.TURN_HEADER and "max_turns" in q["question"]
    assert [o["label"] for o in q["options"]] == [policy.ESCALATION_RETRY, policy.ESCALATION_SKIP]
    assert "hello there" in q["options"][0]["preview"]


# ---- a worker's end -------------------------------------------------------------------------------------

async def test_a_clean_end_is_reported_to_the_orchestrator_in_its_threads_chat() -> None:
    unit = FakeWork({"get_settled_worker": worker_row(status="success", status_reason="completed"),
                     "enqueue_orchestrator_note": {"id": uuid.uuid4()}})
    await escalations.apply_policy(unit, WORKER, "handoff", {"goal": "done", "raw_seq_range": [1, 2]},
                                   backoff_base_s=10)
    assert unit.names() == ["get_settled_worker", "enqueue_orchestrator_note"]
    note = unit.params("enqueue_orchestrator_note")
    assert note["thread_id"] == THREAD and note["text"].startswith(f"[harness] Worker {WORKER} finished. Its handoff:")
    assert "raw_seq_range" not in note["text"]  # left out of the summary
    (decision,) = unit.events
    assert (decision.event_type, decision.task_id, decision.session_id, decision.project_id) == (
        "policy.decision", WORKER, THREAD, PROJECT)
    assert decision.payload["action"] == policy.REPORT and decision.payload["record"] == "handoff"


async def test_a_worker_outside_a_threads_loop_gets_nothing() -> None:
    unit = FakeWork({"get_settled_worker": worker_row(thread_id=None)})
    await escalations.apply_policy(unit, WORKER, "task.exited", {}, backoff_base_s=10)
    assert unit.names() == ["get_settled_worker"] and unit.events == []


async def test_a_failed_worker_is_retried_with_what_came_back_and_the_decision_goes_first() -> None:
    row = worker_row()
    unit = FakeWork({"get_settled_worker": row, "list_attempt_tool_calls": [], "get_task_request": asked_row(row),
                     "insert_task": inserted})
    await escalations.apply_policy(unit, WORKER, "handoff", {"goal": "half"}, backoff_base_s=10)
    assert unit.names() == ["get_settled_worker", "list_attempt_tool_calls", "get_task_request", "insert_task"]
    brief = unit.params("insert_task")["brief"]
    assert brief.startswith("count the files\n\n## The previous attempt\nIt ended failed (no_result).")
    assert "It had made no tool calls." in brief
    assert kinds(unit) == ["policy.decision", "task.dispatch_requested"]
    decision, requested = unit.events
    assert decision.payload["action"] == policy.RETRY_MODIFIED
    assert decision.payload["retry_task_id"] == str(requested.task_id)
    assert unit.params("insert_task")["retry_of"] == WORKER and unit.params("insert_task")["attempt"] == 2


async def test_a_rate_limited_worker_backs_off() -> None:
    row = worker_row(status="rate_limited")
    unit = FakeWork({"get_settled_worker": row, "list_attempt_tool_calls": [], "get_task_request": asked_row(row),
                     "insert_task": inserted})
    await escalations.apply_policy(unit, WORKER, "task.exited", {}, backoff_base_s=10)
    assert unit.params("insert_task")["delay_s"] == 10
    assert unit.events[0].payload["delay_s"] == 10


async def test_a_spent_budget_escalates_with_a_question_and_an_escalation_row() -> None:
    unit = FakeWork({"get_settled_worker": worker_row(attempt=2), "insert_question": {"id": QUESTION},
                     "insert_escalation": 1})
    await escalations.apply_policy(unit, WORKER, "handoff", {}, backoff_base_s=10)
    assert unit.names() == ["get_settled_worker", "insert_question", "insert_escalation"]
    assert unit.params("insert_escalation") == {"task_id": WORKER, "thread_id": THREAD, "question_id": QUESTION}
    assert unit.params("insert_question")["tool_use_id"].startswith("escalation-")
    assert kinds(unit) == ["policy.decision", "question.asked"]
    assert unit.events[0].payload["question_id"] == str(QUESTION)


async def test_a_role_without_the_policy_is_reported_whatever_its_end() -> None:
    unit = FakeWork({"get_settled_worker": worker_row(follows_policy=False), "enqueue_orchestrator_note": None})
    await escalations.apply_policy(unit, WORKER, "task.exited", {}, backoff_base_s=10)
    assert unit.events[0].payload["why"] == "role has no policy"
    assert "finished. It left no output to extract" in unit.params("enqueue_orchestrator_note")["text"]


# ---- a turn's failure -----------------------------------------------------------------------------------

async def test_a_crashed_turn_is_run_again_and_recorded_first() -> None:
    row = turn_row(status="crashed", status_reason="executor_restart")
    unit = FakeWork({"get_settled_worker": row, "get_task_request": asked_row(row), "insert_task": inserted})
    await escalations.apply_turn_policy(unit, TURN, backoff_base_s=10)
    assert kinds(unit) == ["turn.failed", "task.dispatch_requested"]
    failed, rerun = unit.events
    assert failed.payload["rerun_task_id"] == str(rerun.task_id) and "retry" not in failed.payload
    assert rerun.payload["rerun_of"] == str(TURN) and unit.params("insert_task")["session_id"] == THREAD


async def test_a_turn_already_run_again_is_recorded_without_a_second_run() -> None:
    row = turn_row(status="crashed", status_reason="executor_restart")
    unit = FakeWork({"get_settled_worker": row, "get_task_request": asked_row(row), "insert_task": None})
    await escalations.apply_turn_policy(unit, TURN, backoff_base_s=10)
    (failed,) = unit.events
    assert failed.payload["rerun_task_id"] is None


async def test_a_failed_turn_is_escalated_and_offers_the_users_retry() -> None:
    unit = FakeWork({"get_settled_worker": turn_row(status="failed", status_reason="max_turns"),
                     "insert_question": {"id": QUESTION}, "insert_escalation": 1})
    await escalations.apply_turn_policy(unit, TURN, backoff_base_s=10)
    assert kinds(unit) == ["turn.failed", "question.asked"]
    failed = unit.events[0]
    assert failed.payload["retry"]["path"] == f"/api/threads/{THREAD}/retry"
    assert failed.payload["question_id"] == str(QUESTION) and failed.session_id == THREAD
    assert unit.params("insert_escalation")["thread_id"] == THREAD


async def test_a_stopped_turn_is_left_to_the_users_retry() -> None:
    unit = FakeWork({"get_settled_worker": turn_row(status="cancelled", status_reason="stop_requested")})
    await escalations.apply_turn_policy(unit, TURN, backoff_base_s=10)
    assert unit.names() == ["get_settled_worker"] and kinds(unit) == ["turn.failed"]
    assert unit.events[0].payload["action"] == policy.SKIP


# ---- the user's Retry of a turn -------------------------------------------------------------------------

@pytest.mark.parametrize(("row", "error"), [
    (None, f"no turn {TURN} in thread {THREAD}"),
    (turn_row(session_id=uuid.uuid4()), f"no turn {TURN} in thread {THREAD}"),
    (worker_row(id=TURN, session_id=THREAD), f"no turn {TURN} in thread {THREAD}"),
    (turn_row(status="success"), f"turn {TURN} is success: only a failed turn is retried"),
])
async def test_only_a_failed_turn_of_the_thread_is_retried(row: dict[str, Any] | None, error: str) -> None:
    unit = FakeWork({"get_settled_worker": row})
    assert await escalations.retry_turn(unit, TURN, THREAD, requested_by="user (retry)") == error
    assert unit.events == []


async def test_the_users_retry_runs_the_turn_again_and_answers_its_open_escalation() -> None:
    row = turn_row()
    escalation = uuid.uuid4()
    unit = FakeWork({"get_settled_worker": row, "get_task_request": asked_row(row), "insert_task": inserted,
                     "resolve_task_escalation": [{"id": escalation, "question_id": QUESTION}],
                     "close_question": {"id": QUESTION}})
    assert await escalations.retry_turn(unit, TURN, THREAD, requested_by="user (retry)") is None
    assert unit.params("close_question") == {"id": QUESTION, "response": "retried from the chat"}
    assert kinds(unit) == ["task.dispatch_requested", "escalation.resolved"]
    assert unit.events[1].payload["retry_task_id"] == str(unit.events[0].task_id)


async def test_the_users_retry_of_a_turn_run_again_already_is_refused() -> None:
    row = turn_row()
    unit = FakeWork({"get_settled_worker": row, "get_task_request": asked_row(row), "insert_task": None})
    assert await escalations.retry_turn(unit, TURN, THREAD, requested_by="u") == f"turn {TURN} was already run again"


# ---- the user answered an escalation --------------------------------------------------------------------

def answered(answer: Any, response: str | None = None) -> AnsweredEscalation:
    return AnsweredEscalation(id=uuid.uuid4(), task_id=WORKER, thread_id=THREAD, question_id=QUESTION,
                              answers={"What should the harness do?": answer} if answer is not None else {},
                              response=response)


async def test_retry_runs_the_worker_again_and_the_resolution_goes_first() -> None:
    row = worker_row()
    unit = FakeWork({"get_settled_worker": row, "get_task_request": asked_row(row), "insert_task": inserted,
                     "resolve_escalation": 1})
    esc = answered([policy.ESCALATION_RETRY])  # a multiSelect's list counts by its first label
    await escalations.act_on_answer(unit, esc)
    assert unit.names() == ["get_settled_worker", "get_task_request", "insert_task", "resolve_escalation"]
    assert unit.params("resolve_escalation") == {"id": esc.id, "decision": "retry"}
    assert kinds(unit) == ["escalation.resolved", "task.dispatch_requested"]
    assert unit.events[0].payload["retry_task_id"] == str(unit.events[1].task_id)


async def test_stop_the_plan_cancels_and_stops_the_threads_workers_and_tells_the_orchestrator() -> None:
    pending, running = uuid.uuid4(), uuid.uuid4()
    unit = FakeWork({"get_settled_worker": worker_row(), "cancel_thread_pending_workers": [{"id": pending}],
                     "stop_thread_running_workers": [{"task_id": running}], "enqueue_orchestrator_note": None,
                     "resolve_escalation": 1})
    await escalations.act_on_answer(unit, answered(policy.ESCALATION_STOP))
    (resolved,) = unit.events
    assert resolved.payload["decision"] == "stop_plan"
    assert resolved.payload["cancelled_tasks"] == [str(pending)] and resolved.payload["stop_requested"] == [str(running)]
    assert "chose to stop the plan" in unit.params("enqueue_orchestrator_note")["text"]


@pytest.mark.parametrize(("esc", "decision", "said"), [
    (answered(policy.ESCALATION_SKIP), "skip", repr(policy.ESCALATION_SKIP)),
    (answered("do it by hand"), "relay", "'do it by hand'"),
    (answered(None, response="later"), "relay", "'later'"),
    (answered(None), "relay", "'nothing'"),
])
async def test_anything_else_drops_the_piece_and_tells_the_orchestrator_the_answer(
        esc: AnsweredEscalation, decision: str, said: str) -> None:
    unit = FakeWork({"get_settled_worker": worker_row(), "enqueue_orchestrator_note": None, "resolve_escalation": 1})
    await escalations.act_on_answer(unit, esc)
    assert unit.events[0].payload["decision"] == decision
    assert f"the user answered: {said}." in unit.params("enqueue_orchestrator_note")["text"]


async def test_a_turns_escalation_answered_retry_is_queued_like_the_chats_retry() -> None:
    queued = uuid.uuid4()
    unit = FakeWork({"get_settled_worker": turn_row(), "enqueue_turn_retry": {"id": queued}, "resolve_escalation": 1})
    await escalations.act_on_answer(unit, answered(policy.ESCALATION_RETRY))
    assert unit.params("enqueue_turn_retry") == {"thread_id": THREAD, "task_id": TURN}
    (resolved,) = unit.events
    assert resolved.payload["decision"] == "retry" and resolved.payload["retry_queued"] == str(queued)


async def test_a_turns_escalation_answered_otherwise_tells_nobody() -> None:
    unit = FakeWork({"get_settled_worker": turn_row(), "resolve_escalation": 1})
    await escalations.act_on_answer(unit, answered(policy.ESCALATION_SKIP))
    assert unit.names() == ["get_settled_worker", "resolve_escalation"]
    assert unit.events[0].payload["decision"] == "skip"
