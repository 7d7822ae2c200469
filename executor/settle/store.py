"""The settler's reads and writes, by name (SQL in executor/sql/settle.sql): ends claimed and settled, the policy's
escalations, dispatch approvals, late answers, extraction's sources and its validation, what a brief adds, the notes
the orchestrator is told in its thread's chat, and the task door's (a task's request inserted, a task's request read
for its next attempt: executor/settle/dispatch.py).

A `SettleStore` runs its queries on what it is given: the settler's unit of work (shared/work.py), so a
step's rows commit with its records, or the pool's `Queries` (each statement on its own). Rows come back as
frozen dataclasses (shared.query.FromRow): the columns their fields name.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Self

from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from executor.settle.task_rows import AskedTask, ReviewTarget
from shared import receipts
from shared.query import FromRow, Queries, Transaction
from shared.work import Work, work


# ---- rows ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ended(FromRow):
    """An ended task as settlement sees it, read from the store (`claim_unsettled_task`)."""

    id: uuid.UUID
    role: str
    status: str
    status_reason: str | None
    parent_task_id: uuid.UUID | None = None
    json_schema: dict[str, Any] | None = None
    extract_on_exit: bool = False
    thread_turn: bool = False  # one of a thread's orchestrator turns
    thread_id: uuid.UUID | None = None  # the thread whose turn dispatched it
    exited: dict[str, Any] | None = None  # its task.exited record (None: reconciled, or cancelled while pending)
    exit_event: uuid.UUID | None = None  # that record's event (an extractor's handoff hangs under it)
    changes_due: bool = False  # a project worker's branch whose changes are not recorded yet
    fix_round_due: bool = False  # a project worker whose check failed, with a fix round left
    budget_run_id: uuid.UUID | None = None  # stopped at (or not started for) its routine run's USD cap: that run
    budget_mode: str | None = None  # that run's thread's mode (autonomous: unattended)

    @property
    def is_extractor(self) -> bool:
        return self.json_schema is not None and self.parent_task_id is not None

    @property
    def printed(self) -> bool:
        """Whether its run printed anything (an end with no output has nothing to extract)."""
        return bool((self.exited or {}).get("lines"))

    @property
    def started(self) -> bool:
        return (self.exited or {}).get("spawned", True) is not False


@dataclass(frozen=True)
class SettledWorker(FromRow):
    """A finished task and what the policy needs of it (`get_settled_worker`): its thread, when an
    orchestrator turn dispatched it, and whether its role follows the policy."""

    id: uuid.UUID
    role: str
    session_id: uuid.UUID | None
    status: str
    status_reason: str | None
    attempt: int
    brief: str
    project_id: uuid.UUID | None
    first_attempt: uuid.UUID
    follows_policy: bool
    thread_id: uuid.UUID | None


@dataclass(frozen=True)
class AnsweredEscalation(FromRow):
    id: uuid.UUID
    task_id: uuid.UUID
    thread_id: uuid.UUID
    question_id: uuid.UUID
    answers: dict[str, Any] | None
    response: str | None
    answered_by: str | None = None
    kind: str = "policy"  # policy | budget (migration 0045)
    run_id: uuid.UUID | None = None  # a budget ask's routine run
    raise_usd: float | None = None  # what a budget ask offers to add to the run's cap


@dataclass(frozen=True)
class AnsweredApproval(FromRow):
    id: uuid.UUID
    task_id: uuid.UUID
    thread_id: uuid.UUID | None
    question_id: uuid.UUID
    answers: dict[str, Any] | None
    response: str | None
    question_status: str
    answered_by: str | None
    task_status: str
    brief: str
    project_id: uuid.UUID | None
    role: str
    allowed_tools: list[str] | None
    workdir: str | None
    approved_sha256: str | None

    def checked_sha256(self) -> str:
        """The worker as it is now, hashed as its card was."""
        return WorkerSpec(self.role, self.brief, self.project_id, self.allowed_tools, self.workdir).sha256()


@dataclass(frozen=True)
class WorkerSpec(FromRow):
    """A worker as its dispatch approval binds it (shared/receipts.py: of_worker)."""

    role: str
    brief: str
    project_id: uuid.UUID | None
    allowed_tools: list[str] | None
    workdir: str | None

    def sha256(self) -> str:
        return receipts.of_worker(self.role, self.brief, self.project_id, self.allowed_tools, self.workdir)


@dataclass(frozen=True)
class LateAnswer(FromRow):
    """A user's answer to a question that had timed out, not yet sent to its thread."""

    id: uuid.UUID  # the question's
    task_id: uuid.UUID | None
    questions: list[Any] | None
    answers: dict[str, Any] | None
    response: str | None
    thread_id: uuid.UUID | None
    asked_by_role: str | None


