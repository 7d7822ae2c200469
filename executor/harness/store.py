"""The harness's store (executor/sql/harness.sql): where a caller's task sits among the dispatches, what it
may read, and a routine's run's cap on its workers. The one module of this room that names these queries; rows
come back as frozen dataclasses."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared.query import FromRow, Queries, Transaction


@dataclass(frozen=True, slots=True)
class Lineage(FromRow):
    """Where the caller's task sits among the dispatches (the query `get_caller_lineage`): `depth` dispatches
    above it (0: a turn), the thread its lineage's root speaks in, how many workers it asked for itself."""

    depth: int
    thread_id: uuid.UUID | None
    dispatched: int


@dataclass(frozen=True, slots=True)
class WorkersFull(FromRow):
    """A routine's run whose routine's `max_workers` workers are going already (`check_routine_workers_full`)."""

    name: str
    max_workers: int


@dataclass(frozen=True)
class _Readable(FromRow):
    readable: bool


class HarnessStore:
    def __init__(self, run: Queries | Transaction):
        self.run = run

    @classmethod
    def over(cls, pool: AsyncConnectionPool) -> HarnessStore:
        return cls(Queries(pool, queries))

    def pooled(self) -> Queries:
        """The named queries over the pool this store runs on."""
        assert isinstance(self.run, Queries), "a store over the pool"
        return self.run

    async def lineage(self, task_id: uuid.UUID) -> Lineage:
        found = await self.run.one("get_caller_lineage", {"task_id": task_id}, into=Lineage)
        # the credential resolved a moment ago, so its task row is there; none reads as a turn's
        return found or Lineage(depth=0, thread_id=None, dispatched=0)

    async def may_read(self, task_id: uuid.UUID, project_id: uuid.UUID | None, scope: uuid.UUID) -> bool:
        """Whether `scope` is a task or conversation of the caller's tree, or of its project."""
        return await self.run.one("check_caller_may_read", {"task_id": task_id, "project": project_id,
                                                            "scope": scope}, into=_Readable) is not None

    async def lock_routine_run(self, thread_id: uuid.UUID) -> None:
        """Lock the routine's run speaking in this thread (if any) to the end of this store's transaction: its
        workers are counted and inserted one dispatch at a time."""
        await self.run.execute("lock_routine_run_of_thread", {"thread_id": thread_id})

    async def routine_workers_full(self, thread_id: uuid.UUID) -> WorkersFull | None:
        """The routine whose run this thread is, when it has its max_workers workers going; else None."""
        return await self.run.one("check_routine_workers_full", {"thread_id": thread_id}, into=WorkersFull)
