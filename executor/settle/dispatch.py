"""Requesting work: the one door through which a task comes to be.

`request_task(work, TaskRequest)` inserts the pending task row and emits its `task.dispatch_requested`
record into the unit of work, so both commit together. Every task is requested here: a worker the harness's
dispatch_worker asks for (approved at once, or waiting for the user's approval), an orchestrator's turn, an
extractor for a finished worker, and the next attempt of a task (a policy retry, a turn re-run, the user's
Retry). The supervisor is woken by the row's NOTIFY and spawns it; whoever asks never spawns a process.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.settle.store import SettleStore
from executor.settle.task_rows import AskedTask
from shared import errors
from shared.models import NewEvent
from shared.query import Transaction
from shared.work import Work

# How much of a brief the `task.dispatch_requested` record carries (the row holds all of it).
RECORD_BRIEF_CHARS = 2000
# The role whose task speaks in its thread's conversation (its session is the thread): a turn.
TURN_ROLE = "orchestrator"


class DispatchRefused(errors.PetalError):
    """The request cannot be run as given; nothing was recorded."""


class AlreadyRepeated(DispatchRefused):
    """Another run already repeats this task (a task is run again at most once)."""


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """What a task is asked to do, where and under which limits, and who asked.

    `session_id`: the conversation it speaks in (a turn: its thread; a worker starts its own).
    `parent_task_id`: the task that asked for it (the dispatching turn, an extractor's worker).
    `project_workdir`: with no `workdir`, run in the project's working directory (a dispatched worker).
    `allowed_tools`, `json_schema`: its limits; `executor`, `labels`: where it may run.
    `retry_of`, `attempt`, `delay_s`: the next attempt of a task, not claimed before `delay_s` have passed.
    `requested_by`, `tool_use_id` (the dispatching tool call: the task hangs under it in the journal's tree)
    and `record` (further facts) go into the `task.dispatch_requested` record.
    """

    role: str
    brief: str
    project_id: uuid.UUID | None = None
    session_id: uuid.UUID | None = None
    parent_task_id: uuid.UUID | None = None
    plan_ref: str | None = None
    workdir: Path | None = None
    project_workdir: bool = False
    allowed_tools: tuple[str, ...] | None = None
    json_schema: Mapping[str, Any] | None = None
    executor: str | None = None
    labels: tuple[str, ...] = ()
    retry_of: uuid.UUID | None = None
    attempt: int = 1
    delay_s: float = 0.0
    requested_by: str | None = None
    tool_use_id: str | None = None
    record: Mapping[str, Any] = field(default_factory=dict)
    id: uuid.UUID = field(default_factory=uuid.uuid4)
    # files the user sent with the messages the brief carries: the run feeds them to the CLI with it
    attachment_ids: tuple[uuid.UUID, ...] = ()
    # a thread turn a user's message started: claimed ahead of unattended work (executor/run/supervisor.py);
    # a repeat of a task (from_row) is unattended
    chat: bool = False
    # the reviewed worker this one revises: its worktree starts at the reviewed commit (settle/reviews.py);
    # check_round: which fix round of a failed check it is
    continues_task_id: uuid.UUID | None = None
    check_round: int = 0

    @classmethod
    def from_row(cls, row: AskedTask) -> TaskRequest:
        """The request a task row records (`get_task_request`), to be asked again."""
        return cls(
            role=row.role, brief=row.brief, project_id=row.project_id, session_id=row.session_id,
            parent_task_id=row.parent_task_id, plan_ref=row.plan_ref,
            workdir=Path(row.workdir) if row.workdir else None,
            allowed_tools=tuple(row.allowed_tools) if row.allowed_tools is not None else None,
            json_schema=row.json_schema, executor=row.placement_executor,
            labels=tuple(row.required_labels or ()), attempt=row.attempt,
            attachment_ids=tuple(row.attachment_ids or ()), continues_task_id=row.continues_task_id,
            check_round=row.check_round)

    def row(self) -> dict[str, Any]:
        """The pending row `insert_task` writes for it (a first request waits for nothing: no delay)."""
        return {
            "id": self.id, "project_id": self.project_id, "session_id": self.session_id,
            "parent_task_id": self.parent_task_id, "role": self.role, "brief": self.brief, "plan_ref": self.plan_ref,
            "workdir": str(self.workdir) if self.workdir else None,
            "allowed_tools": list(self.allowed_tools) if self.allowed_tools is not None else None,
            "json_schema": Jsonb(dict(self.json_schema)) if self.json_schema is not None else None,
            "executor": self.executor, "labels": list(self.labels), "attempt": self.attempt,
            "retry_of": self.retry_of, "delay_s": self.delay_s if self.retry_of is not None else None,
            "attachment_ids": list(self.attachment_ids), "chat": self.chat,
            "continues_task_id": self.continues_task_id, "check_round": self.check_round}

    def dispatch_record(self) -> NewEvent:
        """Its `task.dispatch_requested` record."""
        facts: dict[str, Any] = {
            "role": self.role, "brief": self.brief[:RECORD_BRIEF_CHARS], "plan_ref": self.plan_ref,
            "workdir": str(self.workdir) if self.workdir else None, "requested_by": self.requested_by,
            "parent_task_id": str(self.parent_task_id) if self.parent_task_id else None}
        if self.tool_use_id:
            facts["tool_use_id"] = self.tool_use_id
        if self.attachment_ids:
            facts["attachment_ids"] = [str(i) for i in self.attachment_ids]
        if self.continues_task_id:
            facts["continues_task_id"] = str(self.continues_task_id)
        if self.check_round:
            facts["check_round"] = self.check_round
        if self.retry_of is not None:
            facts.update(retry_of=str(self.retry_of), attempt=self.attempt, delay_s=self.delay_s)
        return NewEvent("task.dispatch_requested", {**facts, **self.record}, task_id=self.id,
                        session_id=self.session_id, project_id=self.project_id)


async def request_task(work: Work, request: TaskRequest) -> uuid.UUID:
    """Insert the task `request` asks for (pending) and emit its `task.dispatch_requested` record into
    `work`; returns its id (`request.id`).

    Raises:
        DispatchRefused: an empty brief, an unknown project, or a working directory that does not exist
            (a new request; a repeat keeps what its first attempt was given).
        AlreadyRepeated: `request.retry_of` is already repeated by another run.
    """
    if not request.brief.strip():
        raise DispatchRefused("a task needs a non-empty brief")
    store = SettleStore(work)
    if request.project_workdir and request.workdir is None and request.project_id is not None:
        found, workdir = await store.project_workdir(request.project_id)
        if not found:
            raise DispatchRefused(f"no project {request.project_id}")
        request = replace(request, workdir=Path(workdir) if workdir else None)
    if request.retry_of is None and request.workdir is not None and not request.workdir.is_dir():
        raise DispatchRefused(f"working directory {request.workdir} does not exist")
    if not await store.insert_task(request.row()):
        raise AlreadyRepeated(f"task {request.retry_of} is already run again")
    work.emit(request.dispatch_record())
    return request.id


async def retry_request(tx: Transaction, task_id: uuid.UUID, *, requested_by: str, brief: str | None = None,
                        delay_s: float = 0.0, record: Mapping[str, Any] | None = None) -> TaskRequest:
    """The next attempt of a task, for `request_task`: what it was asked (or `brief` instead), where and
    under which limits, one attempt further, after `delay_s`. A turn speaks in its thread again; any other
    task starts a conversation of its own.

    Raises:
        DispatchRefused: there is no such task.
    """
    row = await SettleStore(tx).asked(task_id)
    if row is None:
        raise DispatchRefused(f"no task {task_id}")
    prior = TaskRequest.from_row(row)
    return replace(prior, brief=prior.brief if brief is None else brief,
                   session_id=prior.session_id if prior.role == TURN_ROLE else None,
                   retry_of=task_id, attempt=prior.attempt + 1, delay_s=delay_s, requested_by=requested_by,
                   record=record or {})


async def request(pool: AsyncConnectionPool, asked: TaskRequest) -> uuid.UUID:
    """`request_task` in a unit of work of its own; returns the task's id.

    Raises:
        DispatchRefused: as `request_task`.
    """
    async with SettleStore.over(pool).work() as (_, unit):
        return await request_task(unit, asked)
