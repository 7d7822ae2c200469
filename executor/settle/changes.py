"""A project worker's changes, recorded as a settlement step: its branch brought from its private repository
into the project's with `git fetch` (objects hashed on the way in), what it holds over the commit it started
from (a derived `task.changes` record, with the commit the diff is of: Merge merges that one only), then its
worktree and private repository removed (unless kept; the branch stays until the user merges or discards it).

It runs in the settler's unit of work, before the end's own step (so an extractor finds the changes for
the handoff's artifacts): the record, the `changes_recorded_at` marker and the end's settled marker commit
together, so the changes are recorded exactly once, also across a crash. The git part is idempotent: run
again after a rollback, it finds the worktree's uncommitted work already committed to the branch.
"""

from __future__ import annotations

import uuid
from typing import Any

from executor.projects import worktrees
from executor.projects.store import ProjectStore
from executor.settle.store import SettleStore
from shared import logs
from shared.models import NewEvent
from shared.work import Work

log = logs.get(__name__)


async def record(unit: Work, task_id: uuid.UUID, *, keep_worktree: bool) -> None:
    """Record an ended task's changes in `unit`, emitting their records into it (nothing when the task has no
    branch of a project, or its changes are recorded already)."""
    row = await ProjectStore(unit).task_worktree(task_id)
    if row is None or row.branch is None or row.changes_recorded_at is not None:
        return
    repo, worktree = row.repo, row.worktree_path
    payload: dict[str, Any]
    try:
        if row.base_commit is None:
            raise worktrees.GitError(f"no base commit recorded for branch {row.branch}")
        async with worktrees.repo_lock(repo):
            payload = await worktrees.changes(repo, worktree, task_id, row.branch, row.base_commit)
        payload["base_branch"] = row.base_branch
    except (worktrees.GitError, OSError) as exc:
        # recorded as it is: the branch stays for the user, and a retry would fail the same way
        payload = {"branch": row.branch, "error": str(exc)}
        log.exception("record_changes_failed", task_id=str(task_id))
    unit.emit(NewEvent("task.changes", payload, tier="derived", task_id=task_id, project_id=row.project_id,
                       session_id=row.session_id))
    await SettleStore(unit).mark_changes_recorded(task_id)
    if worktree is not None and not keep_worktree and "error" not in payload:
        try:
            await worktrees.remove(repo, worktree)
            unit.emit(NewEvent("task.worktree_removed", {"path": str(worktree)}, task_id=task_id,
                               project_id=row.project_id))
        except (worktrees.GitError, OSError):
            log.exception("worktree_remove_failed", task_id=str(task_id))
