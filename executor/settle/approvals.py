"""Decisions the user owes, kept as state rather than as a tool call waiting: dispatch approvals and late
answers.

A dispatch in an interactive thread records the worker (pending), its approval question and an
`approvals` row in one transaction, and the tool returns at once. The supervisor does not claim a worker
whose approval is open. When the question is answered — minutes or days later, also while the executor
is down — the settler carries the decision out exactly once: the worker is released (approved) or
cancelled (anything else), and the orchestrator is told with a note in its thread's chat.

An ask_user_question that timed out in a thread stays answerable; its answer, when it comes, is sent to
the thread as such a note (once: `late_answers`).

The steps take the settler's unit of work (shared/work.py): rows through the stores, records emitted into the
unit, committed together.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor import asks
from executor.asks.store import AskStore
from executor.settle import briefs, dispatch
from executor.settle.store import AnsweredApproval, LateAnswer, SettleStore
from shared import logs, receipts
from shared.models import NewEvent
from shared.work import Work

log = logs.get(__name__)

# the tool's answer to the model: "a harness message" is the model's name for a note in its chat
AWAITING = ("awaiting the user's approval; you will be told with a harness message when they answer. "
            "Nothing runs until then: end your turn, or carry on with something else.")
MAX_BRIEF_CHARS = 600
NOT_THE_USERS = "an answer that did not come from the user (ignored)"
MISMATCH = ("the approval was for a different worker (its brief, project, tools or directory changed after the card "
            "was asked: the approved hash is not this worker's)")


async def request(pool: AsyncConnectionPool, *, brief: str, thread_id: uuid.UUID, asker_task_id: uuid.UUID,
                  project_id: uuid.UUID | None, plan_ref: str | None, allowed_tools: list[str] | None,
                  workdir: Path | None = None, requested_by: str | None = None,
                  tool_use_id: str | None = None, attachment_ids: tuple[uuid.UUID, ...] = ()) -> uuid.UUID:
    """Record a worker that waits for the user's approval, with its question, in a unit of work of its own;
    returns its task id.

    Raises:
        DispatchRefused: as dispatch.request_task (nothing is recorded).
    """
    async with SettleStore.over(pool).work() as (_, unit):
        return await request_on(unit, dispatch.TaskRequest(
            "worker", brief, project_id=project_id, project_workdir=True, plan_ref=plan_ref,
            allowed_tools=tuple(allowed_tools) if allowed_tools is not None else None,
            parent_task_id=asker_task_id, workdir=workdir, requested_by=requested_by, tool_use_id=tool_use_id,
            attachment_ids=attachment_ids), thread_id=thread_id)


async def request_on(unit: Work, asked: dispatch.TaskRequest, *, thread_id: uuid.UUID) -> uuid.UUID:
    """`request_task` for a worker that waits for the user's approval in `thread_id`, in `unit`: its task
    (pending, awaiting approval), its approval question and `approvals` row; returns its task id."""
    task_id = await dispatch.request_task(unit, asked)
    store = SettleStore(unit)
    spec = await store.await_approval(task_id)
    question = receipts.mark(briefs.approval_question(asked.brief), "worker", spec.sha256())
    posted = await asks.post(unit, [question], tool_use_id=f"approval-{task_id}",
                             task_id=task_id, session_id=thread_id, approval_for=str(task_id))
    assert posted is not None  # a new task's id: never asked before
    await store.insert_approval(task_id, thread_id, posted.id)
    unit.emit(posted.event)
    return task_id


async def act_on_answer(unit: Work, row: AnsweredApproval) -> None:
    """Carry out an answered approval in `unit` (claimed by the settler): the worker released (approved) or
    cancelled, the orchestrator told, the approval resolved and `approval.resolved` journaled."""
    store = SettleStore(unit)
    task_id, thread = row.task_id, row.thread_id
    # only the user's answer approves: one closed without the ingress's mark (answered_by) rejects
    users = asks.honoured(row.question_status, row.answered_by)
    choice = asks.first_choice(row.answers) if users else None
    said = (choice or row.response or "nothing (dismissed)") if users else NOT_THE_USERS
    brief = row.brief[:MAX_BRIEF_CHARS]
    facts: dict[str, Any] = {"approval_id": str(row.id), "question_id": str(row.question_id),
                             "answer": choice, "response": row.response, "answered_by": row.answered_by}
    if not users:
        facts["refused_answer"] = "no answering identity: not written by the ingress"
        log.warning("answer_not_honoured", question_id=str(row.question_id), task_id=str(task_id))
    events: list[NewEvent] = []
    if row.task_status != "pending":
        # stopped meanwhile (Stop the plan, the Tasks view's Stop): nothing to start, nothing to ask
        decision, text = "task_ended", None
        if row.question_status == "pending":
            await AskStore(unit).close(row.question_id, "the worker was stopped before an answer")
            events.append(NewEvent("question.cancelled", {"question_id": str(row.question_id),
                                                          "reason": "the worker was stopped"},
                                   task_id=task_id, session_id=thread))
    elif choice == briefs.APPROVE and not await _receipt(unit, row, choice):
        # the card approved a different worker than the one that would start: it never runs
        decision = "refused_mismatch"
        await store.cancel_unapproved(task_id)
        events.append(NewEvent("task.dispatch_refused", {"brief": brief, "reason": MISMATCH, "answer": said},
                               task_id=task_id, session_id=thread, project_id=row.project_id))
        text = f"[harness] Worker {task_id} was not started: {MISMATCH}.\nIts brief: {brief}"
    elif choice == briefs.APPROVE:
        decision = "approved"
        await store.release_approved(task_id)
        text = (f"[harness] The user approved worker {task_id}; it is starting now and its handoff comes back "
                f"to you when it finishes.\nIts brief: {brief}")
    else:
        # Reject, a typed answer or a dismissal: the worker never runs
        decision = "rejected"
        await store.cancel_unapproved(task_id)
        events.append(NewEvent("task.dispatch_refused", {"brief": brief, "reason": "not approved by the user",
                                                         "answer": said}, task_id=task_id, session_id=thread,
                               project_id=row.project_id))
        text = (f"[harness] The user did not approve worker {task_id} (they answered {said!r}); nothing was "
                f"started.\nIts brief: {brief}")
    if text is not None and thread is not None:
        await store.tell_orchestrator(thread, text)
    facts["decision"] = decision
    await store.resolve_approval(row.id, decision)
    unit.emit(NewEvent("approval.resolved", facts, tier="derived", task_id=task_id, session_id=thread,
                       project_id=row.project_id), *events)
    log.info("approval_resolved", task_id=str(task_id), decision=decision)


async def _receipt(unit: Work, row: AnsweredApproval, choice: str) -> bool:
    """The approval's receipt: the hash its card was asked with against the worker as it would start;
    recorded either way, a mismatch journaled. True when the worker may start."""
    receipt = asks.Receipt("dispatch", row.question_id, row.task_id, row.thread_id, row.brief[:200], choice,
                           row.answered_by, row.approved_sha256, row.checked_sha256())
    receipt_id = await AskStore(unit).insert_receipt(receipt)
    if not receipt.matched:
        log.warning("approval_mismatch", question_id=str(row.question_id), task_id=str(row.task_id))
        unit.emit(NewEvent("approval.mismatch", {
            "receipt_id": str(receipt_id), "kind": "dispatch", "question_id": str(row.question_id),
            "summary": receipt.subject, "approved_sha256": receipt.approved_sha256,
            "checked_sha256": receipt.checked_sha256, "answered_by": row.answered_by}, tier="derived",
            task_id=row.task_id, session_id=row.thread_id, project_id=row.project_id))
    return receipt.matched


async def apply_answered(pool: AsyncConnectionPool) -> int:
    """Carry out one batch of answered approvals, each once (claimed, acted on and resolved in one unit of
    work); returns how many were acted on (the settler's loop asks again while there are)."""
    async with SettleStore.over(pool).work() as (store, unit):
        rows = await store.answered_approvals()
        for row in rows:
            await act_on_answer(unit, row)
    return len(rows)


def late_answer_text(row: LateAnswer) -> str:
    """The note that carries to the thread an answer given after its question had timed out."""
    who = "your" if row.asked_by_role == "orchestrator" else f"worker {row.task_id}'s"
    lines = [f"[harness] A late answer: the user answered {who} question after ask_user_question had stopped "
             "waiting (it timed out, or the process was ended while it waited; the tool had returned no answer)."]
    answers = row.answers or {}
    for q in row.questions or []:
        text = q.get("question") if isinstance(q, dict) else None
        if text in answers:
            value = answers[text]
            lines.append(f"- {text} → {json.dumps(value, ensure_ascii=False) if isinstance(value, list) else value}")
    if row.response:
        lines.append(f"Their reply: {row.response}")
    return "\n".join(lines)


async def deliver_late_answer(unit: Work, row: LateAnswer) -> None:
    """Send an answer to a timed-out question to its thread in `unit` (once: recorded in `late_answers`)."""
    store = SettleStore(unit)
    chat_id = await store.tell_orchestrator(row.thread_id, late_answer_text(row)) \
        if row.thread_id is not None else None
    await store.record_late_answer(row.id, chat_id)
    unit.emit(NewEvent("question.answered", {
        "question_id": str(row.id), "answers": row.answers or {}, "response": row.response,
        "late": True, "delivered_as": str(chat_id) if chat_id else None},
        task_id=row.task_id, session_id=row.thread_id))


async def deliver_late_answers(pool: AsyncConnectionPool) -> int:
    """Send one batch of answers to timed-out questions to their threads, each once (claimed, sent and
    recorded in one unit of work); returns how many were sent (the settler's loop asks again while there are)."""
    async with SettleStore.over(pool).work() as (store, unit):
        rows = await store.undelivered_late_answers()
        for row in rows:
            await deliver_late_answer(unit, row)
    return len(rows)
