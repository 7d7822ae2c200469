"""The reads and writes of tasks, sessions, stop requests and credentials, by name (executor/sql/tasks.sql):
the supervisor's (`TaskStore`, on the pool), and those run inside a caller's unit of work too (`TaskRows`).
Rows come back as frozen dataclasses (executor/run/task_rows.py; the one-column ones here)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from psycopg_pool import AsyncConnectionPool

from executor.run.task_rows import (AttachmentFile, ClaimedTask, ClosedQuestion, OrphanedTask, Parked, Requeued,
                                     RoleProfile, StopRequest, TaskEnd, Template)
from executor.run.user_input import Attachment
from executor.sql import queries
from shared.query import FromRow, Queries, Transaction
from shared.sql import queries as shared_queries

T = TypeVar("T")


@dataclass(frozen=True)
class _Id(FromRow):
    id: uuid.UUID


@dataclass(frozen=True)
class _TaskId(FromRow):
    task_id: uuid.UUID


@dataclass(frozen=True)
class _Status(FromRow):
    status: str


@dataclass(frozen=True)
class _Denied(FromRow):
    denied: int


@dataclass(frozen=True)
class _CheckCommand(FromRow):
    check_command: str


@dataclass(frozen=True)
class _SandboxAllow(FromRow):
    sandbox_allow: list[str]


@dataclass(frozen=True)
class _EventId(FromRow):
    event_id: uuid.UUID


@dataclass(frozen=True)
class _ToolUse(FromRow):
    tool_use_id: str | None


class TaskRows:
    """tasks.sql's queries on a caller's unit of work (a task's files, its caller, lineage, an import) or the
    pool's."""

    def __init__(self, run: Queries | Transaction):
        self.run = run

    async def attachment_files(self, task_id: uuid.UUID) -> list[AttachmentFile]:
        return await self.run.all("list_task_attachment_files", {"task_id": task_id}, into=AttachmentFile)

    async def harness_caller(self, token_sha256: bytes, into: Callable[..., T]) -> T | None:
        """Who holds a harness credential, as `into` (the harness's row of it); None for an unknown one."""
        return await self.run.one("get_harness_caller", {"token_sha256": token_sha256}, into=into)

    async def dispatch_tool_use(self, task_id: uuid.UUID) -> str | None:
        """The tool_use_id a task's dispatch recorded (None: not dispatched by a tool call, or no record)."""
        found = await self.run.one("get_dispatch_tool_use", {"id": task_id}, into=_ToolUse)
        return found.tool_use_id if found else None

    async def dispatching_call(self, task_id: uuid.UUID) -> uuid.UUID | None:
        """The orchestrator's journaled line holding the tool call that dispatched the task."""
        found = await self.run.one("get_dispatching_call", {"id": task_id}, into=_EventId)
        return found.event_id if found else None

    async def exit_event(self, task_id: uuid.UUID) -> uuid.UUID | None:
        found = await self.run.one("get_task_exit_event", {"id": task_id}, into=_EventId)
        return found.event_id if found else None

    async def insert_imported(self, *, task_id: uuid.UUID, session_id: uuid.UUID, project_id: uuid.UUID | None,
                              role: str, brief: str, status: str, reason: str,
                              substrate_session_id: str | None) -> None:
        """An ended task and its session, as an import records them (settled: nothing is owed on it)."""
        await self.run.execute("insert_session", {"id": session_id, "project_id": project_id, "role": role,
                                                  "lifecycle": "imported"})
        await self.run.execute("update_session", {"id": session_id, "lifecycle": "imported",
                                                  "substrate_session_id": substrate_session_id})
        await self.run.execute("insert_imported_task", {
            "id": task_id, "project_id": project_id, "session_id": session_id, "role": role, "brief": brief,
            "status": status, "reason": reason})


class TaskStore:
    def __init__(self, pool: AsyncConnectionPool):
        self.pool = pool  # for the helpers that still take a pool (projects, lineage, worktrees)
        self.q = Queries(pool, queries)
        self.shared = Queries(pool, shared_queries)  # the queries both services run
        self.rows = TaskRows(self.q)  # what runs in a caller's unit of work too, here each on its own

    # ---- claiming ------------------------------------------------------------------------------------

    async def claim_tasks(self, n: int, *, n_unattended: int, name: str, epoch: int | None, labels: list[str],
                          shared_config: bool) -> list[ClaimedTask]:
        """Up to `n` claimable tasks, chat turns first, at most `n_unattended` of them not chat."""
        return await self.q.all("claim_pending_tasks", {
            "n": n, "n_unattended": n_unattended, "name": name, "epoch": epoch, "labels": labels,
            "shared_config": shared_config}, into=ClaimedTask)

    async def mark_waiting_for_slot(self, *, chat_too: bool, name: str, labels: list[str],
                                    shared_config: bool) -> int:
        """The tasks claimable here that wait for a slot say so (activity `waiting_for_slot`); how many began to."""
        return len(await self.q.all("mark_waiting_for_slot", {
            "chat_too": chat_too, "name": name, "labels": labels, "shared_config": shared_config}, into=_Id))

    async def claim_stops(self, name: str) -> list[StopRequest]:
        return await self.q.all("claim_stop_requests", {"name": name}, into=StopRequest)

    async def finish_stop(self, stop_id: uuid.UUID, status: str, error: str | None) -> None:
        await self.q.execute("finish_stop_request", {"id": stop_id, "status": status, "error": error})

    async def task_status(self, task_id: uuid.UUID) -> str | None:
        found = await self.shared.one("get_task_status", {"id": task_id}, into=_Status)
        return found.status if found else None

    async def cancel_pending(self, task_id: uuid.UUID, reason: str) -> bool:
        """Cancel a task not started yet; False when it is no longer pending."""
        return await self.q.one("cancel_pending_task", {"id": task_id, "reason": reason}, into=_Id) is not None

    # ---- spawning ------------------------------------------------------------------------------------

    async def project_sandbox_allow(self, project_id: uuid.UUID | None) -> list[str]:
        """What a project adds to its workers' sandbox allowlist (none for a task outside a project)."""
        if project_id is None:
            return []
        found = await self.q.one("get_project_sandbox_allow", {"project_id": project_id}, into=_SandboxAllow)
        return list(found.sandbox_allow) if found else []

    async def check_command(self, task_id: uuid.UUID) -> str | None:
        """The command a project worker's end is checked with (its project's), or None."""
        found = await self.q.one("get_task_check", {"id": task_id}, into=_CheckCommand)
        return found.check_command if found else None

    async def role_profile(self, role: str) -> RoleProfile:
        found = await self.q.one("get_role_profile", {"role": role}, into=RoleProfile)
        return found or RoleProfile(role=role, system_prompt="", allowed_tools=[], use_mcp=False)

    async def attachments(self, ids: Sequence[uuid.UUID]) -> list[Attachment]:
        """The files a task is fed with its brief (a turn's messages carried them), in their order."""
        return await self.q.all("list_task_attachments", {"ids": list(ids)}, into=Attachment)

    async def open_session(self, session_id: uuid.UUID, *, project_id: uuid.UUID | None, role: str,
                           executor: str) -> None:
        """The session a run speaks in: running, one more turn, pinned to its first turn's executor."""
        await self.q.execute("upsert_running_session", {"id": session_id, "project_id": project_id, "role": role,
                                                        "name": executor})

    async def grant_budget(self, task_id: uuid.UUID) -> dict[str, Any] | None:
        """A routine run's task: what it may spend (the run's cap less its ended processes' cost), written to
        the task; None when the task is no routine run's."""
        return await self.q.one("grant_run_budget", {"task_id": task_id})

    async def session_cli(self, session_id: uuid.UUID) -> dict[str, Any] | None:
        """The CLI conversation a thread's turns continue, when it was adopted (its directory, config, fork)."""
        return await self.q.one("get_session_cli", {"id": session_id})

    async def mark_session_cli(self, session_id: uuid.UUID, cli_session: str, workdir: Path, command: str) -> None:
        await self.q.execute("mark_session_cli", {"id": session_id, "cli_session_id": cli_session,
                                                  "cli_workdir": str(workdir), "resume_command": command})

    async def end_session(self, session_id: uuid.UUID, lifecycle: str, substrate_session_id: str | None) -> None:
        await self.q.execute("update_session", {"id": session_id, "lifecycle": lifecycle,
                                                "substrate_session_id": substrate_session_id})

    async def grant_credential(self, token_sha256: bytes, task_id: uuid.UUID, session_id: uuid.UUID) -> None:
        await self.q.execute("grant_harness_credential", {"token_sha256": token_sha256, "task_id": task_id,
                                                          "session_id": session_id})

    async def warm_candidates(self, offered: list[uuid.UUID], presence_s: float, n: int, *,
                              name: str) -> list[Template]:
        """Threads whose next turn may be started ahead of its message."""
        return await self.q.all("list_warm_candidates", {"offered": offered, "presence_s": presence_s,
                                                         "n": n + len(offered), "name": name}, into=Template)

    async def revoke_credential(self, task_id: uuid.UUID) -> None:
        await self.q.execute("revoke_harness_credential", {"task_id": task_id})

    # ---- running -------------------------------------------------------------------------------------

    async def set_process(self, task_id: uuid.UUID, pid: int, session_id: uuid.UUID) -> None:
        await self.q.execute("set_task_process", {"id": task_id, "pid": pid, "session_id": session_id})

    async def save_activity(self, task_id: uuid.UUID, activity: str) -> None:
        """The one writer of `tasks.activity` (running, awaiting_user, stalled), as the task's row shows it."""
        await self.q.execute("set_task_activity", {"id": task_id, "activity": activity})

    async def touch_output(self, task_ids: list[uuid.UUID], ats: list[datetime]) -> None:
        await self.q.execute("touch_tasks_output", {"ids": task_ids, "ats": ats})

    async def asking_tasks(self, task_ids: list[uuid.UUID]) -> set[uuid.UUID]:
        """Which of these tasks wait on a pending question of theirs."""
        return {r.task_id for r in await self.q.all("list_tasks_with_pending_questions", {"ids": task_ids},
                                                    into=_TaskId)}

    async def parked_tasks(self, task_ids: list[uuid.UUID]) -> list[Parked]:
        """Which of these running tasks are parked on the user, oldest question first."""
        return await self.q.all("list_parked_tasks", {"ids": task_ids}, into=Parked)

    async def release_parked_questions(self, task_id: uuid.UUID) -> list[uuid.UUID]:
        """A parked task's pending questions marked late: they outlive its process (answered, to its thread)."""
        return [r.id for r in await self.q.all("release_parked_questions", {"task_id": task_id}, into=_Id)]

    async def mark_stop_requested(self, task_id: uuid.UUID) -> None:
        await self.q.execute("mark_stop_requested", {"id": task_id})

    async def gate_denials(self, task_id: uuid.UUID) -> int:
        found = await self.q.one("list_task_gate_denials", {"id": task_id}, into=_Denied)
        return found.denied if found else 0

    async def finish(self, task_id: uuid.UUID, end: TaskEnd, *, name: str, epoch: int | None) -> bool:
        """The final status, fenced by this run's claim: False when a survivor took the task over."""
        return await self.q.one("finish_task", {
            "id": task_id, "status": end.status, "reason": end.reason, "exit_code": end.exit_code,
            "exit_signal": end.exit_signal, "last_output_at": end.last_output_at, "name": name, "epoch": epoch},
            into=_Id) is not None

    # ---- reconciliation ------------------------------------------------------------------------------

    async def orphaned_tasks(self, name: str) -> list[OrphanedTask]:
        return await self.q.all("list_orphaned_running_tasks", {"name": name}, into=OrphanedTask)

    async def crash(self, task_id: uuid.UUID, reason: str) -> None:
        await self.q.execute("crash_task", {"id": task_id, "reason": reason})

    async def requeue_claimed(self, name: str, stale_s: float) -> Requeued:
        found = await self.q.one("requeue_claimed", {"name": name, "stale_s": stale_s}, into=Requeued)
        assert found is not None  # an aggregate: always one row
        return found

    async def cancel_orphaned_questions(self) -> list[ClosedQuestion]:
        return await self.q.all("cancel_orphaned_questions", into=ClosedQuestion)
