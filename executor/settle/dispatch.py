"""Requesting work: a pending task row and its `task.dispatch_requested` event, committed together.

The supervisor is woken by the row's NOTIFY and spawns it; whoever asks (the harness MCP's
dispatch_worker, a test, the orchestrator loop) never spawns a process itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared import errors, journal
from shared.models import NewEvent
from shared.query import Queries, Transaction


class DispatchRefused(errors.PetalError):
    """The request cannot be run as given; nothing was recorded."""


async def request_task(
    pool: AsyncConnectionPool,
    *,
    brief: str,
    role: str = "worker",
    project_id: uuid.UUID | None = None,
    session_id: uuid.UUID | None = None,
    parent_task_id: uuid.UUID | None = None,
    plan_ref: str | None = None,
    workdir: Path | None = None,
    allowed_tools: Sequence[str] | None = None,
    requested_by: str | None = None,
    json_schema: dict[str, Any] | None = None,
    tool_use_id: str | None = None,
    executor: str | None = None,
    labels: Sequence[str] = (),
) -> uuid.UUID:
    """Record a task for the supervisor to run; returns its id. `executor` names the executor that must
    run it, `labels` those its executor must carry.

    Raises:
        DispatchRefused: empty brief, unknown project, or a working directory that does not exist.
    """
    async with Queries(pool, queries).transaction() as tx:
        task_id, events = await request_on(
            tx.conn, brief=brief, role=role, project_id=project_id, session_id=session_id,
            parent_task_id=parent_task_id, plan_ref=plan_ref, workdir=workdir, allowed_tools=allowed_tools,
            requested_by=requested_by, json_schema=json_schema, tool_use_id=tool_use_id,
            executor=executor, labels=labels)
        await journal.append_on(tx.conn, events)
    return task_id


async def request_on(
    conn: AsyncConnection[Any],
    *,
    brief: str,
    role: str = "worker",
    project_id: uuid.UUID | None = None,
    session_id: uuid.UUID | None = None,
    parent_task_id: uuid.UUID | None = None,
    plan_ref: str | None = None,
    workdir: Path | None = None,
    allowed_tools: Sequence[str] | None = None,
    requested_by: str | None = None,
    json_schema: dict[str, Any] | None = None,
    tool_use_id: str | None = None,
    executor: str | None = None,
    labels: Sequence[str] = (),
) -> tuple[uuid.UUID, list[NewEvent]]:
    """`request_task` inside the caller's transaction; returns the task id and the events to journal.

    Raises:
        DispatchRefused: as `request_task`.
    """
    if not brief.strip():
        raise DispatchRefused("a task needs a non-empty brief")
    task_id = uuid.uuid4()
    tx = Transaction(conn, queries)
    if workdir is None and project_id is not None:
        row = await tx.one("get_project_workdir", {"project_id": project_id})
        if row is None:
            raise DispatchRefused(f"no project {project_id}")
        workdir = Path(row["workdir"]) if row["workdir"] else None
    if workdir is not None and not workdir.is_dir():
        raise DispatchRefused(f"working directory {workdir} does not exist")
    await tx.execute("insert_task", {
        "id": task_id, "project_id": project_id, "session_id": session_id, "parent_task_id": parent_task_id,
        "role": role, "brief": brief, "plan_ref": plan_ref, "workdir": str(workdir) if workdir else None,
        "allowed_tools": list(allowed_tools) if allowed_tools is not None else None,
        "json_schema": Jsonb(json_schema) if json_schema is not None else None})
    if executor is not None or labels:
        await tx.execute("set_task_placement", {"id": task_id, "executor": executor, "labels": list(labels)})
    return task_id, [NewEvent(
        "task.dispatch_requested",
        {"role": role, "brief": brief[:2000], "plan_ref": plan_ref, "workdir": str(workdir) if workdir else None,
         "requested_by": requested_by, "parent_task_id": str(parent_task_id) if parent_task_id else None,
         # the dispatching tool call: the spawned worker hangs under it in the journal's tree
         **({"tool_use_id": tool_use_id} if tool_use_id else {})},
        task_id=task_id, project_id=project_id)]
