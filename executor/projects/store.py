"""The projects' store (executor/sql/projects.sql): the project queue, projects, and a task's worktree, branch,
review and recorded changes.

The one module of this room that runs these queries; rows come back as frozen dataclasses (shared.query.FromRow).
A store runs over the pool (`over`), on a connection (`on`: a caller's transaction), or inside a unit of work.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared.query import FromRow, Queries, Transaction


@dataclass(frozen=True)
class ProjectRequest(FromRow):
    """A claimed row of the project queue: register a project (`create`), or merge or discard a task's branch."""

    id: uuid.UUID
    action: str
    task_id: uuid.UUID | None
    args: dict[str, Any] | None


@dataclass(frozen=True)
class WorktreeSource(FromRow):
    """The project whose repository a claimed task gets its own worktree of."""

    project_id: uuid.UUID
    name: str
    workdir: str
    # a follow-up of a reviewed worker: the reviewed commit it starts at, and the branch that one merges into
    start_commit: str | None = None
    start_base_branch: str | None = None
    continues_task_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class TaskWorktree(FromRow):
    """A task of a project with its worktree, branch and review as recorded (`get_task_worktree`)."""

    id: uuid.UUID
    project_id: uuid.UUID
    session_id: uuid.UUID | None
    status: str
    worktree: str | None
    branch: str | None
    base_branch: str | None
    base_commit: str | None
    changes_recorded_at: datetime | None
    review: str | None
    project_workdir: str | None

    @property
    def repo(self) -> Path:
        assert self.project_workdir is not None  # a task with a branch is one of a project on a repository
        return Path(self.project_workdir)

    @property
    def worktree_path(self) -> Path | None:
        return Path(self.worktree) if self.worktree else None


@dataclass(frozen=True, slots=True)
class ProjectRemote(FromRow):
    """A project's repository and the push remote the user set for it (where Push sends a reviewed commit; never
    read from the repository's config)."""

    id: uuid.UUID
    workdir: str | None
    push_remote: str | None


@dataclass(frozen=True)
class _Id(FromRow):
    id: uuid.UUID


@dataclass(frozen=True)
class _Plan(FromRow):
    plan: str | None


@dataclass(frozen=True)
class _Payload(FromRow):
    payload: dict[str, Any]


class ProjectStore:
    def __init__(self, q: Queries | Transaction):
        self.q = q

    @classmethod
    def over(cls, pool: AsyncConnectionPool) -> ProjectStore:
        return cls(Queries(pool, queries))

    @classmethod
    def on(cls, conn: AsyncConnection[Any]) -> ProjectStore:
        """The store on a connection the caller holds (inside its transaction)."""
        return cls(Transaction(conn, queries))

    # ---- the queue -----------------------------------------------------------------------------------

    async def claim_requests(self) -> list[ProjectRequest]:
        return await self.q.all("claim_project_requests", into=ProjectRequest)

    async def requeue_claimed(self) -> None:
        """The executor is a singleton: what a previous one claimed and never finished goes back to pending."""
        await self.q.execute("requeue_claimed_project_requests")

    async def finish_request(self, request_id: uuid.UUID, status: str, error: str | None,
                             result: dict[str, Any] | None) -> None:
        await self.q.execute("finish_project_request", {"id": request_id, "status": status, "error": error,
                                                        "result": Jsonb(result) if result is not None else None})

    # ---- projects ------------------------------------------------------------------------------------

    async def insert_project(self, slug: str, *, workdir: str | None, plan: str | None, plan_path: str | None,
                             sandbox_allow: list[str], check_command: str | None = None,
                             check_retries: int = 1, push_remote: str | None = None) -> uuid.UUID | None:
        """The new project's id; None when the slug is taken."""
        made = await self.q.one("insert_project", {"name": slug, "workdir": workdir, "plan": plan,
                                                   "plan_path": plan_path, "sandbox_allow": sandbox_allow,
                                                   "check_command": check_command, "check_retries": check_retries,
                                                   "push_remote": push_remote},
                                into=_Id)
        return made.id if made else None

    async def remote(self, project_id: uuid.UUID) -> ProjectRemote | None:
        return await self.q.one("get_project_remote", {"id": project_id}, into=ProjectRemote)

    async def set_push_remote(self, project_id: uuid.UUID, push_remote: str | None) -> None:
        await self.q.execute("set_project_push_remote", {"id": project_id, "push_remote": push_remote})

    async def workdir_taken(self, workdir: str) -> bool:
        return await self.q.one("get_project_by_workdir", {"workdir": workdir}, into=_Id) is not None

    async def plan(self, project_id: uuid.UUID) -> str | None:
        """A project's plan (None: no such project, or it has none)."""
        found = await self.q.one("get_project_plan", {"id": project_id}, into=_Plan)
        return found.plan if found else None

    # ---- a task's worktree ---------------------------------------------------------------------------

    async def worktree_source(self, task_id: uuid.UUID) -> WorktreeSource | None:
        """The project a task works on in a worktree of its own; None when its role runs where it is."""
        return await self.q.one("get_worktree_source", {"id": task_id}, into=WorktreeSource)

    async def set_task_worktree(self, task_id: uuid.UUID, worktree: Path, branch: str, base_branch: str | None,
                                base_commit: str | None) -> None:
        await self.q.execute("set_task_worktree", {"id": task_id, "worktree": str(worktree), "branch": branch,
                                                   "base_branch": base_branch, "base_commit": base_commit})

    async def task_worktree(self, task_id: uuid.UUID) -> TaskWorktree | None:
        return await self.q.one("get_task_worktree", {"id": task_id}, into=TaskWorktree)

    async def set_review(self, task_id: uuid.UUID, review: str) -> None:
        """`merged` or `discarded`, once."""
        await self.q.execute("set_task_review", {"id": task_id, "review": review})

    async def latest_changes(self, task_id: uuid.UUID) -> dict[str, Any] | None:
        """The payload of a task's last `task.changes` record (what the user reviewed), None before one."""
        found = await self.q.one("get_latest_task_changes", {"id": task_id}, into=_Payload)
        return found.payload if found else None
