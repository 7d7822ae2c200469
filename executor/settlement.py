"""What becomes of a thread's finished worker: the policy's decision, carried out and journaled.

`apply_policy` runs inside the settler's transaction (executor/settler.py): its rows, its events and
the task's settled marker commit together, so an end is acted on exactly once, also across a crash.

A clean end is reported to the orchestrator that dispatched the worker (a harness message: its next
turn). A non-clean end follows executor/policy.py: a retry is a new task linked to the attempt it
repeats (a back-off retry waits for its `not_before`); an escalation is a question the harness itself
asks in the Asks panel, plus an `escalations` row that says a decision is owed — acted on exactly once
when the answer lands, even across an executor restart; a skip tells the orchestrator and goes on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor import briefs, policy
from executor.sql import queries
from shared import journal, logs
from shared.models import NewEvent

log = logs.get(__name__)

MAX_REPORT_CHARS = 8_000
MAX_PREVIEW_CHARS = 4_000
ESCALATION_HEADER = "Worker ended"


def _summary(payload: dict[str, Any]) -> str:
    shown = {k: v for k, v in payload.items() if k not in ("raw_seq_range", "contract")}
    return json.dumps(shown, indent=2, default=str)[:MAX_REPORT_CHARS]


def escalation_question(worker: dict[str, Any], decision: policy.Decision, summary: str) -> dict[str, Any]:
    again = " again" if worker["attempt"] > 1 else ""
    preview = (f"**Brief**\n\n{worker['brief'][:MAX_PREVIEW_CHARS // 2]}\n\n**What came back**\n\n"
               f"```json\n{summary[:MAX_PREVIEW_CHARS // 2]}\n```")
    return {
        "question": f"A worker ended {worker['status']}{again} (attempt {worker['attempt']}; {decision.why}). "
                    "What should the harness do?",
        "header": ESCALATION_HEADER,
        "multiSelect": False,
        "options": [
            {"label": policy.ESCALATION_RETRY, "description": "run the same brief once more", "preview": preview},
            {"label": policy.ESCALATION_SKIP, "description": "drop this piece; the orchestrator carries on"},
            {"label": policy.ESCALATION_STOP,
             "description": "stop this thread's workers and tell the orchestrator to stop"},
        ],
    }


async def apply_policy(conn: Any, worker_id: uuid.UUID, record_type: str, payload: dict[str, Any], *,
                       backoff_base_s: float, started: bool = True) -> list[NewEvent]:
    """Act on a thread's worker's end inside the caller's transaction; returns the events to journal with it.

    `record_type` is what the end left: handoff, handoff.extraction_failed or task.exited. A worker
    outside a thread's loop gets nothing: its end stays visible and nobody acts on it.
    """
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries["settled_worker"], {"id": worker_id})
        worker = await cur.fetchone()
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
        new_id = await _retry(conn, worker, brief, decision.delay_s)
        facts.update(retry_task_id=str(new_id), delay_s=decision.delay_s)
        events = [NewEvent("task.dispatch_requested", {
            "role": "worker", "brief": brief[:2000], "plan_ref": worker["plan_ref"],
            "requested_by": "policy", "retry_of": str(worker_id), "attempt": worker["attempt"] + 1,
            "delay_s": decision.delay_s}, task_id=new_id, project_id=worker["project_id"])]
    elif decision.action == policy.ESCALATE:
        question = escalation_question(worker, decision, summary)
        qid = await _ask(conn, worker, question)
        facts["question_id"] = str(qid)
        events = [NewEvent("question.asked", {"question_id": str(qid), "tool_use_id": f"escalation-{qid}",
                                              "questions": [question], "asked_by": "harness"}, **ids)]
    else:
        text = _report_text(worker_id, record_type, worker["status"], decision, summary)
        await conn.execute(queries["enqueue_harness_message"], {"thread_id": worker["thread_id"], "text": text})
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


async def _retry(conn: Any, worker: dict[str, Any], brief: str, delay_s: float) -> uuid.UUID:
    new_id = uuid.uuid4()
    await conn.execute(queries["insert_retry"], {"new_id": new_id, "id": worker["id"], "brief": brief,
                                                 "delay_s": delay_s})
    return new_id


async def _ask(conn: Any, worker: dict[str, Any], question: dict[str, Any]) -> uuid.UUID:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries["insert_harness_question"], {
            "tool_use_id": f"escalation-{uuid.uuid4()}", "session_id": worker["thread_id"],
            "task_id": worker["id"], "questions": Jsonb([question])})
        row = await cur.fetchone()
        assert row is not None
        await cur.execute(queries["insert_escalation"], {"task_id": worker["id"], "thread_id": worker["thread_id"],
                                                         "question_id": row["id"]})
    question_id: uuid.UUID = row["id"]
    return question_id


class Settlement:
    """Escalations the user answered, carried out once (the threads loop runs this)."""

    def __init__(self, pool: AsyncConnectionPool, wake: Callable[[], None]):
        self.pool = pool
        self.wake = wake  # the threads loop: a harness message waits for it

    # ---- the user answered an escalation -----------------------------------------------------------

    async def apply_escalations(self) -> int:
        """Carry out every answered escalation once; returns how many were acted on."""
        acted = 0
        while True:
            async with self.pool.connection() as conn, conn.transaction():
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(queries["answered_escalations"])
                    rows = await cur.fetchall()
                for row in rows:
                    await self._act(conn, row)
            acted += len(rows)
            if not rows:
                return acted
            self.wake()

    async def _act(self, conn: Any, esc: dict[str, Any]) -> None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(queries["settled_worker"], {"id": esc["task_id"]})
            worker = await cur.fetchone()
        assert worker is not None
        choices = list((esc["answers"] or {}).values())
        choice = choices[0] if choices else None
        if isinstance(choice, list):
            choice = choice[0] if choice else None
        thread = esc["thread_id"]
        facts: dict[str, Any] = {"escalation_id": str(esc["id"]), "question_id": str(esc["question_id"]),
                                 "answer": choice, "response": esc["response"]}
        events: list[NewEvent] = []
        if choice == policy.ESCALATION_RETRY:
            new_id = await _retry(conn, worker, worker["brief"], 0.0)
            decision = "retry"
            facts["retry_task_id"] = str(new_id)
            events.append(NewEvent("task.dispatch_requested", {
                "role": "worker", "brief": worker["brief"][:2000], "plan_ref": worker["plan_ref"],
                "requested_by": "user (escalation)", "retry_of": str(worker["id"]), "attempt": worker["attempt"] + 1},
                task_id=new_id, project_id=worker["project_id"]))
        elif choice == policy.ESCALATION_STOP:
            decision = "stop_plan"
            cur = await conn.execute(queries["cancel_thread_pending_workers"], {"thread_id": thread})
            cancelled = [str(r[0]) for r in await cur.fetchall()]
            cur = await conn.execute(queries["stop_thread_running_workers"], {"thread_id": thread})
            stopped = [str(r[0]) for r in await cur.fetchall()]
            facts.update(cancelled_tasks=cancelled, stop_requested=stopped)
            await conn.execute(queries["enqueue_harness_message"], {"thread_id": thread, "text": (
                f"[harness] Worker {worker['id']} ended {worker['status']}, and the user chose to stop the plan. "
                f"Pending workers were cancelled ({len(cancelled)}) and running ones asked to stop ({len(stopped)}). "
                "Do not dispatch more work unless the user asks; tell them where things stand.")})
        else:
            # Skip, a typed answer, a dismissal: the piece is dropped and the orchestrator hears why
            decision = "skip" if choice == policy.ESCALATION_SKIP else "relay"
            said = choice or esc["response"] or "nothing"
            await conn.execute(queries["enqueue_harness_message"], {"thread_id": thread, "text": (
                f"[harness] Worker {worker['id']} ended {worker['status']}. Asked what to do, the user answered: "
                f"{said!r}. The harness did not retry it; carry on accordingly.")})
        facts["decision"] = decision
        await conn.execute(queries["resolve_escalation"], {"id": esc["id"], "decision": decision})
        await journal.append_on(conn, [NewEvent("escalation.resolved", facts, tier="derived", task_id=worker["id"],
                                                session_id=thread, project_id=worker["project_id"]), *events])
        log.info("escalation_resolved", worker=str(worker["id"]), decision=decision)
