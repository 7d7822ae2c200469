"""ask_user_question's input rules (executor/harness/questions.py `broken_rule`): the first rule a call breaks,
named so the model can fix it, before anything is asked; and the id its question is asked under."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from executor.harness import questions
from executor.harness.questions import Option, Question, broken_rule
from executor.harness.waiting import OpenAsks


def question(text: str = "Which way?", header: str = "Route", labels: tuple[str, ...] = ("Left", "Right"),
             **kw: Any) -> Question:
    return Question(question=text, header=header, options=[Option(label=label) for label in labels], **kw)


def test_a_valid_call_breaks_no_rule() -> None:
    assert broken_rule([question()]) is None
    assert broken_rule([question(f"Q{n}?", labels=("a", "b", "c", "d")) for n in range(4)]) is None
    assert broken_rule([question(header="x" * 12, multiSelect=True)]) is None  # the longest header


@pytest.mark.parametrize(("questions", "rule"), [
    ([], "rule: 1-4 questions per call (got 0)"),
    ([question(f"Q{n}?") for n in range(5)], "rule: 1-4 questions per call (got 5)"),
    ([question(), question()], "rule: question texts must be unique within a call"),
    ([question("  ")], "rule: a question's text may not be empty"),
    ([question(header=" ")], "rule: header is 1-12 characters (' ' has 1)"),
    ([question(header="x" * 13)], "rule: header is 1-12 characters ('xxxxxxxxxxxxx' has 13)"),
    ([question(labels=("only",))], "rule: 2-4 options per question ('Which way?' has 1)"),
    ([question(labels=("a", "b", "c", "d", "e"))], "rule: 2-4 options per question ('Which way?' has 5)"),
    ([question(labels=("a", " "))], "rule: option labels may not be empty ('Which way?')"),
    ([question(labels=("a", "a"))], "rule: option labels must be unique within a question ('Which way?')"),
])
def test_the_first_broken_rule_is_named(questions: list[Question], rule: str) -> None:
    assert broken_rule(questions) == rule


def test_rules_are_checked_in_order_the_call_then_each_question() -> None:
    # both the count and a header are wrong: the count is said first
    assert broken_rule([question(f"Q{n}?", header="") for n in range(5)]) == "rule: 1-4 questions per call (got 5)"
    # the second question breaks a rule, the first does not: the second is named
    assert broken_rule([question("A?"), question("B?", labels=("x",))]) == "rule: 2-4 options per question ('B?' has 1)"


def test_a_models_question_takes_the_clis_call_id_but_never_one_of_the_executors_own_forms() -> None:
    assert questions.asked_id("toolu_01AbC") == "toolu_01AbC"  # a retry of the call then waits on the same row
    for reserved in ("gate-toolu_01", "approval-6d3c", "budget-6d3c", "escalation-6d3c", "mcp-6d3c"):
        made = questions.asked_id(reserved)
        assert made != reserved and made.startswith("mcp-"), made
    assert questions.asked_id(None).startswith("mcp-") and questions.asked_id(None) != questions.asked_id(None)


def test_a_task_has_at_most_a_few_questions_waiting_at_once_and_room_again_as_they_close() -> None:
    waiting = OpenAsks(most=2)
    task, other = uuid.uuid4(), uuid.uuid4()
    with waiting.admitted(task), waiting.admitted(task):
        with pytest.raises(ToolError, match="2 questions waiting already"), waiting.admitted(task):
            pass
        with waiting.admitted(other):  # another task's are its own
            pass
    with waiting.admitted(task):  # room again
        assert waiting.open == {task: 1}
    assert waiting.open == {}
