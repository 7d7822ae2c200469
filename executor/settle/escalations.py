"""Escalations and the policy carried out: what becomes of a thread's finished worker or failed turn, and of
the user's answer to an escalation.

Every step here takes the settler's unit of work (`Work`, shared/work.py; executor/settle/settler.py): its
rows go through the stores and its journal records are emitted into the unit, so they commit with the
task's settled marker (or the escalation's resolution), exactly once, also across a crash.

A clean end is reported to the orchestrator that dispatched the worker (a note in its thread's chat: its
next turn). A non-clean end follows executor/settle/policy.py: a retry is a new task linked to the attempt
it repeats (a back-off retry waits for its `not_before`); an escalation is a question the harness itself
asks in the Asks panel, plus an `escalations` row that says a decision is owed — acted on exactly once by
the settler when the answer lands, even across an executor restart; a skip tells the orchestrator and goes
on.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from executor import asks
from executor.asks.store import AskStore
from executor.settle import briefs, budgets, dispatch, extraction, policy
from executor.settle.store import AnsweredEscalation, SettledWorker, SettleStore
from shared import logs
from shared.models import NewEvent
from shared.work import Work

log = logs.get(__name__)

MAX_REPORT_CHARS = 8_000
MAX_PREVIEW_CHARS = 4_000
ESCALATION_HEADER = "Worker ended"
TURN_HEADER = "Turn failed"


def _summary(payload: dict[str, Any]) -> str:
    shown = {k: v for k, v in payload.items() if k not in ("raw_seq_range", "contract")}
    return json.dumps(shown, indent=2, default=str)[:MAX_REPORT_CHARS]


def escalation_question(worker: SettledWorker, decision: policy.Decision, summary: str) -> dict[str, Any]:
    """The question an escalated worker's end puts in the Asks panel (pure): what it was asked and what came
    back, and the answers the settler acts on (a failed extraction offers re-extracting before a re-run)."""
    again = " again" if worker.attempt > 1 else ""
    preview = (f"**Brief**\n\n{worker.brief[:MAX_PREVIEW_CHARS // 2]}\n\n**What came back**\n\n"
               f"```json\n{summary[:MAX_PREVIEW_CHARS // 2]}\n```")
    retry = {"label": policy.ESCALATION_RETRY, "description": "run the same brief once more", "preview": preview}
    first: list[dict[str, Any]] = [retry]
    if worker.status == "extraction_failed":
        # the worker's run stands; running it again would repeat its side effects, re-extracting does not
        first = [{"label": policy.ESCALATION_REEXTRACT, "preview": preview,
                  "description": "run only the extractor again on the worker's journal (the worker does not run)"},
                 {"label": policy.ESCALATION_RETRY_WORKER,
                  "description": "run the worker again with the same brief (repeats its side effects)"}]
    return {
        "question": f"A worker ended {worker.status}{again} (attempt {worker.attempt}; {decision.why}). "
                    "What should the harness do?",
        "header": ESCALATION_HEADER,
        "multiSelect": False,
        "options": [
            *first,
            {"label": policy.ESCALATION_SKIP, "description": "drop this piece; the orchestrator carries on"},
            {"label": policy.ESCALATION_STOP,
             "description": "stop this thread's workers and tell the orchestrator to stop"},
        ],
    }


def turn_question(turn: SettledWorker, decision: policy.Decision) -> dict[str, Any]:
    """The question an escalated failed turn puts in the Asks panel (pure): run its messages again, or not."""
    again = " again" if turn.attempt > 1 else ""
    return {
        "question": f"The orchestrator's turn ended {turn.status}{again} ({turn.status_reason}; "
                    f"{decision.why}). Run it again with the same messages?",
        "header": TURN_HEADER,
        "multiSelect": False,
        "options": [
            {"label": policy.ESCALATION_RETRY, "description": "run the turn again with the same messages",
             "preview": f"**The messages**\n\n{turn.brief[:MAX_PREVIEW_CHARS]}"},
            {"label": policy.ESCALATION_SKIP,
             "description": "leave it: the messages stay in the chat with the error, and Retry stays there"},
        ],
    }


def _emit_before(unit: Work, mark: int, event: NewEvent) -> None:
    """Journal `event` before what was emitted into `unit` since `mark`: a decision's record goes before the
    records of the work it started (its re-run's request), as the journal has always ordered them."""
    unit.events.insert(mark, event)


async def rerun_turn(unit: Work, turn_id: uuid.UUID, *, requested_by: str, reason: str | None,
                     delay_s: float = 0.0) -> uuid.UUID | None:
    """Run a thread's turn again with the same messages (its brief), in `unit`; None when another run already
    repeats it (a turn is re-run at most once)."""
    again = await dispatch.retry_request(unit, turn_id, requested_by=requested_by, delay_s=delay_s,
                                         record={"rerun_of": str(turn_id), "reason": reason})
    try:
        return await dispatch.request_task(unit, again)
    except dispatch.AlreadyRepeated:
        return None


async def apply_turn_policy(unit: Work, turn_id: uuid.UUID, *, backoff_base_s: float, started: bool = True) -> None:
    """A thread's turn ended other than `success`: record it in the conversation (`turn.failed`: status,
    reason, the messages it carried, what is done) and act per the turns' policy — re-run it, back off,
    escalate, or leave it to the user's Retry. Its messages are never dropped: they run again, or stay in the
    chat with the error."""
    turn = await SettleStore(unit).settled_worker(turn_id)
    assert turn is not None
    thread = turn.session_id
    decision = policy.decide(turn.status, turn.attempt, backoff_base_s, started=started, role="orchestrator")
    facts: dict[str, Any] = {
        "status": turn.status, "reason": turn.status_reason, "attempt": turn.attempt,
        "action": decision.action, "budget": decision.budget, "why": decision.why,
        "first_attempt": str(turn.first_attempt), "messages": turn.brief[:MAX_REPORT_CHARS]}
    mark = len(unit.events)
    if decision.action in policy.RETRIES:
        new_id = await rerun_turn(unit, turn_id, requested_by="policy", reason=turn.status_reason,
                                  delay_s=decision.delay_s)
        facts.update(rerun_task_id=str(new_id) if new_id else None, delay_s=decision.delay_s)
    elif decision.action == policy.ESCALATE:
        facts["question_id"] = str(await _ask(unit, turn_id, thread, None, turn_question(turn, decision)))
    if decision.action not in policy.RETRIES:
        # the harness will not run it again by itself: the chat's record offers the user's Retry
        facts["retry"] = {"method": "POST", "path": f"/api/threads/{thread}/retry", "body": {"task_id": str(turn_id)}}
    log.info("turn_failed", turn=str(turn_id), status=turn.status, action=decision.action)
    _emit_before(unit, mark, NewEvent("turn.failed", facts, tier="derived", task_id=turn_id, session_id=thread))


async def retry_turn(unit: Work, turn_id: uuid.UUID, thread_id: uuid.UUID, *, requested_by: str) -> str | None:
    """The user's Retry of a failed turn (a thread-control row), in `unit`; an error, or None. An escalation
    still open on the turn is answered by it."""
    store = SettleStore(unit)
    turn = await store.settled_worker(turn_id)
    if turn is None or turn.session_id != thread_id or turn.role != "orchestrator":
        return f"no turn {turn_id} in thread {thread_id}"
    if turn.status in ("pending", "running", "success"):
        return f"turn {turn_id} is {turn.status}: only a failed turn is retried"
    new_id = await rerun_turn(unit, turn_id, requested_by=requested_by, reason="retried by the user")
    if new_id is None:
        return f"turn {turn_id} was already run again"
    for esc in await store.resolve_task_escalations(turn_id, "retry"):
        await AskStore(unit).close(esc.question_id, "retried from the chat")
        unit.emit(NewEvent("escalation.resolved", {
            "escalation_id": str(esc.id), "question_id": str(esc.question_id), "answer": None,
            "response": "retried from the chat", "decision": "retry", "retry_task_id": str(new_id)},
            tier="derived", task_id=turn_id, session_id=thread_id))
    return None


async def apply_policy(unit: Work, worker_id: uuid.UUID, record_type: str, payload: dict[str, Any], *,
                       backoff_base_s: float, started: bool = True) -> None:
    """Act on a thread's worker's end in `unit`.

    `record_type` is what the end left: handoff, handoff.extraction_failed or task.exited. A worker
    outside a thread's loop gets nothing: its end stays visible and nobody acts on it.
    """
    store = SettleStore(unit)
    worker = await store.settled_worker(worker_id)
    if worker is None or worker.thread_id is None:
        return
    summary = _summary(payload)
    if not worker.follows_policy:
        decision = policy.Decision(worker.status, policy.REPORT, worker.attempt, why="role has no policy")
    else:
        decision = policy.decide(worker.status, worker.attempt, backoff_base_s, started=started)
    facts = {"status": decision.status, "action": decision.action, "attempt": decision.attempt,
             "budget": decision.budget, "why": decision.why, "record": record_type}
    ids: dict[str, Any] = {"task_id": worker_id, "session_id": worker.thread_id, "project_id": worker.project_id}
    mark = len(unit.events)
    if decision.action in policy.RETRIES:
        brief = worker.brief
        if decision.action == policy.RETRY_MODIFIED:
            brief = (f"{brief}\n\n## The previous attempt\nIt ended {worker.status} "
                     f"({worker.status_reason}). What came back from it:\n{summary}\n"
                     "Take this into account and do not repeat what failed.")
        brief = f"{brief}\n\n{await briefs.earlier_attempt(store, worker)}"
        new_id = await dispatch.request_task(unit, await dispatch.retry_request(
            unit, worker_id, requested_by="policy", brief=brief, delay_s=decision.delay_s))
        facts.update(retry_task_id=str(new_id), delay_s=decision.delay_s)
    elif decision.action == policy.ESCALATE:
        question = escalation_question(worker, decision, summary)
        facts["question_id"] = str(await _ask(unit, worker.id, worker.thread_id, worker.project_id, question))
    else:
        await store.tell_orchestrator(worker.thread_id, _report_text(worker_id, record_type, worker.status,
                                                                     decision, summary))
    log.info("policy_decision", worker=str(worker_id), **{k: v for k, v in facts.items() if k != "why"})
    _emit_before(unit, mark, NewEvent("policy.decision", facts, tier="derived", **ids))


def _report_text(worker_id: uuid.UUID, record_type: str, status: str, decision: policy.Decision,
                 summary: str) -> str:
    what = {"handoff": "Its handoff", "handoff.extraction_failed": "Its handoff failed extraction"}.get(
        record_type, "It left no output to extract")
    if decision.action == policy.REPORT:
        return f"[harness] Worker {worker_id} finished. {what}:\n{summary}"
    return (f"[harness] Worker {worker_id} ended {status}; the harness skipped it ({decision.why}). "
            f"{what}:\n{summary}")


async def _ask(unit: Work, task_id: uuid.UUID, thread_id: uuid.UUID | None, project_id: uuid.UUID | None,
               question: dict[str, Any]) -> uuid.UUID:
    """The escalation's question, through the harness's ask service, and its `escalations` row; its
    `question.asked` record is emitted into `unit`. The question's id."""
    posted = await asks.post(unit, [question], tool_use_id=f"escalation-{uuid.uuid4()}", task_id=task_id,
                             session_id=thread_id, project_id=project_id)
    assert posted is not None  # a fresh tool_use_id
    await SettleStore(unit).insert_escalation(task_id, thread_id, posted.id)
    unit.emit(posted.event)
    return posted.id


# ---- the user answered an escalation ---------------------------------------------------------------------

async def act_on_answer(unit: Work, esc: AnsweredEscalation) -> None:
    """Carry out an answered escalation in `unit` (claimed by the settler): re-extract, retry, stop the plan,
    or tell the orchestrator the user's answer; the escalation resolved and `escalation.resolved` journaled."""
    if esc.kind == "budget":
        await budgets.act_on_answer(unit, esc)
        return
    store = SettleStore(unit)
    worker = await store.settled_worker(esc.task_id)
    assert worker is not None
    choice = asks.first_choice(esc.answers)
    facts: dict[str, Any] = {"escalation_id": str(esc.id), "question_id": str(esc.question_id),
                             "answer": choice, "response": esc.response}
    mark = len(unit.events)
    if worker.role == "orchestrator":
        decision = await _act_on_turn(store, worker, choice, facts)
    elif choice == policy.ESCALATION_REEXTRACT:
        # only the extractor runs again, on the journal the worker left; its validation settles the rest
        decision = "reextract"
        facts["extractor_task_id"] = str(await extraction.request_on(unit, worker.id,
                                                                     requested_by="user (escalation)"))
    elif choice in (policy.ESCALATION_RETRY, policy.ESCALATION_RETRY_WORKER):
        decision = "retry"
        facts["retry_task_id"] = str(await dispatch.request_task(unit, await dispatch.retry_request(
            unit, worker.id, requested_by="user (escalation)")))
    elif choice == policy.ESCALATION_STOP:
        decision = "stop_plan"
        await _stop_plan(store, esc.thread_id, worker, facts)
    else:
        # Skip, a typed answer, a dismissal: the piece is dropped and the orchestrator hears why
        decision = "skip" if choice == policy.ESCALATION_SKIP else "relay"
        said = choice or esc.response or "nothing"
        await store.tell_orchestrator(esc.thread_id, (
            f"[harness] Worker {worker.id} ended {worker.status}. Asked what to do, the user answered: "
            f"{said!r}. The harness did not retry it; carry on accordingly."))
    facts["decision"] = decision
    await store.resolve_escalation(esc.id, decision)
    _emit_before(unit, mark, NewEvent("escalation.resolved", facts, tier="derived", task_id=worker.id,
                                      session_id=esc.thread_id, project_id=worker.project_id))
    log.info("escalation_resolved", worker=str(worker.id), decision=decision)


async def _stop_plan(store: SettleStore, thread: uuid.UUID, worker: SettledWorker, facts: dict[str, Any]) -> None:
    cancelled = [str(i) for i in await store.cancel_thread_pending_workers(thread)]
    stopped = [str(i) for i in await store.stop_thread_running_workers(thread)]
    facts.update(cancelled_tasks=cancelled, stop_requested=stopped)
    await store.tell_orchestrator(thread, (
        f"[harness] Worker {worker.id} ended {worker.status}, and the user chose to stop the plan. "
        f"Pending workers were cancelled ({len(cancelled)}) and running ones asked to stop ({len(stopped)}). "
        "Do not dispatch more work unless the user asks; tell them where things stand."))


async def _act_on_turn(store: SettleStore, turn: SettledWorker, choice: Any, facts: dict[str, Any]) -> str:
    """A failed turn's escalation: Retry runs its messages again (queued like the chat's Retry, so it waits
    for any turn the thread has open meanwhile); anything else leaves them in the chat with the error and its
    Retry. The orchestrator is not told: it never saw these messages."""
    if choice != policy.ESCALATION_RETRY:
        return "skip" if choice == policy.ESCALATION_SKIP else "relay"
    assert turn.session_id is not None  # a turn speaks in its thread
    facts["retry_queued"] = str(await store.enqueue_turn_retry(turn.session_id, turn.id))
    return "retry"
