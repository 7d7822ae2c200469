"""Decisions the user owes, kept as state rather than as a tool call waiting: dispatch approvals and late
answers.

A dispatch in an interactive thread records the worker (pending), its approval question and an
`approvals` row in one transaction, and the tool returns at once. The supervisor does not claim a worker
whose approval is open. When the question is answered — minutes or days later, also while the executor
is down — the settler carries the decision out exactly once: the worker is released (approved) or
cancelled (anything else), and the orchestrator is told with a harness message.

An ask_user_question that timed out in a thread stays answerable; its answer, when it comes, is sent to
the thread as a harness message (once: `late_answers`).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor import asks
from executor.settle import briefs, dispatch
from executor.sql import queries
from shared import journal, logs
from shared.models import NewEvent
from shared.query import Queries, Transaction
from shared.work import work

log = logs.get(__name__)

AWAITING = ("awaiting the user's approval; you will be told with a harness message when they answer. "
            "Nothing runs until then: end your turn, or carry on with something else.")
MAX_BRIEF_CHARS = 600
NOT_THE_USERS = "an answer that did not come from the user (ignored)"


async def request(pool: AsyncConnectionPool, *, brief: str, thread_id: uuid.UUID, asker_task_id: uuid.UUID,
                  project_id: uuid.UUID | None, plan_ref: str | None, allowed_tools: list[str] | None,
                  workdir: Path | None = None, requested_by: str | None = None,
                  tool_use_id: str | None = None, attachment_ids: tuple[uuid.UUID, ...] = ()) -> uuid.UUID:
    """Record a worker that waits for the user's approval, with its question; returns its task id.

    Raises:
        DispatchRefused: as dispatch.request_task (nothing is recorded).
    """
    question = briefs.approval_question(brief)
    async with work(Queries(pool, queries)) as tx:
        task_id = await dispatch.request_task(tx, dispatch.TaskRequest(
            "worker", brief, project_id=project_id, project_workdir=True, plan_ref=plan_ref,
            allowed_tools=tuple(allowed_tools) if allowed_tools is not None else None,
            parent_task_id=asker_task_id, workdir=workdir, requested_by=requested_by, tool_use_id=tool_use_id,
            attachment_ids=attachment_ids))
        await tx.execute("await_approval", {"id": task_id})
        posted = await asks.post(tx, [question], tool_use_id=f"approval-{task_id}", task_id=task_id,
                                 session_id=thread_id, approval_for=str(task_id))
        assert posted is not None  # a new task's id: never asked before
        await tx.execute("insert_approval", {"task_id": task_id, "thread_id": thread_id, "question_id": posted.id})
        tx.emit(posted.event)
    return task_id


def _choice(answers: dict[str, Any] | None) -> Any:
    values = list((answers or {}).values())
    choice = values[0] if values else None
    return (choice[0] if choice else None) if isinstance(choice, list) else choice


async def apply_answered(pool: AsyncConnectionPool) -> int:
    """Carry out one batch of answered approvals, each once (claimed, acted on and resolved in one
    transaction); returns how many were acted on (the settler's loop asks again while there are)."""
    async with Queries(pool, queries).transaction() as tx:
        rows = await tx.all("list_answered_approvals")
        for row in rows:
            await _act(tx, row)
    return len(rows)


async def _act(tx: Transaction, row: dict[str, Any]) -> None:
    task_id, thread = row["task_id"], row["thread_id"]
    # only the user's answer approves: one closed without the ingress's mark (answered_by) rejects
    users = asks.honoured({"status": row["question_status"], "answered_by": row["answered_by"]})
    choice = _choice(row["answers"]) if users else None
    said = (choice or row["response"] or "nothing (dismissed)") if users else NOT_THE_USERS
    brief = row["brief"][:MAX_BRIEF_CHARS]
    facts: dict[str, Any] = {"approval_id": str(row["id"]), "question_id": str(row["question_id"]),
                             "answer": choice, "response": row["response"], "answered_by": row["answered_by"]}
    if not users:
        facts["refused_answer"] = "no answering identity: not written by the ingress"
        log.warning("answer_not_honoured", question_id=str(row["question_id"]), task_id=str(task_id))
    events: list[NewEvent] = []
    if row["task_status"] != "pending":
        # stopped meanwhile (Stop the plan, the Tasks view's Stop): nothing to start, nothing to ask
        decision, text = "task_ended", None
        if row["question_status"] == "pending":
            await tx.execute("close_question", {"id": row["question_id"],
                                                "response": "the worker was stopped before an answer"})
            events.append(NewEvent("question.cancelled", {"question_id": str(row["question_id"]),
                                                          "reason": "the worker was stopped"},
                                   task_id=task_id, session_id=thread))
    elif choice == briefs.APPROVE:
        decision = "approved"
        await tx.execute("release_approved_task", {"id": task_id})
        text = (f"[harness] The user approved worker {task_id}; it is starting now and its handoff comes back "
                f"to you when it finishes.\nIts brief: {brief}")
    else:
        # Reject, a typed answer or a dismissal: the worker never runs
        decision = "rejected"
        await tx.execute("cancel_unapproved_task", {"id": task_id})
        events.append(NewEvent("task.dispatch_refused", {"brief": brief, "reason": "not approved by the user",
                                                         "answer": said}, task_id=task_id, session_id=thread,
                               project_id=row["project_id"]))
        text = (f"[harness] The user did not approve worker {task_id} (they answered {said!r}); nothing was "
                f"started.\nIts brief: {brief}")
    if text is not None and thread is not None:
        await tx.one("enqueue_harness_message", {"thread_id": thread, "text": text})
    facts["decision"] = decision
    await tx.execute("resolve_approval", {"id": row["id"], "decision": decision})
    await journal.append_on(tx.conn, [NewEvent("approval.resolved", facts, tier="derived", task_id=task_id,
                                            session_id=thread, project_id=row["project_id"]), *events])
    log.info("approval_resolved", task_id=str(task_id), decision=decision)


def late_answer_text(row: dict[str, Any]) -> str:
    """The harness message that carries an answer given after its question had timed out."""
    who = "your" if row["asked_by_role"] == "orchestrator" else f"worker {row['task_id']}'s"
    lines = [f"[harness] A late answer: the user answered {who} question after ask_user_question had stopped "
             "waiting (it timed out, or the process was ended while it waited; the tool had returned no answer)."]
    answers = row["answers"] or {}
    for q in row["questions"] or []:
        text = q.get("question") if isinstance(q, dict) else None
        if text in answers:
            value = answers[text]
            lines.append(f"- {text} → {json.dumps(value, ensure_ascii=False) if isinstance(value, list) else value}")
    if row["response"]:
        lines.append(f"Their reply: {row['response']}")
    return "\n".join(lines)


async def deliver_late_answers(pool: AsyncConnectionPool) -> int:
    """Send one batch of answers to timed-out questions to their threads, each once (claimed, sent and
    recorded in one transaction); returns how many were sent (the settler's loop asks again while there are)."""
    async with Queries(pool, queries).transaction() as tx:
        rows = await tx.all("list_undelivered_late_answers")
        for row in rows:
            chat_id = None
            if row["thread_id"] is not None:
                chat = await tx.one("enqueue_harness_message",
                                    {"thread_id": row["thread_id"], "text": late_answer_text(row)})
                chat_id = chat["id"] if chat else None
            await tx.one("record_late_answer", {"question_id": row["id"], "chat_id": chat_id})
            await journal.append_on(tx.conn, [NewEvent("question.answered", {
                "question_id": str(row["id"]), "answers": row["answers"] or {}, "response": row["response"],
                "late": True, "delivered_as": str(chat_id) if chat_id else None},
                task_id=row["task_id"], session_id=row["thread_id"])])
    return len(rows)