@dataclass(frozen=True)
class ToolCall(FromRow):
    """A tool call an attempt made; `total`: how many it made in all."""

    name: str | None
    input: Any
    total: int
    finished: bool


@dataclass(frozen=True)
class RuleOut(FromRow):
    approach: str | None
    reason: str | None


@dataclass(frozen=True)
class ExtractionSource(FromRow):
    """The task an extractor distils (`get_extraction_source`)."""

    id: uuid.UUID
    brief: str
    status: str
    project_id: uuid.UUID | None
    session_id: uuid.UUID | None
    plan_ref: str | None


@dataclass(frozen=True)
class LineText(FromRow):  # a journal line's text, cut by the server (the line is the spawn's word)
    event_type: str
    text: str | None


@dataclass(frozen=True)
class ExitDenials(FromRow):
    """The permission evidence of a run: its exit's denials, the directory it ran in, the gate decisions."""

    denials: list[Any] | None
    workdir: str | None
    decided: list[Any] | None


@dataclass(frozen=True)
class _Workdir(FromRow):
    workdir: str | None


@dataclass(frozen=True)
class _Id(FromRow):
    id: uuid.UUID


@dataclass(frozen=True)
class _TaskId(FromRow):
    task_id: uuid.UUID


@dataclass(frozen=True)
class StructuredOutput(FromRow):  # a run's last result line's, None when larger than the read's bound
    structured_output: Any
    structured_bytes: int | None


@dataclass(frozen=True)
class _Status(FromRow):
    status: str


@dataclass(frozen=True)
class _SeqRange(FromRow):
    min: int | None
    max: int | None


@dataclass(frozen=True)
class Resolved(FromRow):
    id: uuid.UUID  # the escalation's
    question_id: uuid.UUID


