"""The routines loop's reads and writes of routines, their runs, their threads and the quota windows, by name,
over `shared/query.py` (SQL in executor/sql/routines.sql). Rows come back as frozen dataclasses
(`shared.query.FromRow`): the columns their fields name."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared.query import FromRow, Queries, Transaction


@dataclass(frozen=True)
class Triggered(FromRow):
    """A run a verified trigger (run now, the fire token, a webhook) queued."""

    id: uuid.UUID
    routine_id: uuid.UUID
    trigger: str


@dataclass(frozen=True)
class DueRoutine(FromRow):
    """A routine whose next instant has come, locked for its scheduling."""

    id: uuid.UUID
    cron: str
    tz: str
    missed: str
    scheduled_through: datetime


@dataclass(frozen=True)
class Run(FromRow):
    """What every record of a run names."""

    id: uuid.UUID
    routine_id: uuid.UUID
    name: str
    trigger: str
    scheduled_at: datetime | None
    project_id: uuid.UUID | None


@dataclass(frozen=True)
class QueuedRun(Run):
    """A queued run claimed with its routine: what deciding to skip, fail or start it needs."""

    created_at: datetime
    event: dict[str, Any] | None
    mode: str
    prompt: str
    overlap: str
    overlapping: bool  # a run of the routine is running
    usd_per_run: Decimal | None
    usd_per_day: Decimal | None
    deleted_at: datetime | None


@dataclass(frozen=True)
class RunningRun(Run):
    """A running run claimed for its end."""

    thread_id: uuid.UUID
    task_id: uuid.UUID
    started_at: datetime
    runtime_s: int | None
    overran: bool  # stopped at its routine's runtime cap


@dataclass(frozen=True)
class RunOutcome(FromRow):
    """What a run's tasks came to."""

    last_status: str | None  # its last turn's
    last_reason: str | None
    budget_reason: str | None  # a process of the run not started for its USD per run
    cost_usd: float | None
    gate_denials: list[dict[str, Any]] | None


@dataclass(frozen=True)
class RoutineProject(FromRow):
    id: uuid.UUID
    name: str
    workdir: str | None
    plan: str | None


@dataclass(frozen=True)
class QuotaWindow(FromRow):
    kind: str
    status: str
    utilization: float | None
    resets_at: datetime | None


@dataclass(frozen=True)
class QuotaWait(FromRow):
    """The exhausted window of the account's quota that resets last."""

    kind: str
    resets_at: datetime


@dataclass(frozen=True)
class _Id(FromRow):
    id: uuid.UUID


@dataclass(frozen=True)
class _TaskId(FromRow):
    task_id: uuid.UUID


@dataclass(frozen=True)
class _At(FromRow):
    at: datetime | None


@dataclass(frozen=True)
class _Usd(FromRow):
    usd: float


@dataclass(frozen=True)
class _EndedAt(FromRow):
    ended_at: datetime


def over(pool: AsyncConnectionPool) -> Queries:
    """The executor's named queries over `pool`: what a unit of work of the loop opens on (`shared.work.work`),
    its routines' rows read through `RoutineRows(tx)`."""
    return Queries(pool, queries)


