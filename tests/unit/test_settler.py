"""Settlement routing (executor/settle/settler.py): which step an end calls for, from what the store holds."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from executor.settle.settler import Ended, Step, retry_delay, route

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
    (ended(role="extractor", extract_on_exit=False, parent_task_id=uuid.uuid4(), json_schema=SCHEMA), Step.GATE),
    (ended(role="extractor", extract_on_exit=False, json_schema=SCHEMA), Step.NOTHING),  # no worker to gate for
    (ended(role="orchestrator", extract_on_exit=False, thread_turn=True), Step.TELL_THREAD),
    (ended(role="orchestrator", extract_on_exit=False, thread_turn=True, status="crashed", exited=None),
     Step.TURN_FAILED),  # a failed turn is recorded in the chat and goes through the turns' policy
])
def test_an_end_is_routed_by_what_it_is_and_what_it_left(end: Ended, step: Step) -> None:
    assert route(end, extract=True) is step


def test_a_turn_cut_off_by_the_executors_shutdown_runs_again_and_other_failed_turns_go_through_the_policy() -> None:
    turn = {"role": "orchestrator", "extract_on_exit": False, "thread_turn": True, "exited": None}
    assert route(ended(**turn, status="crashed", status_reason="executor_shutdown"), extract=True) is Step.RERUN_TURN
    assert route(ended(**turn, status="crashed", status_reason="executor_restart"), extract=True) is Step.TURN_FAILED
    assert route(ended(**turn, status="cancelled", status_reason="stop_requested"), extract=True) is Step.TURN_FAILED
    assert route(ended(**turn, status="rate_limited"), extract=False) is Step.TURN_FAILED
    assert route(ended(**turn, status="success"), extract=True) is Step.TELL_THREAD


def test_without_extraction_only_a_turns_end_is_acted_on() -> None:
    assert route(ended(thread_id=THREAD), extract=False) is Step.NOTHING
    assert route(ended(thread_id=THREAD, exited={"lines": 0}), extract=False) is Step.NOTHING
    assert route(ended(role="orchestrator", thread_turn=True), extract=False) is Step.TELL_THREAD


def test_a_task_started_unless_its_exit_record_says_it_never_spawned() -> None:
    assert ended().started and ended(exited=None).started
    assert not ended(exited={"spawned": False}).started


def test_a_failing_settlement_waits_longer_each_time_up_to_the_cap() -> None:
    assert [retry_delay(n, 1.0, 60.0) for n in (1, 2, 3, 7, 8, 50)] == [1.0, 2.0, 4.0, 60.0, 60.0, 60.0]


def test_an_end_is_read_from_a_claimed_row() -> None:
    row = {"id": uuid.uuid4(), "role": "worker", "status": "failed", "status_reason": "no_result",
           "parent_task_id": None, "json_schema": None, "extract_on_exit": True, "thread_turn": False,
           "thread_id": THREAD, "exited": {"lines": 3}, "changes_due": True}
    end = Ended.from_row(row)
    assert end.printed and not end.is_extractor and end.thread_id == THREAD and end.changes_due
