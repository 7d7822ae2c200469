"""Read queries over projects, workers' changes and usage, for both services (the ingress's views)."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg_pool import AsyncConnectionPool

from shared import read_surface
from shared.query import Queries
from shared.sql import queries

USAGE_GROUPS = ("task", "thread", "project", "day")
HANDOFFS_PER_PLAN_TASK = 3
USAGE_FIELDS = ("runs", "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                "cost_usd")


async def list_projects(pool: AsyncConnectionPool) -> list[dict[str, Any]]:
    rows = await Queries(pool, queries).all("list_projects")
    for r in rows:
        r["plan_tasks"] = len(read_surface.plan_tasks(r.pop("plan")))
    return rows


async def requests(pool: AsyncConnectionPool, limit: int = 50) -> list[dict[str, Any]]:
    return await Queries(pool, queries).all("list_project_requests", {"limit": limit})


async def request(pool: AsyncConnectionPool, request_id: uuid.UUID) -> dict[str, Any] | None:
    return await Queries(pool, queries).one("get_project_request", {"id": request_id})


async def get_project(pool: AsyncConnectionPool, project_id: uuid.UUID) -> dict[str, Any] | None:
    """A project with each plan task's latest run, its handoffs (newest first), the branches waiting for
    review, the rollup and the usage."""
    q = Queries(pool, queries)
    project = await q.one("get_project_detail", {"id": project_id})
    if project is None:
        return None
    runs = {r["plan_ref"]: r for r in await q.all("list_project_plan_runs", {"id": project_id})}
    handoffs: dict[str, list[dict[str, Any]]] = {}
    for h in await q.all("list_project_plan_handoffs", {"id": project_id, "limit": 500}):
        kept = handoffs.setdefault(h["plan_ref"], [])
        if len(kept) < HANDOFFS_PER_PLAN_TASK:
            kept.append({"task_id": h["task_id"], "seq": h["seq"], "created_at": h["created_at"], **h["payload"]})
    plan = []
    for ref, title, checked in read_surface.plan_tasks(project["plan"]):
        plan.append({"ref": ref, "title": title, "checked": checked, "latest": runs.pop(ref, None),
                     "handoffs": handoffs.get(ref, [])})
    # runs under a plan_ref the plan does not list (the plan changed) stay visible too
    plan += [{"ref": ref, "title": None, "checked": False, "latest": run, "handoffs": handoffs.get(ref, [])}
             for ref, run in runs.items()]
    return {
        **project,
        "plan_tasks": plan,
        "state": await read_surface.get_project_state(pool, project_id),
        "branches_waiting": await q.all("list_project_branches_waiting", {"id": project_id}),
        "usage": await usage_total(pool, project_id=project_id),
    }


async def task_changes(pool: AsyncConnectionPool, task_id: uuid.UUID) -> dict[str, Any] | None:
    return await Queries(pool, queries).one("get_task_changes", {"id": task_id})


async def usage(pool: AsyncConnectionPool, by: str, *, task_id: uuid.UUID | None = None,
                thread_id: uuid.UUID | None = None, project_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
    """Tokens and cost summed from the runs' result lines, one row per task, thread, project or UTC day."""
    if by not in USAGE_GROUPS:
        raise ValueError(f"by is one of {', '.join(USAGE_GROUPS)}")
    params = {"by": by, "task_id": task_id, "thread_id": thread_id, "project_id": project_id}
    return await Queries(pool, queries).all("list_usage" if thread_id is None else "list_thread_usage", params)


def total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {f: sum(r[f] for r in rows) for f in USAGE_FIELDS}


async def usage_total(pool: AsyncConnectionPool, **scope: uuid.UUID | None) -> dict[str, Any]:
    return total(await usage(pool, "day", **scope))
