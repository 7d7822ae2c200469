"""What a caller may name in a harness tool's arguments: its own thread, its own project, within its bounds.

The caller comes from its per-spawn credential alone (identity.py); every id a tool takes is checked against it:

- **reads** (`get_handoffs`, `check_ruled_out`): a task or conversation of the caller's tree — every turn of
  the thread its lineage's root speaks in (for a root outside any thread, that root) and every task they
  dispatched, transitively — or the caller's project, or a task or conversation of that project (a project's
  handoffs are its shared record, every thread's: a plan task's worker is briefed with them anyway).
  `get_project_state`: the caller's project only. Any other id answers exactly as an unknown one
  (no handoffs, no matches, "no project"): the answer never tells whether it exists.
- **dispatch_worker**: a worker runs in its caller's project; `project_id` may only repeat it (a caller
  without a project cannot name one). The lineage is bounded: a worker of depth `max_depth` (a turn's
  worker is at depth 1, its worker at 2 …) dispatches no further, and a task asks for at most
  `max_per_task` workers. Past either, the call is refused with the reason.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from executor.harness.store import HarnessStore, Lineage
from executor.run.caller import Caller

__all__ = ["DispatchLimits", "Lineage", "over_bounds", "project_refusal", "project_visible", "readable"]

MAX_DISPATCH_DEPTH = 3
MAX_DISPATCH_PER_TASK = 20


@dataclass(frozen=True, slots=True)
class DispatchLimits:
    """How far workers may dispatch workers (PETAL_MAX_DISPATCH_DEPTH, PETAL_MAX_DISPATCH_PER_TASK)."""

    max_depth: int = MAX_DISPATCH_DEPTH
    max_per_task: int = MAX_DISPATCH_PER_TASK


def over_bounds(limits: DispatchLimits, found: Lineage) -> tuple[str, str] | None:
    """(reason, message) when the caller may not ask for another worker; None when it may."""
    if found.depth + 1 > limits.max_depth:
        return "dispatch depth", (
            f"this task is a worker at depth {found.depth} (a turn's worker is at depth 1); workers dispatch "
            f"at most {limits.max_depth} deep (PETAL_MAX_DISPATCH_DEPTH): do the work yourself, or report "
            "back and let the orchestrator dispatch it")
    if found.dispatched >= limits.max_per_task:
        return "dispatches per task", (
            f"this task has asked for {found.dispatched} workers, the most one task may "
            f"(PETAL_MAX_DISPATCH_PER_TASK={limits.max_per_task}): finish with what they report")
    return None


def project_refusal(caller: Caller, named: uuid.UUID | None) -> str | None:
    """Why `named` cannot be a worker's project (None: it is the caller's own, or not named). Said the same
    whether or not such a project exists."""
    if named is None or named == caller.project_id:
        return None
    if caller.project_id is None:
        return ("this thread has no project: its workers run without one; leave project_id out "
                "(a project's work is done from that project's own thread)")
    return (f"a worker runs in its caller's project, {caller.project_id}; project_id may only repeat it "
            "(leave it out)")


def project_visible(caller: Caller, project_id: uuid.UUID) -> bool:
    return caller.project_id is not None and project_id == caller.project_id


async def readable(store: HarnessStore, caller: Caller, scope: uuid.UUID) -> bool:
    """Whether `scope` names the caller's project, or a task or conversation of its tree or of its project
    (its own ids and project are answered without the store)."""
    if scope in (caller.task_id, caller.session_id, caller.thread_id) or project_visible(caller, scope):
        return True
    return await store.may_read(caller.task_id, caller.project_id, scope)
