"""What becomes of a thread's finished worker: the policy's decision, carried out and journaled.

`apply_policy` runs inside the settler's transaction (executor/settle/settler.py): its rows, its events and
the task's settled marker commit together, so an end is acted on exactly once, also across a crash.

A clean end is reported to the orchestrator that dispatched the worker (a harness message: its next
turn). A non-clean end follows executor/settle/policy.py: a retry is a new task linked to the attempt it
repeats (a back-off retry waits for its `not_before`); an escalation is a question the harness itself
asks in the Asks panel, plus an `escalations` row that says a decision is owed — acted on exactly once by
the settler when the answer lands, even across an executor restart; a skip tells the orchestrator and goes
on.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from executor import asks
from executor.settle import briefs, dispatch, extraction, policy
from executor.sql import queries
from shared import journal, logs
from shared.models import NewEvent
from shared.query import Queries, Transaction
from shared.work import Work

log = logs.get(__name__)

MAX_REPORT_CHARS = 8_000
MAX_PREVIEW_CHARS = 4_000
ESCALATION_HEADER = "Worker ended"
TURN_HEADER = "Turn failed"


def _summary(payload: dict[str, Any]) -> str:
    shown = {k: v for k, v in payload.items() if k not in ("raw_seq_range", "contract")}
    return json.dumps(shown, indent=2, default=str)[:MAX_REPORT_CHARS]


def escalation_question(worker: dict[str, Any], decision: policy.Decision, summary: str) -> dict[str, Any]:
    again = " again" if worker["attempt"] > 1 else ""
    preview = (f"**Brief**\n\n{worker['brief'][:MAX_PREVIEW_CHARS // 2]}\n\n**What came back**\n\n"
               f"```json\n{summary[:MAX_PREVIEW_CHARS // 2]}\n```")
    retry = {"label": policy.ESCALATION_RETRY, "description": "run the same brief once more", "preview": preview}
    first: list[dict[str, Any]] = [retry]
    if worker["status"] == "extraction_failed":
        # the worker's run stands; running it again would repeat its side effects, re-extracting does not
        first = [{"label": policy.ESCALATION_REEXTRACT, "preview": preview,
                  "description": "run only the extractor again on the worker's journal (the worker does not run)"},
                 {"label": policy.ESCALATION_RETRY_WORKER,
                  "description": "run the worker again with the same brief (repeats its side effects)"}]
    return {
        "question": f"A worker ended {worker['status']}{again} (attempt {worker['attempt']}; {decision.why}). "
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


def turn_question(turn: dict[str, Any], decision: policy.Decision) -> dict[str, Any]:
    again = " again" if turn["attempt"] > 1 else ""
    return {
        "question": f"The orchestrator's turn ended {turn['status']}{again} ({turn['status_reason']}; "
                    f"{decision.why}). Run it again with the same messages?",
        "header": TURN_HEADER,
        "multiSelect": False,
        "options": [
            {"label": policy.ESCALATION_RETRY, "description": "run the turn again with the same messages",
             "preview": f"**The messages**\n\n{turn['brief'][:MAX_PREVIEW_CHARS]}"},
            {"label": policy.ESCALATION_SKIP,
             "description": "leave it: the messages stay in the chat with the error, and Retry stays there"},
        ],
    }


async def rerun_turn(conn: AsyncConnection[Any], turn_id: uuid.UUID, *, requested_by: str, reason: str | None,
                     delay_s: float = 0.0) -> tuple[uuid.UUID | None, list[NewEvent]]:
    """Run a thread's turn again with the same messages (its brief), inside the caller's transaction;
    (None, []) when another run already repeats it (a turn is re-run at most once)."""
    unit = Work(conn, queries)
    again = await dispatch.retry_request(unit, turn_id, requested_by=requested_by, delay_s=delay_s,
                                         record={"rerun_of": str(turn_id), "reason": reason})
    try:
        new_id = await dispatch.request_task(unit, again)
    except dispatch.AlreadyRepeated:
        return None, []
    return new_id, unit.take()


async def apply_turn_policy(conn: AsyncConnection[Any], turn_id: uuid.UUID, *, backoff_base_s: float,
                            started: bool = True) -> list[NewEvent]:
    """A thread's turn ended other than `success` (inside the settler's transaction): record it in the
    conversation (`turn.failed`: status, reason, the messages it carried, what is done) and act per the
    turns' policy — re-run it, back off, escalate, or leave it to the user's Retry. Its messages are never
    dropped: they run again, or stay in the chat with the error."""
    tx = Transaction(conn, queries)
    turn = await tx.one("get_settled_worker", {"id": turn_id})
    assert turn is not None
    thread = turn["session_id"]
    decision = policy.decide(turn["status"], turn["attempt"], backoff_base_s, started=started, role="orchestrator")
    facts: dict[str, Any] = {
        "status": turn["status"], "reason": turn["status_reason"], "attempt": turn["attempt"],
        "action": decision.action, "budget": decision.budget, "why": decision.why,
        "first_attempt": str(turn["first_attempt"]), "messages": turn["brief"][:MAX_REPORT_CHARS]}
    events: list[NewEvent] = []
    if decision.action in policy.RETRIES:
        new_id, events = await rerun_turn(conn, turn_id, requested_by="policy", reason=turn["status_reason"],
                                          delay_s=decision.delay_s)
        facts.update(rerun_task_id=str(new_id) if new_id else None, delay_s=decision.delay_s)
    elif decision.action == policy.ESCALATE:
        posted = await _ask(tx, {"id": turn_id, "thread_id": thread}, turn_question(turn, decision))
        facts["question_id"] = str(posted.id)
        events = [posted.event]
    if decision.action not in policy.RETRIES:
        # the harness will not run it again by itself: the chat's record offers the user's Retry
        facts["retry"] = {"method": "POST", "path": f"/api/threads/{thread}/retry", "body": {"task_id": str(turn_id)}}
    log.info("turn_failed", turn=str(turn_id), status=turn["status"], action=decision.action)
    return [NewEvent("turn.failed", facts, tier="derived", task_id=turn_id, session_id=thread), *events]


async def retry_turn(conn: AsyncConnection[Any], turn_id: uuid.UUID, thread_id: uuid.UUID, *,
                     requested_by: str) -> tuple[str | None, list[NewEvent]]:
    """The user's Retry of a failed turn (a thread-control row), inside the caller's transaction; returns
    (an error, or None) and the events. An escalation still open on the turn is answered by it."""
    tx = Transaction(conn, queries)
    turn = await tx.one("get_settled_worker", {"id": turn_id})
    if turn is None or turn["session_id"] != thread_id or turn["role"] != "orchestrator":
        return f"no turn {turn_id} in thread {thread_id}", []
    if turn["status"] in ("pending", "running", "success"):
        return f"turn {turn_id} is {turn['status']}: only a failed turn is retried", []
    new_id, events = await rerun_turn(conn, turn_id, requested_by=requested_by, reason="retried by the user")
    if new_id is None:
        return f"turn {turn_id} was already run again", []
    for esc in await tx.all("resolve_task_escalation", {"task_id": turn_id, "decision": "retry"}):
        await tx.execute("close_question", {"id": esc["question_id"], "response": "retried from the chat"})
        events.append(NewEvent("escalation.resolved", {
            "escalation_id": str(esc["id"]), "question_id": str(esc["question_id"]), "answer": None,
            "response": "retried from the chat", "decision": "retry", "retry_task_id": str(new_id)},
            tier="derived", task_id=turn_id, session_id=thread_id))
    return None, events


async def apply_policy(conn: AsyncConnection[Any], worker_id: uuid.UUID, record_type: str,
                       payload: dict[str, Any], *, backoff_base_s: float, started: bool = True) -> list[NewEvent]:
    """Act on a thread's worker's end inside the caller's transaction; returns the events to journal with it.

    `record_type` is what the end left: handoff, handoff.extraction_failed or task.exited. A worker
    outside a thread's loop gets nothing: its end stays visible and nobody acts on it.
    """
    tx = Transaction(conn, queries)
    worker = await tx.one("get_settled_worker", {"id": worker_id})
    if worker is None or worker["thread_id"] is None:
        return []
    summary = _summary(payload)
    if not worker["follows_policy"]:
        decision = policy.Decision(worker["status"], policy.REPORT, worker["attempt"], why="role has no policy")
    else:
        decision = policy.decide(worker["status"], worker["attempt"], backoff_base_s, started=started)
    facts = {"status": decision.status, "action": decision.action, "attempt": decision.attempt,
             "budget": decision.budget, "why": decision.why, "record": record_type}
    ids = {"task_id": worker_id, "session_id": worker["thread_id"], "project_id": worker["project_id"]}
    events: list[NewEvent] = []
    if decision.action in policy.RETRIES:
        brief = worker["brief"]
        if decision.action == policy.RETRY_MODIFIED:
            brief = (f"{brief}\n\n## The previous attempt\nIt ended {worker['status']} "
                     f"({worker['status_reason']}). What came back from it:\n{summary}\n"
                     "Take this into account and do not repeat what failed.")
        brief = f"{brief}\n\n{await briefs.earlier_attempt(conn, worker)}"
        unit = Work(conn, queries)
        new_id = await dispatch.request_task(unit, await dispatch.retry_request(
            unit, worker_id, requested_by="policy", brief=brief, delay_s=decision.delay_s))
        facts.update(retry_task_id=str(new_id), delay_s=decision.delay_s)
        events = unit.take()
    elif decision.action == policy.ESCALATE:
        posted = await _ask(tx, worker, escalation_question(worker, decision, summary))
        facts["question_id"] = str(posted.id)
        events = [posted.event]
    else:
        text = _report_text(worker_id, record_type, worker["status"], decision, summary)
        await tx.execute("enqueue_harness_message", {"thread_id": worker["thread_id"], "text": text})
    log.info("policy_decision", worker=str(worker_id), **{k: v for k, v in facts.items() if k != "why"})
    return [NewEvent("policy.decision", facts, tier="derived", **ids), *events]


def _report_text(worker_id: uuid.UUID, record_type: str, status: str, decision: policy.Decision,
                 summary: str) -> str:
    what = {"handoff": "Its handoff", "handoff.extraction_failed": "Its handoff failed extraction"}.get(
        record_type, "It left no output to extract")
    if decision.action == policy.REPORT:
        return f"[harness] Worker {worker_id} finished. {what}:\n{summary}"
    return (f"[harness] Worker {worker_id} ended {status}; the harness skipped it ({decision.why}). "
            f"{what}:\n{summary}")


async def _ask(tx: Transaction, worker: dict[str, Any], question: dict[str, Any]) -> asks.Posted:
    """The escalation's question, through the harness's ask service, and its `escalations` row."""
    posted = await asks.post(tx, [question], tool_use_id=f"escalation-{uuid.uuid4()}", task_id=worker["id"],
                             session_id=worker["thread_id"], project_id=worker.get("project_id"))
    assert posted is not None  # a fresh tool_use_id
    await tx.execute("insert_escalation", {"task_id": worker["id"], "thread_id": worker["thread_id"],
                                           "question_id": posted.id})
    return posted


class Settlement:
    """Escalations the user answered, carried out once (a step of the settler, executor/settle/settler.py)."""

    def __init__(self, pool: AsyncConnectionPool):
        self.q = Queries(pool, queries)

    # ---- the user answered an escalation -----------------------------------------------------------

    async def apply_escalations(self) -> int:
        """Carry out one batch of answered escalations, each once (claimed, acted on and resolved in one
        transaction); returns how many were acted on (the settler's loop asks again while there are)."""
        async with self.q.transaction() as tx:
            rows = await tx.all("list_answered_escalations")
            for row in rows:
                await self._act(tx, row)
        return len(rows)

    async def _act(self, tx: Transaction, esc: dict[str, Any]) -> None:
        worker = await tx.one("get_settled_worker", {"id": esc["task_id"]})
        assert worker is not None
        choices = list((esc["answers"] or {}).values())
        choice = choices[0] if choices else None
        if isinstance(choice, list):
            choice = choice[0] if choice else None
        thread = esc["thread_id"]
        facts: dict[str, Any] = {"escalation_id": str(esc["id"]), "question_id": str(esc["question_id"]),
                                 "answer": choice, "response": esc["response"]}
        events: list[NewEvent] = []
        if worker["role"] == "orchestrator":
            decision, events = await self._act_on_turn(tx, worker, choice, facts)
        elif choice == policy.ESCALATION_REEXTRACT:
            # only the extractor runs again, on the journal the worker left; its gate settles the rest
            decision = "reextract"
            unit = Work(tx.conn, queries)
            extractor_id = await extraction.request_on(unit, worker["id"], requested_by="user (escalation)")
            events = unit.take()
            facts["extractor_task_id"] = str(extractor_id)
        elif choice in (policy.ESCALATION_RETRY, policy.ESCALATION_RETRY_WORKER):
            unit = Work(tx.conn, queries)
            new_id = await dispatch.request_task(unit, await dispatch.retry_request(
                unit, worker["id"], requested_by="user (escalation)"))
            decision = "retry"
            facts["retry_task_id"] = str(new_id)
            events.extend(unit.take())
        elif choice == policy.ESCALATION_STOP:
            decision = "stop_plan"
            cancelled = [str(r["id"]) for r in await tx.all("cancel_thread_pending_workers", {"thread_id": thread})]
            stopped = [str(r["task_id"]) for r in await tx.all("stop_thread_running_workers", {"thread_id": thread})]
            facts.update(cancelled_tasks=cancelled, stop_requested=stopped)
            await tx.execute("enqueue_harness_message", {"thread_id": thread, "text": (
                f"[harness] Worker {worker['id']} ended {worker['status']}, and the user chose to stop the plan. "
                f"Pending workers were cancelled ({len(cancelled)}) and running ones asked to stop ({len(stopped)}). "
                "Do not dispatch more work unless the user asks; tell them where things stand.")})
        else:
            # Skip, a typed answer, a dismissal: the piece is dropped and the orchestrator hears why
            decision = "skip" if choice == policy.ESCALATION_SKIP else "relay"
            said = choice or esc["response"] or "nothing"
            await tx.execute("enqueue_harness_message", {"thread_id": thread, "text": (
                f"[harness] Worker {worker['id']} ended {worker['status']}. Asked what to do, the user answered: "
                f"{said!r}. The harness did not retry it; carry on accordingly.")})
        facts["decision"] = decision
        await tx.execute("resolve_escalation", {"id": esc["id"], "decision": decision})
        await journal.append_on(tx.conn, [NewEvent("escalation.resolved", facts, tier="derived", task_id=worker["id"],
                                                session_id=thread, project_id=worker["project_id"]), *events])
        log.info("escalation_resolved", worker=str(worker["id"]), decision=decision)

    async def _act_on_turn(self, tx: Transaction, turn: dict[str, Any], choice: Any,
                           facts: dict[str, Any]) -> tuple[str, list[NewEvent]]:
        """A failed turn's escalation: Retry runs its messages again (queued like the chat's Retry, so it
        waits for any turn the thread has open meanwhile); anything else leaves them in the chat with the
        error and its Retry. The orchestrator is not told: it never saw these messages."""
        if choice != policy.ESCALATION_RETRY:
            return ("skip" if choice == policy.ESCALATION_SKIP else "relay"), []
        queued = await tx.one("enqueue_turn_retry", {"thread_id": turn["session_id"], "task_id": turn["id"]})
        assert queued is not None  # INSERT … RETURNING gives its row
        facts["retry_queued"] = str(queued["id"])
        return "retry", []