class SettleStore:
    """settle.sql's queries on `run`: a unit of work (its transaction), or the pool's Queries."""

    def __init__(self, run: Queries | Transaction):
        self.run = run

    @classmethod
    def over(cls, pool: AsyncConnectionPool) -> Self:
        """On the pool: each statement commits on its own."""
        return cls(Queries(pool, queries))

    @asynccontextmanager
    async def work(self) -> AsyncIterator[tuple[Self, Work]]:
        """A unit of work on this store's pool: the store inside it, and the unit (what is emitted into it is
        journaled with its rows)."""
        assert isinstance(self.run, Queries), "already inside a transaction"
        async with work(self.run) as unit:
            yield type(self)(unit), unit

    # ---- ends -----------------------------------------------------------------------------------------

    async def claim_unsettled(self, skip: list[uuid.UUID]) -> Ended | None:
        """One ended task not yet settled (none of `skip`), locked until the unit of work ends."""
        return await self.run.one("claim_unsettled_task", {"skip": skip}, into=Ended)

    async def mark_settled(self, task_id: uuid.UUID) -> None:
        await self.run.execute("mark_task_settled", {"id": task_id})

    async def claim_unrecorded_changes(self) -> uuid.UUID | None:
        """A settled end whose worker's changes were never recorded, locked like a settlement."""
        found = await self.run.one("claim_unrecorded_changes", into=_Id)
        return found.id if found else None

    async def mark_changes_recorded(self, task_id: uuid.UUID) -> None:
        await self.run.execute("mark_changes_recorded", {"id": task_id})

    async def settled_worker(self, task_id: uuid.UUID) -> SettledWorker | None:
        return await self.run.one("get_settled_worker", {"id": task_id}, into=SettledWorker)

    # ---- the task door (executor/settle/dispatch.py) --------------------------------------------------

    async def project_workdir(self, project_id: uuid.UUID) -> tuple[bool, str | None]:
        """(whether the project exists, its working directory)."""
        found = await self.run.one("get_project_workdir", {"project_id": project_id}, into=_Workdir)
        return (found is not None, found.workdir if found else None)

    async def insert_task(self, row: Mapping[str, Any]) -> bool:
        """Insert a pending task (`row`: `insert_task`'s parameters, dispatch.TaskRequest.row); False when its
        `retry_of` is already repeated by another run."""
        return await self.run.one("insert_task", row, into=_Id) is not None

    async def asked(self, task_id: uuid.UUID) -> AskedTask | None:
        return await self.run.one("get_task_request", {"id": task_id}, into=AskedTask)

    async def review_target(self, task_id: uuid.UUID) -> ReviewTarget | None:
        return await self.run.one("get_review_target", {"id": task_id}, into=ReviewTarget)

    # ---- what the orchestrator is told ----------------------------------------------------------------

    async def tell_orchestrator(self, thread_id: uuid.UUID, text: str) -> uuid.UUID | None:
        """Queue a note in the thread's chat (origin `harness`): its orchestrator reads it in its next turn.
        The note's chat message id."""
        found = await self.run.one("enqueue_orchestrator_note", {"thread_id": thread_id, "text": text}, into=_Id)
        return found.id if found else None

    # ---- escalations ----------------------------------------------------------------------------------

    async def insert_escalation(self, task_id: uuid.UUID, thread_id: uuid.UUID | None,
                                question_id: uuid.UUID) -> None:
        await self.run.execute("insert_escalation", {"task_id": task_id, "thread_id": thread_id,
                                                     "question_id": question_id})

    async def answered_escalations(self) -> list[AnsweredEscalation]:
        """Escalations whose question closed and whose decision is owed, locked for this unit of work."""
        return await self.run.all("list_answered_escalations", into=AnsweredEscalation)

    async def resolve_escalation(self, escalation_id: uuid.UUID, decision: str) -> None:
        await self.run.execute("resolve_escalation", {"id": escalation_id, "decision": decision})

    async def resolve_task_escalations(self, task_id: uuid.UUID, decision: str) -> list[Resolved]:
        """A task's escalations still open, resolved with `decision`."""
        return await self.run.all("resolve_task_escalation", {"task_id": task_id, "decision": decision},
                                  into=Resolved)

    async def cancel_thread_pending_workers(self, thread_id: uuid.UUID) -> list[uuid.UUID]:
        return [r.id for r in await self.run.all("cancel_thread_pending_workers", {"thread_id": thread_id},
                                                 into=_Id)]

    async def stop_thread_running_workers(self, thread_id: uuid.UUID) -> list[uuid.UUID]:
        return [r.task_id for r in await self.run.all("stop_thread_running_workers", {"thread_id": thread_id},
                                                      into=_TaskId)]

    async def enqueue_turn_retry(self, thread_id: uuid.UUID, task_id: uuid.UUID) -> uuid.UUID:
        found = await self.run.one("enqueue_turn_retry", {"thread_id": thread_id, "task_id": task_id}, into=_Id)
        assert found is not None  # INSERT … RETURNING gives its row
        return found.id

    # ---- approvals and late answers -------------------------------------------------------------------

    async def await_approval(self, task_id: uuid.UUID) -> WorkerSpec:
        found = await self.run.one("await_approval", {"id": task_id}, into=WorkerSpec)
        assert found is not None  # a task just requested: pending
        return found

    async def insert_approval(self, task_id: uuid.UUID, thread_id: uuid.UUID, question_id: uuid.UUID) -> None:
        await self.run.execute("insert_approval", {"task_id": task_id, "thread_id": thread_id,
                                                   "question_id": question_id})

    async def answered_approvals(self) -> list[AnsweredApproval]:
        return await self.run.all("list_answered_approvals", into=AnsweredApproval)

    async def resolve_approval(self, approval_id: uuid.UUID, decision: str) -> None:
        await self.run.execute("resolve_approval", {"id": approval_id, "decision": decision})

    async def release_approved(self, task_id: uuid.UUID) -> None:
        await self.run.execute("release_approved_task", {"id": task_id})

    async def cancel_unapproved(self, task_id: uuid.UUID) -> None:
        await self.run.execute("cancel_unapproved_task", {"id": task_id})

    async def undelivered_late_answers(self) -> list[LateAnswer]:
        return await self.run.all("list_undelivered_late_answers", into=LateAnswer)

    async def record_late_answer(self, question_id: uuid.UUID, chat_id: uuid.UUID | None) -> None:
        await self.run.execute("record_late_answer", {"question_id": question_id, "chat_id": chat_id})

    # ---- briefs ---------------------------------------------------------------------------------------

    async def attempt_tool_calls(self, task_id: uuid.UUID, limit: int) -> list[ToolCall]:
        return await self.run.all("list_attempt_tool_calls", {"task_id": task_id, "limit": limit}, into=ToolCall)

    async def plan_task_handoffs(self, project_id: uuid.UUID, plan_ref: str, limit: int) -> list[dict[str, Any]]:
        """The payloads of a plan task's earlier handoffs, newest first."""
        return [r["payload"] for r in await self.run.all("list_plan_task_handoffs", {
            "project_id": project_id, "plan_ref": plan_ref, "limit": limit})]

    async def scope_rule_outs(self, scope: uuid.UUID, limit: int) -> list[RuleOut]:
        return await self.run.all("list_scope_rule_outs", {"scope": scope, "limit": limit}, into=RuleOut)

    # ---- extraction -----------------------------------------------------------------------------------

    async def extraction_source(self, task_id: uuid.UUID) -> ExtractionSource | None:
        return await self.run.one("get_extraction_source", {"id": task_id}, into=ExtractionSource)

    async def worker_texts(self, task_id: uuid.UUID, limit: int, chars: int) -> list[LineText]:
        """A run's last assistant texts and its result text, newest first, each at most `chars` long."""
        return await self.run.all("list_worker_texts", {"id": task_id, "limit": limit, "chars": chars}, into=LineText)

    async def task_result(self, task_id: uuid.UUID, max_bytes: int) -> StructuredOutput | None:
        return await self.run.one("get_task_result", {"id": task_id, "max_bytes": max_bytes}, into=StructuredOutput)

    async def schema_complaints(self, task_id: uuid.UUID, limit: int, chars: int) -> list[str]:
        """What the CLI told a run about its StructuredOutput calls, oldest first, each at most `chars` long."""
        params = {"id": task_id, "limit": limit, "chars": chars}
        return [r.text for r in await self.run.all("list_schema_complaints", params, into=LineText) if r.text]

    async def raw_seq_range(self, task_id: uuid.UUID) -> tuple[int | None, int | None]:
        found = await self.run.one("get_raw_seq_range", {"id": task_id}, into=_SeqRange)
        return (found.min, found.max) if found else (None, None)

    async def mark_extraction_failed(self, task_id: uuid.UUID, reason: str) -> None:
        await self.run.execute("mark_extraction_failed", {"id": task_id, "reason": reason})

    async def restore_exit_status(self, task_id: uuid.UUID) -> str | None:
        """A worker's exit-derived status back in place of extraction_failed; None when it was not that."""
        found = await self.run.one("restore_exit_status", {"id": task_id}, into=_Status)
        return found.status if found else None

    async def exit_denials(self, task_id: uuid.UUID) -> ExitDenials | None:
        return await self.run.one("get_exit_denials", {"id": task_id}, into=ExitDenials)
