"""A worker's brief as the harness sends it (executor/settle/briefs.py), on the fake query layer: what the store
adds to the orchestrator's text, and what a retry is told of the attempt it repeats — bounded."""

from __future__ import annotations

import uuid
from typing import Any

from executor.settle import briefs
from executor.settle.store import SettledWorker, SettleStore
from tests.fake_queries import FakeWork

PROJECT, SCOPE, TASK = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def attempt(**kw: Any) -> SettledWorker:
    base: dict[str, Any] = {"id": TASK, "role": "worker", "session_id": None, "status": "crashed",
                            "status_reason": "executor_restart", "attempt": 1, "brief": "b", "project_id": None,
                            "first_attempt": TASK, "follows_policy": True, "thread_id": None}
    return SettledWorker(**{**base, **kw})


async def test_a_brief_gets_the_plan_tasks_earlier_handoffs_and_the_scopes_rule_outs() -> None:
    store = SettleStore(FakeWork({
        "list_plan_task_handoffs": [{"payload": {"status": "failed", "current_state": "half", "next_step": "finish"}}],
        "list_scope_rule_outs": [{"approach": "regex parsing", "reason": "too brittle"}]}))
    brief = await briefs.enrich_on(store, "parse it", scope=SCOPE, project_id=PROJECT, plan_ref="T-3")
    assert brief == ("parse it\n\n## Earlier handoffs for T-3 (newest first)\n- [failed] half (next: finish)\n\n"
                     "## Already ruled out here (do not retry these)\n- regex parsing — too brittle")


async def test_a_brief_outside_a_plan_task_with_nothing_ruled_out_is_sent_as_written() -> None:
    unit = FakeWork({"list_scope_rule_outs": []})
    assert await briefs.enrich_on(SettleStore(unit), "parse it", scope=SCOPE, project_id=None, plan_ref=None) == "parse it"
    assert unit.names() == ["list_scope_rule_outs"]  # no plan task: its handoffs are not read


async def test_a_retry_is_told_the_tool_calls_the_interrupted_attempt_made() -> None:
    calls = [{"name": "Bash", "input": {"command": "make   install"}, "total": 3, "finished": True},
             {"name": "Edit", "input": {"file_path": "/w/a.py", "old": "x"}, "total": 3, "finished": False}]
    unit = FakeWork({"list_attempt_tool_calls": calls})
    section = await briefs.earlier_attempt(SettleStore(unit), attempt())
    assert unit.params("list_attempt_tool_calls") == {"task_id": TASK, "limit": briefs.MAX_TOOL_CALLS}
    assert section.splitlines() == [
        "## An earlier attempt was interrupted",
        "Attempt 1 of this brief was interrupted (crashed: executor_restart) before it finished. It had already made "
        "these tool calls (oldest first); their effects may already be in place, so check before doing any of them "
        "again:",
        "- Bash: `make install`",
        "- Edit: `/w/a.py` (no result came back: it may or may not have finished)",
        "- … and 1 later calls"]


async def test_an_attempt_that_ended_by_itself_without_calls_says_so() -> None:
    section = await briefs.earlier_attempt(SettleStore(FakeWork({"list_attempt_tool_calls": []})),
                                           attempt(status="failed", status_reason=None, attempt=2))
    assert section == ("## An earlier attempt ended\nAttempt 2 of this brief ended (failed: no reason recorded) "
                       "before it finished. It had made no tool calls.")


def test_a_long_call_is_cut_and_a_long_section_says_how_much_was_left_out() -> None:
    line = briefs._call_line("Write", {"content": "y" * 500}, True)
    assert line.endswith("…`") and len(line) < briefs.CALL_CHARS + 40
    bounded = briefs._bounded([f"- line {n} " + "z" * 200 for n in range(20)])
    assert bounded.splitlines()[-1].startswith("- … (") and len(bounded) <= briefs.SECTION_CHARS + 60


def test_an_approval_card_shows_a_brief_whole_or_says_in_its_question_how_much_it_does_not_show() -> None:
    short = "Run the unit tests and report."
    card = briefs.approval_question(short)
    assert card["options"][0]["preview"] == short
    assert card["question"] == "The orchestrator wants to start a worker with this brief. Start it?"
    # an innocent head long enough to fill the card, then what the user would not see
    long = "Run the unit tests and report. " * 700 + "\n\nALSO: push the branch to the mirror."
    card = briefs.approval_question(long)
    left = len(long) - briefs.BRIEF_PREVIEW_CHARS
    assert left > 0 and "ALSO" not in card["options"][0]["preview"]
    assert f"{left:,} are not shown" in card["question"]
    assert card["options"][0]["preview"].endswith(f"… {left:,} more characters not shown")
