"""A review sent back: the user's line comments on a project worker's diff become a follow-up worker.

The ingress queues the review as a thread control (`review`); here it becomes one task through the one door
(`request_task`): a worker that continues the reviewed one (`continues_task_id`), whose worktree starts at the
commit the review was of, on a branch of its own, with the comments (file, lines, text, the hunk) in its brief.
Its parent is the reviewed worker's, so its handoff comes back to the same thread; its diff is taken against
the reviewed commit, so it shows what changed since the review. The `task.review` record keeps the review in
the thread's history. The reviewed branch is left as it was (merge or discard it as before).
"""

from __future__ import annotations

import uuid
from typing import Any

from executor.settle import dispatch
from executor.settle.store import SettleStore
from executor.settle.task_rows import ReviewTarget
from shared.models import ACTIVE_STATUSES, NewEvent
from shared.work import Work

MAX_COMMENTS = 50
HUNK_LINES = 40  # of a comment's hunk, in the brief


def _where(c: dict[str, Any]) -> str:
    line, end = c.get("line"), c.get("end_line")
    return f"{c.get('file')}:{line}" + (f"-{end}" if end and end != line else "")


def brief_for(target: ReviewTarget, comments: list[dict[str, Any]], note: str | None) -> str:
    """The follow-up's brief: what the reviewed worker was asked, and the review, comment by comment."""
    commit = str((target.changes or {}).get("head_commit") or "")
    parts = [f"Revise the work on branch {target.branch}: the user reviewed its diff and asks for changes. Your "
             f"working tree already holds that work (commit {commit[:12]}); change it as the review says, and "
             "commit nothing unrelated.", "", "What the work was:", target.brief.strip(), "", "The review:"]
    if note:
        parts.append(note.strip())
    for i, c in enumerate(comments, 1):
        parts.append(f"{i}. {_where(c)} — {str(c.get('text') or '').strip()}")
        hunk = [line for line in str(c.get("hunk") or "").splitlines() if line.strip()][:HUNK_LINES]
        if hunk:
            parts += ["   ```diff", *(f"   {line}" for line in hunk), "   ```"]
    return "\n".join(parts)


async def send_back(work: Work, thread_id: uuid.UUID, args: dict[str, Any]) -> str | None:
    """Request the follow-up a review asks for, in `work`; None, or why it cannot be (nothing is recorded)."""
    try:
        task_id = uuid.UUID(str(args.get("task_id")))
    except ValueError:
        return f"no task {args.get('task_id')!r}"
    target = await SettleStore(work).review_target(task_id)
    comments = [c for c in args.get("comments") or [] if isinstance(c, dict)][:MAX_COMMENTS]
    changes = (target.changes or {}) if target else {}
    if target is None or target.role != "worker" or target.branch is None or target.project_id is None:
        return f"task {task_id} is no worker of a project with a branch"
    if target.status in ACTIVE_STATUSES:
        return f"task {task_id} is still {target.status}: review it once it has ended"
    if target.review is not None:
        return f"the branch of task {task_id} was already {target.review}"
    if not changes.get("head_commit") or "error" in changes:
        return f"task {task_id} has no recorded changes to review"
    if not comments and not args.get("note"):
        return "a review needs at least one comment"
    request = dispatch.TaskRequest(
        "worker", brief_for(target, comments, args.get("note")), project_id=target.project_id,
        project_workdir=True, parent_task_id=target.parent_task_id, continues_task_id=target.id,
        allowed_tools=tuple(target.allowed_tools) if target.allowed_tools is not None else None,
        requested_by=f"user (review, {args.get('by') or 'unknown'})", record={"review_of": str(target.id)})
    followup = await dispatch.request_task(work, request)
    work.emit(NewEvent("task.review", {
        "comments": comments, "note": args.get("note"), "by": args.get("by"), "branch": target.branch,
        "commit": changes.get("head_commit"), "followup_task_id": str(followup)},
        task_id=target.id, session_id=thread_id, project_id=target.project_id))
    return None


# ---- a failed check's fix round ---------------------------------------------------------------------------

FAIL_LINES = 80  # of a failed check's output, in the fix round's brief


def fix_brief(target: ReviewTarget, check: dict[str, Any]) -> str:
    """A fix round's brief: the check that failed, its last lines, and what the work was."""
    how = "it was stopped at its time limit" if check.get("timed_out") else f"exit {check.get('exit_code')}"
    tail = [str(line) for line in check.get("tail") or []][-FAIL_LINES:]
    return "\n".join([
        f"Fix the work on branch {target.branch}: the project's check failed on it. Your working tree already "
        "holds that work; change it so that the check passes, and commit nothing unrelated.", "",
        f"The check: `{check.get('command')}` ({how}). Its last lines:", "```", *tail, "```", "",
        "What the work was:", target.brief.strip()])


async def fix_round(work: Work, task_id: uuid.UUID) -> uuid.UUID | None:
    """Request the fix round a worker's failed check calls for, in `work` (its changes are recorded in the same
    unit, before it): a worker that continues it, one round further, under the same turn. None when there is
    no failed check to fix."""
    target = await SettleStore(work).review_target(task_id)
    if target is None or not target.check or target.check.get("passed") or target.project_id is None:
        return None
    round_ = target.check_round + 1
    return await dispatch.request_task(work, dispatch.TaskRequest(
        "worker", fix_brief(target, target.check), project_id=target.project_id, project_workdir=True,
        parent_task_id=target.parent_task_id, continues_task_id=target.id, check_round=round_,
        allowed_tools=tuple(target.allowed_tools) if target.allowed_tools is not None else None,
        requested_by="settler (the check failed)", record={"fix_round_of": str(target.id)}))
