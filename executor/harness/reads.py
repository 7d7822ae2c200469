"""The read tools: handoffs, a project's state, and the rule-outs a candidate approach runs into.

Each reads only what its caller may (executor/harness/scope.py): its own thread's tasks and conversations,
and its own project. An id outside that answers exactly as an unknown id does.
"""

from __future__ import annotations

import uuid
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ConfigDict, Field

from executor.harness import scope as scopes
from executor.harness.results import Result
from executor.harness.services import Harness
from shared import read_surface

MAX_HANDOFFS = 50


class RuledOut(Result):
    approach: str
    reason: str = ""


class Handoff(Result):
    """One handoff: where it sits in the journal, and its contract fields (the contract may add more)."""

    model_config = ConfigDict(extra="allow")
    task_id: str | None = Field(description="the task it hands off from (None: a session's own)")
    seq: int = Field(description="its journal sequence number")
    created_at: str
    goal: str | None = None
    current_state: str | None = None
    next_step: str | None = None
    status: str | None = None
    ruled_out: list[RuledOut] | None = None
    artifacts: list[str] | None = None


class Handoffs(Result):
    handoffs: list[Handoff] = Field(description="newest first")


class ProjectRef(Result):
    id: str
    name: str


class Counts(Result):
    done: int
    in_flight: int
    failed: int
    blocked: int
    not_started: int


class ProjectState(Result):
    """Plan tasks by state; the lists may be cut to keep the rollup short (`truncated`), the counts never."""

    project: ProjectRef
    plan_tasks: int = Field(description="how many tasks the project's plan lists")
    counts: Counts
    done: list[str]
    in_flight: list[str]
    failed: list[str] = Field(description="plan refs, each with the status it ended in")
    blocked: list[str] = Field(description="waiting for the user, stalled, gated or skipped")
    not_started: list[str]
    truncated: bool | None = None


class Match(Result):
    approach: str
    reason: str
    overlap: float = Field(description="word overlap with the candidate, 0-1")


class RuleOutMatches(Result):
    matches: list[Match]


def _uuid(value: str, name: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ToolError(f"{name} must be a UUID, got {value!r}") from None


def _handoff(row: dict[str, Any]) -> Handoff:
    return Handoff.model_validate({"task_id": str(row["task_id"]) if row["task_id"] else None, "seq": row["seq"],
                                   "created_at": row["created_at"].isoformat(), **row["payload"]})


def register(server: MCPServer, harness: Harness) -> None:
    pool = harness.db.pool

    @server.tool(structured_output=True)
    async def get_handoffs(ctx: Context, scope_id: str, limit: int = 10) -> Handoffs:
        """The handoffs of a task, session or project, newest first (goal, state, next step, ruled out…).

        `scope_id` names a task or session of your own thread (its turns and the workers they dispatched,
        at any depth), or your thread's project or one of its tasks or sessions (a project's handoffs are
        shared by its threads). Any other id gets no handoffs, as an unknown one does.
        """
        caller = await harness.identities.caller(ctx, "get_handoffs")
        scope = _uuid(scope_id, "scope_id")
        if not await scopes.readable(harness.store, caller, scope):
            return Handoffs(handoffs=[])
        rows = await read_surface.get_handoffs(pool, scope, max(1, min(limit, MAX_HANDOFFS)))
        return Handoffs(handoffs=[_handoff(r) for r in rows])

    @server.tool(structured_output=True)
    async def get_project_state(ctx: Context, project_id: str) -> ProjectState:
        """A short rollup of a project's plan tasks: done, in flight, failed, blocked.

        Only your thread's own project: any other id is answered as an unknown project.
        """
        caller = await harness.identities.caller(ctx, "get_project_state")
        project = _uuid(project_id, "project_id")
        state = await read_surface.get_project_state(pool, project) if scopes.project_visible(caller, project) \
            else None
        if state is None:
            raise ToolError(f"no project {project_id} (a thread reads only its own project's state)")
        return ProjectState.model_validate(state)

    @server.tool(structured_output=True)
    async def check_ruled_out(ctx: Context, scope_id: str, candidate: str) -> RuleOutMatches:
        """Prior rule-outs in a scope that look like the candidate approach (check before dispatching).

        `scope_id` as for get_handoffs: a task or session of your own thread, or your thread's project or
        one of its tasks or sessions; any other id finds no matches, as an unknown one does.
        """
        caller = await harness.identities.caller(ctx, "check_ruled_out")
        scope = _uuid(scope_id, "scope_id")
        if not await scopes.readable(harness.store, caller, scope):
            return RuleOutMatches(matches=[])
        rows = await read_surface.check_ruled_out(pool, scope, candidate)
        return RuleOutMatches(matches=[Match(approach=r["approach"], reason=r["reason"],
                                             overlap=round(r["overlap"], 2)) for r in rows])
