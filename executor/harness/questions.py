"""`ask_user_question`: the model asks the user multiple-choice questions and waits for the answers."""

from __future__ import annotations

import uuid

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from executor import asks
from executor.harness.identity import tool_use_id
from executor.harness.results import Result
from executor.harness.services import Harness

LATE_NOTE = ("the question stays open in the user's panel, marked late; if they answer it, the answer "
             "reaches you as a harness message")
CHAT_NOTE = "the user replied in the chat instead of choosing an option"
ALREADY_NOTE = ("already answered: the user answered this same question in this thread a moment ago, nothing was "
                "asked again; their answer is above. Do not ask it again: act on it")
MAX_QUESTIONS, MIN_OPTIONS, MAX_OPTIONS, MAX_HEADER = 4, 2, 4, 12


class Option(Result):
    label: str = Field(description="the choice as shown on its button (1-5 words)")
    description: str = Field(default="", description="what choosing it means")
    preview: str | None = Field(default=None, description="optional markdown shown with the option")


class Question(Result):
    question: str = Field(description="the full question, ending with a question mark")
    header: str = Field(description="a very short label (at most 12 characters)")
    options: list[Option] = Field(description="2-4 choices; the user can always type another answer")
    multiSelect: bool = Field(default=False, description="true to allow several choices")  # noqa: N815


class AskResult(Result):
    questions: list[Question] = Field(description="the questions as asked")
    answers: asks.Answers = Field(description="each answered question's text → the chosen label, a list of "
                                              "labels for multiSelect, or the text the user typed instead")
    response: str | None = Field(default=None, description="the user's reply when they answered with text "
                                                           "(or why there is no answer: dismissed, timed out)")
    annotation: str | None = Field(default=None, description="how to read the answer, when it needs saying")


def broken_rule(questions: list[Question]) -> str | None:
    """The first rule the input breaks, named so the model can fix it; None when valid."""
    if not 1 <= len(questions) <= MAX_QUESTIONS:
        return f"rule: 1-{MAX_QUESTIONS} questions per call (got {len(questions)})"
    texts = [q.question for q in questions]
    if len(set(texts)) != len(texts):
        return "rule: question texts must be unique within a call"
    for q in questions:
        if not q.question.strip():
            return "rule: a question's text may not be empty"
        if not q.header.strip() or len(q.header) > MAX_HEADER:
            return f"rule: header is 1-{MAX_HEADER} characters ({q.header!r} has {len(q.header)})"
        if not MIN_OPTIONS <= len(q.options) <= MAX_OPTIONS:
            return f"rule: {MIN_OPTIONS}-{MAX_OPTIONS} options per question ({q.question!r} has {len(q.options)})"
        labels = [o.label for o in q.options]
        if any(not label.strip() for label in labels):
            return f"rule: option labels may not be empty ({q.question!r})"
        if len(set(labels)) != len(labels):
            return f"rule: option labels must be unique within a question ({q.question!r})"
    return None


# the ids the executor gives the questions it asks itself (gate cards, approvals, budgets, escalations, its own
# fallback): never taken from a caller, whose call would otherwise be joined to, or pre-empt, such a question
RESERVED_IDS = ("gate-", "approval-", "budget-", "escalation-", "mcp-")


def asked_id(given: str | None) -> str:
    """A model's question's id: the CLI's tool call id (a retry of the call then waits on the same row), unless it
    names none or takes one of the executor's own forms; then one of its own."""
    if given and not given.startswith(RESERVED_IDS):
        return given
    return f"mcp-{uuid.uuid4()}"


def register(server: MCPServer, harness: Harness) -> None:
    @server.tool(structured_output=True)
    async def ask_user_question(questions: list[Question], ctx: Context) -> AskResult:
        """Ask the user 1-4 multiple-choice questions and wait for the answers (the chat stays usable).

        Each question has 2-4 options; headers are at most 12 characters; the user may also type a
        free-text answer or reply instead of choosing. Returns {questions, answers, response?}: answers
        maps each question's text to the chosen label (or a list of labels for multiSelect); a typed
        answer is the text itself; a reply without answers comes back in `response`. The same questions
        already pending in this thread are not asked twice (this call waits for that answer), and the
        thread's last question asked again soon after its answer returns that answer, annotated.
        """
        caller = await harness.identities.caller(ctx, "ask_user_question")
        rule = broken_rule(questions)
        if rule is not None:
            raise ToolError(f"ask_user_question refused, nothing was asked: {rule}")
        stored = [q.model_dump() for q in questions]  # without the Nones (Result)
        with harness.waiting.admitted(caller.task_id):
            final = await harness.asks.ask(stored, tool_use_id=asked_id(tool_use_id(ctx)), caller=caller,
                                           progress=ctx)
        annotation = None
        if final.answered_via == "chat":
            annotation = CHAT_NOTE
        if final.status == asks.TIMED_OUT_STATUS:
            annotation = LATE_NOTE
        if final.status == asks.ALREADY_ANSWERED_STATUS:
            annotation = ALREADY_NOTE
        return AskResult(questions=questions, answers=final.answers, response=final.response,
                         annotation=annotation)