class RoutineRows:
    """routines.sql's queries on `run`: a caller's unit of work or transaction, or the pool's Queries."""

    def __init__(self, run: Queries | Transaction):
        self.run = run

    # ---- triggers and schedules ---------------------------------------------------------------------

    async def claim_triggers(self) -> list[Triggered]:
        return await self.run.all("claim_routine_triggers", into=Triggered)

    async def claim_due(self, now: datetime) -> DueRoutine | None:
        return await self.run.one("claim_due_routine", {"now": now}, into=DueRoutine)

    async def insert_scheduled_run(self, routine_id: uuid.UUID, instant: datetime, skipped: int) -> bool:
        """False when the instant already has its run (another executor made it)."""
        return await self.run.one("insert_scheduled_run", {
            "routine_id": routine_id, "scheduled_at": instant,
            "event": Jsonb({"scheduled_at": instant.isoformat(), "missed": skipped})}, into=_Id) is not None

    async def mark_scheduled(self, routine_id: uuid.UUID, through: datetime, next_fire_at: datetime) -> None:
        await self.run.execute("mark_routine_scheduled", {"id": routine_id, "through": through,
                                                          "next_fire_at": next_fire_at})

    async def next_fire(self) -> datetime | None:
        """The earliest instant any routine waits for."""
        found = await self.run.one("get_next_routine_fire", into=_At)
        return found.at if found else None

    # ---- the account's quota --------------------------------------------------------------------------

    async def record_quota_windows(self) -> list[QuotaWindow]:
        return await self.run.all("record_quota_windows", into=QuotaWindow)

    async def quota_wait(self, now: datetime) -> QuotaWait | None:
        return await self.run.one("get_quota_wait", {"now": now}, into=QuotaWait)

    async def mark_runs_waiting(self, reason: str) -> int:
        """Queued runs say why they wait; how many began to."""
        return len(await self.run.all("mark_runs_waiting", {"reason": reason}, into=_Id))

    # ---- starting a run -------------------------------------------------------------------------------

    async def claim_queued_run(self) -> QueuedRun | None:
        return await self.run.one("claim_queued_run", into=QueuedRun)

    async def spent_today(self, routine_id: uuid.UUID, since: datetime) -> float:
        found = await self.run.one("get_routine_spend_today", {"routine_id": routine_id, "since": since}, into=_Usd)
        return found.usd if found else 0.0

    async def project_spent_today(self, project_id: uuid.UUID, since: datetime) -> float:
        found = await self.run.one("get_project_routine_spend_today", {"project_id": project_id, "since": since},
                                   into=_Usd)
        return found.usd if found else 0.0

    async def project(self, project_id: uuid.UUID) -> RoutineProject | None:
        return await self.run.one("get_routine_project", {"id": project_id}, into=RoutineProject)

    async def mark_skipped(self, run_id: uuid.UUID, reason: str) -> None:
        await self.run.execute("mark_run_skipped", {"id": run_id, "reason": reason})

    async def mark_failed(self, run_id: uuid.UUID, reason: str) -> None:
        await self.run.execute("mark_run_failed", {"id": run_id, "reason": reason, "prompt": None})

    async def create_thread(self, thread_id: uuid.UUID, title: str, mode: str, project_id: uuid.UUID | None) -> None:
        await self.run.execute("create_routine_thread", {"id": thread_id, "title": title, "mode": mode,
                                                         "project_id": project_id})

    async def mark_started(self, run_id: uuid.UUID, prompt: str, thread_id: uuid.UUID, task_id: uuid.UUID) -> None:
        await self.run.execute("mark_run_started", {"id": run_id, "prompt": prompt, "thread_id": thread_id,
                                                    "task_id": task_id})

    # ---- a run's end ----------------------------------------------------------------------------------

    async def stop_overdue_runs(self, now: datetime) -> list[uuid.UUID]:
        """Ask every running task of a run past its runtime to stop, once; the tasks asked."""
        return [r.task_id for r in await self.run.all("stop_overdue_runs", {"now": now}, into=_TaskId)]

    async def ended_runs(self) -> list[uuid.UUID]:
        """Running runs whose work has all ended and been settled."""
        return [r.id for r in await self.run.all("list_ended_runs", into=_Id)]

    async def claim_running_run(self, run_id: uuid.UUID) -> RunningRun | None:
        """None when it is not running, or another executor is ending it."""
        return await self.run.one("claim_running_run", {"id": run_id}, into=RunningRun)

    async def outcome(self, thread_id: uuid.UUID) -> RunOutcome | None:
        return await self.run.one("get_run_outcome", {"thread_id": thread_id}, into=RunOutcome)

    async def mark_ended(self, run_id: uuid.UUID, status: str, reason: str | None, cost_usd: float | None,
                         gate_denials: list[dict[str, Any]]) -> datetime | None:
        found = await self.run.one("mark_run_ended", {"id": run_id, "status": status, "reason": reason,
                                                      "cost_usd": cost_usd, "gate_denials": Jsonb(gate_denials)},
                                   into=_EndedAt)
        return found.ended_at if found else None
