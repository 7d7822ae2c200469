"""A routine run's budget asks, by name (SQL in executor/sql/budgets.sql): the run at its cap, the ask's
escalation row, the raise, the ask resolved, and the unattended asks past their deadline closed.

Runs its queries on the settler's unit of work (or the pool's `Queries`), as `SettleStore` does."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Self

from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared.query import FromRow, Queries, Transaction


@dataclass(frozen=True)
class BudgetRun(FromRow):
    """A routine run at its cap: its routine's name, its USD per run, what the user raised it by, what it spent."""

    name: str
    usd_per_run: float
    usd_raised: float
    thread_id: uuid.UUID
    spent: float

    @property
    def cap(self) -> float:
        return self.usd_per_run + self.usd_raised


@dataclass(frozen=True)
class _Raised(FromRow):
    usd_raised: float


class BudgetStore:
    def __init__(self, run: Queries | Transaction):
        self.run = run

    @classmethod
    def over(cls, pool: AsyncConnectionPool) -> Self:
        """On the pool: each statement commits on its own."""
        return cls(Queries(pool, queries))

    async def run_at_cap(self, run_id: uuid.UUID) -> BudgetRun | None:
        return await self.run.one("get_budget_run", {"run_id": run_id}, into=BudgetRun)

    async def insert_ask(self, *, task_id: uuid.UUID, thread_id: uuid.UUID, question_id: uuid.UUID,
                         run_id: uuid.UUID, raise_usd: float, wait_s: float | None) -> None:
        """The ask's escalation row; `wait_s`: an unattended run's deadline from now (None: none)."""
        await self.run.execute("insert_budget_escalation", {
            "task_id": task_id, "thread_id": thread_id, "question_id": question_id, "run_id": run_id,
            "raise_usd": raise_usd, "wait_s": wait_s})

    async def raise_cap(self, run_id: uuid.UUID, usd: float) -> float:
        """Add `usd` to the run's cap; what it is raised by in all now."""
        found = await self.run.one("update_run_usd_raised", {"run_id": run_id, "usd": usd}, into=_Raised)
        assert found is not None  # the run of an open ask exists
        return found.usd_raised

    async def resolve(self, escalation_id: uuid.UUID, decision: str, reason: str | None) -> None:
        await self.run.execute("resolve_budget_escalation", {"id": escalation_id, "decision": decision,
                                                             "reason": reason})

    async def close_expired(self, response: str) -> int:
        """Close the questions of unattended asks past their deadline; how many."""
        return len(await self.run.all("close_expired_budget_questions", {"response": response}))
