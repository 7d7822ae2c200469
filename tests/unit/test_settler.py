"""Settlement routing (executor/settle/settler.py): which step an end calls for, from what the store holds."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from executor.journal.writer import JournalWriter
from executor.settle.settler import Settler, SettlerConfig, Step, retry_delay, route
from executor.settle.store import Ended
from executor.settle.threads import Threads
from shared import consume

THREAD = uuid.uuid4()
SCHEMA = {"type": "object"}


def ended(**kw: Any) -> Ended:
    base: dict[str, Any] = {"id": uuid.uuid4(), "role": "worker", "status": "success", "status_reason": "completed",
                            "extract_on_exit": True, "exited": {"status": "success", "lines": 12}}
    return Ended(**{**base, **kw})


@pytest.mark.parametrize(("end", "step"), [
    (ended(), Step.EXTRACT),  # a worker that printed: its extractor runs first, the policy waits for it
    (ended(thread_id=THREAD), Step.EXTRACT),
    (ended(thread_id=THREAD, exited={"status": "skipped", "spawned": False}, status="skipped"), Step.POLICY),
    (ended(thread_id=THREAD, exited=None, status="crashed"), Step.POLICY),  # reconciled: no exit record
    (ended(thread_id=THREAD, exited={"lines": 0}), Step.POLICY),
    (ended(exited={"lines": 0}), Step.NOTHING),  # dispatched by hand, nothing to extract: nobody acts
    (ended(role="extractor", extract_on_exit=False, parent_task_id=uuid.uuid4(), json_schema=SCHEMA), Step.VALIDATE),
    (ended(role="extractor", extract_on_exit=False, json_schema=SCHEMA), Step.NOTHING),  # no worker to validate for
    (ended(role="orchestrator", extract_on_exit=False, thread_turn=True), Step.TELL_THREAD),
    (ended(role="orchestrator", extract_on_exit=False, thread_turn=True, status="crashed", exited=None),
     Step.TURN_FAILED),  # a failed turn is recorded in the chat and goes through the turns' policy
    # a project worker whose check failed with a round left: fixed first, no handoff of the failed run
    (ended(thread_id=THREAD, changes_due=True, fix_round_due=True), Step.FIX_ROUND),
])
def test_an_end_is_routed_by_what_it_is_and_what_it_left(end: Ended, step: Step) -> None:
    assert route(end, extract=True) is step


def test_a_turn_cut_off_by_the_executors_shutdown_runs_again_and_other_failed_turns_go_through_the_policy() -> None:
    turn = {"role": "orchestrator", "extract_on_exit": False, "thread_turn": True, "exited": None}
    assert route(ended(**turn, status="crashed", status_reason="executor_shutdown"), extract=True) is Step.RERUN_TURN
    assert route(ended(**turn, status="crashed", status_reason="executor_restart"), extract=True) is Step.TURN_FAILED
    assert route(ended(**turn, status="cancelled", status_reason="stop_requested"), extract=True) is Step.TURN_FAILED
    # ended while parked on its user past PETAL_MAX_PARKED: a boundary (its question's answer resumes the thread)
    assert route(ended(**turn, status="cancelled", status_reason="parked_limit"), extract=True) is Step.TELL_THREAD
    assert route(ended(**turn, status="rate_limited"), extract=False) is Step.TURN_FAILED
    assert route(ended(**turn, status="success"), extract=True) is Step.TELL_THREAD


def test_without_extraction_only_a_turns_end_is_acted_on() -> None:
    assert route(ended(thread_id=THREAD), extract=False) is Step.NOTHING
    assert route(ended(thread_id=THREAD, exited={"lines": 0}), extract=False) is Step.NOTHING
    assert route(ended(role="orchestrator", thread_turn=True), extract=False) is Step.TELL_THREAD


@pytest.mark.parametrize("end", [
    ended(role="orchestrator", thread_turn=True, status="partial", status_reason="max_budget_usd"),
    ended(role="extractor", json_schema={"type": "object"}, parent_task_id=uuid.uuid4(), status="skipped",
          status_reason="budget: the run spent 0.50 of its 0.50 USD"),
    ended(status="failed", status_reason="max_budget_usd", thread_id=THREAD, extract_on_exit=True,
          exited={"lines": 3}),
])
def test_an_end_at_its_routine_run_s_cap_asks_before_any_other_step(end: Ended) -> None:
    assert route(end, extract=True) is not Step.BUDGET_ASK  # not in a running routine run: as always
    run = uuid.uuid4()
    assert route(replace(end, budget_run_id=run, budget_mode="autonomous"), extract=True) is Step.BUDGET_ASK
    # an unattended run does not ask when asking is off (PETAL_BUDGET_ASK_S=0); an interactive one always does
    assert route(replace(end, budget_run_id=run, budget_mode="autonomous"), extract=True,
                 unattended_asks=False) is route(end, extract=True)
    assert route(replace(end, budget_run_id=run, budget_mode="interactive"), extract=True,
                 unattended_asks=False) is Step.BUDGET_ASK


def test_a_task_started_unless_its_exit_record_says_it_never_spawned() -> None:
    assert ended().started and ended(exited=None).started
    assert not ended(exited={"spawned": False}).started


def test_a_failing_settlement_waits_longer_each_time_up_to_the_cap() -> None:
    assert [retry_delay(n, 1.0, 60.0) for n in (1, 2, 3, 7, 8, 50)] == [1.0, 2.0, 4.0, 60.0, 60.0, 60.0]


def test_an_end_is_read_from_a_claimed_row() -> None:
    row = {"id": uuid.uuid4(), "role": "worker", "status": "failed", "status_reason": "no_result",
           "parent_task_id": None, "json_schema": None, "extract_on_exit": True, "thread_turn": False,
           "thread_id": THREAD, "exited": {"lines": 3}, "exit_event": uuid.uuid4(), "changes_due": True,
           "fix_round_due": False, "budget_run_id": None, "budget_mode": None}
    end = Ended.from_row(row)
    assert end.printed and not end.is_extractor and end.thread_id == THREAD and end.changes_due


def _woken(by_channel: dict[str, list[consume.Pass]], *channels: str) -> list[str]:
    return [consume._name(p) for p in consume.due_passes([c or None for c in channels], by_channel)]


async def test_the_settler_takes_ends_on_task_ended_and_the_answers_it_acts_on_on_question_settle() -> None:
    by_channel = Settler(AsyncConnectionPool("postgresql://unused", open=False), SettlerConfig()).passes_by_channel()
    assert _woken(by_channel, "task_ended") == ["settle_pending", "apply_approvals"]
    assert _woken(by_channel, "question_settle") == ["apply_approvals", "apply_escalations", "deliver_late_answers"]
    assert _woken(by_channel, "") == ["settle_pending", "apply_approvals", "apply_escalations",
                                      "deliver_late_answers", "record_leftover_changes",
                                      "expire_budget_asks"]  # the poll


async def test_the_threads_loop_only_delivers_chat_and_applies_controls_first() -> None:
    pool = AsyncConnectionPool("postgresql://unused", open=False)
    by_channel = Threads(pool, JournalWriter(pool)).passes_by_channel()
    assert _woken(by_channel, "chat_queue") == ["deliver"]
    assert _woken(by_channel, "thread_control_queue") == ["apply_controls", "deliver"]
    assert _woken(by_channel, "") == ["apply_controls", "deliver"]  # the poll: nothing else is the thread's
