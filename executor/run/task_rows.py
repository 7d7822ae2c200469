"""The rows of the tasks' store (executor/run/task_store.py: tasks.sql), as frozen dataclasses: what a claim, a
spawn and a run's end read and write. A FromRow takes the columns its fields name."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.query import FromRow


@dataclass(frozen=True)
class ClaimedTask(FromRow):
    """A task this executor claimed (or found running after a restart): what its spawn needs."""

    id: uuid.UUID
    project_id: uuid.UUID | None
    session_id: uuid.UUID | None
    parent_task_id: uuid.UUID | None
    role: str
    brief: str
    plan_ref: str | None
    workdir: str | None
    allowed_tools: list[str] | None
    attempt: int
    json_schema: dict[str, Any] | None
    attachment_ids: list[uuid.UUID]  # files fed to the CLI with the brief (a turn's messages carried them)
    max_budget_usd: float | None  # the CLI's --max-budget-usd (a routine's run: its USD per run)
    chat: bool  # a thread turn a user's message started (claimed first; the last free slot is kept for it)


@dataclass(frozen=True)
class OrphanedTask(ClaimedTask):
    """A task a dead run of this executor left running: a claimed task and the process it had."""

    pid: int | None


@dataclass(frozen=True)
class StopRequest(FromRow):
    id: uuid.UUID
    task_id: uuid.UUID
    reason: str | None


@dataclass(frozen=True)
class RoleProfile(FromRow):
    role: str
    system_prompt: str
    allowed_tools: list[str]
    use_mcp: bool


@dataclass(frozen=True)
class Template(FromRow):
    """What a thread's next turn will be spawned from: its latest turn's placement and tools (a warm process is
    started from it: executor/run/spawn/warm_pool.py)."""

    session_id: uuid.UUID
    project_id: uuid.UUID | None
    role: str
    workdir: str | None
    allowed_tools: list[str] | None
    seen_at: datetime | None  # the latest presence report of a page showing it (None: not shown)


@dataclass(frozen=True)
class Requeued(FromRow):
    """How many claimed queue rows of a dead run went back to pending."""

    chat: int
    stop: int
    thread_control: int


@dataclass(frozen=True)
class ClosedQuestion(FromRow):
    id: uuid.UUID
    task_id: uuid.UUID | None


@dataclass(frozen=True)
class Parked(FromRow):
    """A running task parked on the user: the question it waits on, and whether that can outlive the process."""

    task_id: uuid.UUID
    question_id: uuid.UUID
    asked_at: datetime
    late_ok: bool
    # its answer resumes the asking conversation itself: a thread's turn's own ask_user_question (what the
    # park-after grace ends; a worker's or a gate card's answer could not reach the call it was for)
    resumes: bool = False


@dataclass(frozen=True)
class TaskEnd:
    """A run's final status as its row records it."""

    status: str
    reason: str
    exit_code: int | None
    exit_signal: int | None
    last_output_at: datetime | None


@dataclass(frozen=True)
class AttachmentFile(FromRow):  # a file a task carries, without its bytes (what its worker may be handed)
    id: uuid.UUID
    name: str
    media_type: str
    size_bytes: int
