"""A review sent back (executor/settle/reviews.py), on the fake query layer: the follow-up's brief, the one
request it makes through the one door (continuing the reviewed worker, under the same turn), the review kept as
a record in the thread, and what is refused with nothing recorded."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from executor.settle import reviews
from executor.settle.task_rows import ReviewTarget
from tests.fake_queries import FakeWork

pytestmark = pytest.mark.unit

TASK, TURN, PROJECT, THREAD = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
COMMENT = {"file": "app.py", "line": 2, "text": "y should be 4", "hunk": "@@ -1 +1,2 @@\n-x = 1\n+x = 2\n+y = 3"}


def target(**changed: Any) -> dict[str, Any]:
    return {"id": TASK, "role": "worker", "brief": "set x", "status": "success", "project_id": PROJECT,
            "parent_task_id": TURN, "branch": "petal/abc", "review": None, "allowed_tools": ["Bash"],
            "changes": {"head_commit": "c0ffee" * 6, "files": []}, "check_round": 0, "check": None, **changed}


def test_the_brief_carries_what_was_asked_and_each_comment_with_its_lines_and_hunk() -> None:
    long_hunk = "\n".join(["@@ -1 +1,99 @@"] + [f"+line {i}" for i in range(99)])
    brief = reviews.brief_for(ReviewTarget.from_row(target()), [
        COMMENT, {"file": "b.py", "line": 3, "end_line": 7, "text": "split this", "hunk": long_hunk}], "Close.")
    assert brief.startswith("Revise the work on branch petal/abc") and "commit c0ffeec0ffee)" in brief
    assert "What the work was:\nset x" in brief and "Close." in brief
    assert "1. app.py:2 — y should be 4" in brief and "   +y = 3" in brief
    assert "2. b.py:3-7 — split this" in brief
    assert "+line 38" in brief and "+line 39" not in brief  # a hunk is bounded in the brief


async def test_a_review_requests_one_follow_up_continuing_the_worker_and_keeps_the_review() -> None:
    unit = FakeWork({"get_review_target": target(), "get_project_workdir": {"workdir": None},
                     "insert_task": lambda p: {"id": p["id"]}})
    error = await reviews.send_back(unit, THREAD, {"task_id": str(TASK), "comments": [COMMENT], "by": "open"})
    asked = unit.params("insert_task")
    dispatched, review = unit.events
    assert error is None
    assert (asked["role"], asked["continues_task_id"], asked["parent_task_id"], asked["project_id"]) == (
        "worker", TASK, TURN, PROJECT)
    assert asked["allowed_tools"] == ["Bash"] and "y should be 4" in asked["brief"]
    assert dispatched.payload["continues_task_id"] == str(TASK) and dispatched.payload["review_of"] == str(TASK)
    assert (review.event_type, review.task_id, review.session_id) == ("task.review", TASK, THREAD)
    assert review.payload["comments"] == [COMMENT] and review.payload["followup_task_id"] == str(asked["id"])


@pytest.mark.parametrize(("row", "args", "why"), [
    (target(status="running"), {"comments": [COMMENT]}, "is still running"),
    (target(review="merged"), {"comments": [COMMENT]}, "was already merged"),
    (target(changes={"branch": "petal/abc", "error": "git failed"}), {"comments": [COMMENT]}, "no recorded changes"),
    (target(role="orchestrator", branch=None), {"comments": [COMMENT]}, "no worker of a project"),
    (target(), {"comments": []}, "at least one comment"),
    (None, {"comments": [COMMENT]}, "no worker of a project"),
])
async def test_what_cannot_be_sent_back_is_refused_and_nothing_is_recorded(
    row: dict[str, Any] | None, args: dict[str, Any], why: str
) -> None:
    unit = FakeWork({"get_review_target": row})  # insert_task unanswered: it must not run
    error = await reviews.send_back(unit, THREAD, {"task_id": str(TASK), **args})
    assert error is not None and why in error
    assert unit.names() == ["get_review_target"] and unit.events == []


# ---- a failed check's fix round ----------------------------------------------------------------------------

FAILED = {"command": "pytest -q", "passed": False, "exit_code": 1, "duration_s": 2.5, "timed_out": False,
          "tail": [f"line {i}" for i in range(150)] + ["FAILED test_app.py::test_value"]}


def test_a_fix_round_s_brief_carries_the_failed_check_s_last_lines_and_the_work() -> None:
    brief = reviews.fix_brief(ReviewTarget.from_row(target()), FAILED)
    assert brief.startswith("Fix the work on branch petal/abc: the project's check failed")
    assert "The check: `pytest -q` (exit 1)" in brief and brief.count("\nline ") == reviews.FAIL_LINES - 1
    assert "FAILED test_app.py::test_value" in brief and "What the work was:\nset x" in brief
    timed = reviews.fix_brief(ReviewTarget.from_row(target()), {**FAILED, "timed_out": True, "exit_code": None})
    assert "(it was stopped at its time limit)" in timed


async def test_a_failed_check_requests_one_round_further_continuing_the_worker() -> None:
    unit = FakeWork({"get_review_target": target(check=FAILED, check_round=1), "get_project_workdir": {"workdir": None},
                     "insert_task": lambda p: {"id": p["id"]}})
    made = await reviews.fix_round(unit, TASK)
    asked = unit.params("insert_task")
    assert made == asked["id"] and asked["check_round"] == 2 and asked["continues_task_id"] == TASK
    assert asked["parent_task_id"] == TURN and "FAILED test_app.py::test_value" in asked["brief"]
    (dispatched,) = unit.events
    assert dispatched.payload["fix_round_of"] == str(TASK) and dispatched.payload["check_round"] == 2


async def test_no_round_for_a_check_that_passed_or_was_never_run() -> None:
    for row in (target(check={**FAILED, "passed": True}), target(check=None), None):
        unit = FakeWork({"get_review_target": row})  # insert_task unanswered: it must not run
        assert await reviews.fix_round(unit, TASK) is None
        assert unit.events == []
