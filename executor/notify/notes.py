"""What a journal record tells the user: the few record types that need a person, as short notes (a title,
one line and a deep link: never a secret or a transcript)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from executor.notify.store import Candidate

LINE_CHARS = 140
# a notification's action buttons: the first options of a question (browsers show two; the rest open the page)
MAX_OPTION_ACTIONS = 2


@dataclass
class Note:
    kind: str
    title: str
    body: str
    url: str
    task_id: Any = None
    thread_id: Any = None
    seq: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    # the labels a notification may answer its question with, as buttons (a single single-select question's
    # first options; none for anything else, whose answer needs the page)
    choices: tuple[str, ...] = ()
    # a card that holds up work until someone answers (a tool call's gate, a worker's approval, an escalation):
    # what quiet hours may still let through
    gate: bool = False

    @property
    def question_id(self) -> Any:
        return self.detail.get("question_id")

    def payload(self, token: str | None = None) -> str:
        """What the service worker shows (static/sw.js); with `token`, the question's answers as actions that
        the token lets it send (action "0", "1": the whole label at that index in `choices`; "reply": open the
        card)."""
        shown: dict[str, Any] = {"title": self.title, "body": self.body, "url": self.url,
                                 # one notification a question (a second one of the task does not replace it)
                                 "tag": f"{self.kind}-{self.question_id or self.task_id or self.thread_id or 'all'}"}
        if token is not None and self.choices:
            shown["actions"] = [{"action": str(i), "title": line(c, 40)} for i, c in enumerate(self.choices)] + \
                [{"action": "reply", "title": "Reply"}]
            shown.update(token=token, question_id=str(self.question_id), choices=list(self.choices))
        return json.dumps(shown)


# what is not waiting on the user (a finished turn, a routine's run): folded into the next digest
LATER = ("turn_finished", "routine_")


def later(note: Note) -> bool:
    return note.kind.startswith(LATER)


def line(text: Any, n: int = LINE_CHARS) -> str:
    first = str(text or "").strip().split("\n")[0]
    return first if len(first) <= n else first[: n - 1] + "…"


def note_for(row: Candidate) -> Note | None:
    """The notification a journal record calls for, or None (most records call for none)."""
    p = row.payload or {}
    if row.event_type == "question.asked":
        return _question_note(row, p)
    if row.event_type == "task.stalled":
        return Note("stalled", f"A {row.role or 'task'} stalled",
                    line(f"Silent for {round(p.get('silent_s', 0))} s: {line(row.brief, 80)}"),
                    f"/#task/{row.task_id}", row.task_id, row.task_session, row.seq)
    if row.event_type == "executor.lost":
        crashed = len(p.get("crashed_tasks") or [])
        return Note("executor_lost", f"Executor {line(p.get('name'), 60)} lost",
                    line(f"Its lease expired; {crashed} running task(s) crashed and go through the policy "
                          f"(taken over by {p.get('taken_over_by')})."),
                    "/#context", None, None, row.seq, {"executor": p.get("name")})
    if row.event_type == "routine.run_ended":
        return _routine_note(row, p)
    if row.event_type == "task.exited" and row.role == "orchestrator":
        result = (p.get("result") or {})
        status = p.get("status")
        body = "The orchestrator replied." if status == "success" else f"The turn ended {status}."
        return Note("turn_finished", "Reply ready" if status == "success" else "Turn ended", body,
                    f"/#chat/{row.task_session}", row.task_id, row.task_session, row.seq,
                    {"status": status, "subtype": result.get("subtype")})
    return None


def _question_note(row: Candidate, p: dict[str, Any]) -> Note:
    """A question waiting for the user: Claude's, a worker's approval, a tool call's gate card, an escalation."""
    questions = p.get("questions") or [{}]
    by_harness = p.get("asked_by") == "harness"
    escalation = str(p.get("tool_use_id", "")).startswith("escalation-")
    kind = "escalation" if escalation else "question"
    gate = str(p.get("tool_use_id", "")).startswith("gate-")  # a permission_prompt approval card
    budget = str(p.get("tool_use_id", "")).startswith("budget-")  # a run at its USD cap (settle/budgets.py)
    title = ("A worker's end needs your decision" if escalation else "Approve a tool call?" if gate
             else "A run reached its budget" if budget else "Approve a worker?" if by_harness else "Claude asks")
    qid = p.get("question_id")
    return Note(kind, title, line(questions[0].get("question")), f"/#asks/{qid}" if qid else "/#asks",
                row.task_id, row.session_id, row.seq, {"question_id": qid}, choices(questions, allow_or_deny=gate),
                gate=escalation or gate or by_harness)


def choices(questions: list[Any], *, allow_or_deny: bool = False) -> tuple[str, ...]:
    """The labels a notification's buttons may answer with: one single-select question's first options (a tool
    call's gate card: its first and its last, allow once or deny)."""
    if len(questions) != 1 or not isinstance(questions[0], dict) or questions[0].get("multiSelect"):
        return ()
    raw = [o.get("label") for o in questions[0].get("options") or [] if isinstance(o, dict)]
    labels = [label for label in raw if isinstance(label, str) and label]
    if allow_or_deny and len(labels) > MAX_OPTION_ACTIONS:
        return (labels[0], labels[-1])
    return tuple(labels[:MAX_OPTION_ACTIONS])


def _routine_note(row: Candidate, p: dict[str, Any]) -> Note | None:
    """A routine's run ended (or could not start for its budget or a template error): what came of it, and
    the tool calls the gate denied, by name."""
    status, reason = p.get("status"), p.get("reason")
    if status == "skipped" and not str(reason or "").startswith("budget"):
        return None  # an overlap skip is the policy doing its job, every instant
    denials = p.get("gate_denials") or []
    body = {"succeeded": "The run succeeded.", "gated": "The gate denied: "}.get(str(status), f"The run {status}.")
    if denials:
        body += "; ".join(str(d.get("summary") or d.get("tool")) for d in denials)
    elif reason:
        body = f"{body} {reason}"
    cost = p.get("cost_usd")
    if cost:
        body += f" ({cost:.2f} USD)"
    thread = p.get("thread_id")
    return Note(f"routine_{status}", f"Routine {line(p.get('name'), 60)}: {status}", line(body),
                f"/#chat/{thread}" if thread else "/#routines", row.task_id, row.session_id, row.seq,
                {"routine_id": p.get("routine_id"), "run_id": p.get("run_id"), "status": status,
                 "gate_denials": [d.get("summary") for d in denials]})
