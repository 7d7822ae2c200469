"""A task's rows as settlement reads them to ask for another: what it was asked (its repeat asks the same), and a
worker whose work is sent back (a review, a failed check's fix round). The settler's store returns them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from shared.query import FromRow


@dataclass(frozen=True)
class ReviewTarget(FromRow):
    """A worker whose diff the user reviewed (or whose check failed), with its last task.changes and task.check
    records (settle/reviews.py)."""

    id: uuid.UUID
    role: str
    brief: str
    status: str
    project_id: uuid.UUID | None
    parent_task_id: uuid.UUID | None
    branch: str | None
    review: str | None
    allowed_tools: list[str] | None
    changes: dict[str, Any] | None
    check_round: int = 0
    check: dict[str, Any] | None = None


@dataclass(frozen=True)
class AskedTask(FromRow):
    """What a task was asked to do, where and under which limits (`get_task_request`): its repeat asks it again."""

    role: str
    brief: str
    project_id: uuid.UUID | None
    session_id: uuid.UUID | None
    parent_task_id: uuid.UUID | None
    plan_ref: str | None
    workdir: str | None
    allowed_tools: list[str] | None
    json_schema: dict[str, Any] | None
    placement_executor: str | None
    required_labels: list[str] | None
    attempt: int
    attachment_ids: list[uuid.UUID] | None
    continues_task_id: uuid.UUID | None = None  # the reviewed worker it revises (migration 0042)
    check_round: int = 0  # which fix round of a failed check it is (migration 0043)
