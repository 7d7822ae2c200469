"""Standing gate rules and what the permission path reads of a task, by name (SQL in executor/sql/gates.sql).

A `GateStore` runs its queries on the pool's `Queries` (each statement on its own) or a caller's
transaction. Rows come back as frozen dataclasses (shared.query.FromRow).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Self

from psycopg_pool import AsyncConnectionPool

from executor.gates.decide import Decision
from executor.sql import queries
from shared.query import FromRow, Queries, Transaction
from shared.work import Work, work


@dataclass(frozen=True)
class GateWorkdir(FromRow):
    """Where a task's process was started, as its spawn journaled it, and the task row's own directory."""

    spawned_in: str | None
    workdir: str | None


@dataclass(frozen=True)
class GateRule(FromRow):
    id: uuid.UUID
    scope: str
    tool_name: str
    pattern: str
    decision: Decision
    category: str | None


@dataclass(frozen=True)
class NewRule:
    """A standing rule to insert: who it covers (`scope` and the matching id), the calls and the decision."""

    scope: str
    tool_name: str
    pattern: str
    decision: str
    created_by: str | None
    category: str | None = None
    session_id: uuid.UUID | None = None
    project_id: uuid.UUID | None = None
    task_id: uuid.UUID | None = None


@dataclass(frozen=True)
class RuleRequest(FromRow):
    """A standing rule asked for from the page or the API (`gate_rule_queue`)."""

    id: uuid.UUID
    scope: str
    thread_id: uuid.UUID | None
    project_id: uuid.UUID | None
    tool_name: str
    pattern: str
    requested_by: str | None


@dataclass(frozen=True)
class OrphanedCard(FromRow):
    """An approval card a killed executor left open: its question row and the task it was for."""

    id: uuid.UUID
    tool_use_id: str
    task_id: uuid.UUID
    session_id: uuid.UUID | None
    project_id: uuid.UUID | None
    questions: list[Any] | None


@dataclass(frozen=True)
class _Id(FromRow):
    id: uuid.UUID


@dataclass(frozen=True)
class _Mode(FromRow):
    mode: str


@dataclass(frozen=True)
class _Found(FromRow):
    found: bool | None



class GateStore:
    """gates.sql's queries on `run`: the pool's Queries, or a caller's transaction."""

    def __init__(self, run: Queries | Transaction):
        self.run = run

    @classmethod
    def over(cls, pool: AsyncConnectionPool) -> Self:
        """On the pool: each statement commits on its own."""
        return cls(Queries(pool, queries))

    @asynccontextmanager
    async def work(self) -> AsyncIterator[tuple[Self, Work]]:
        """A unit of work on this store's pool: the store inside it, and the unit (what is emitted into it is
        journaled with its rows)."""
        assert isinstance(self.run, Queries), "already inside a transaction"
        async with work(self.run) as unit:
            yield type(self)(unit), unit

    # ---- the permission path ---------------------------------------------------------------------------

    async def workdir(self, task_id: uuid.UUID) -> GateWorkdir | None:
        return await self.run.one("get_gate_workdir", {"task_id": task_id}, into=GateWorkdir)

    async def thread_mode(self, thread_id: uuid.UUID | None) -> str | None:
        found = await self.run.one("get_gate_thread_mode", {"thread_id": thread_id}, into=_Mode)
        return found.mode if found else None

    async def live_rules(self, tool_name: str, *, task_id: uuid.UUID, thread_id: uuid.UUID | None,
                         project_id: uuid.UUID | None) -> list[GateRule]:
        """The standing rules that may cover a call of this task (its own, its thread's, its project's), newest
        first."""
        return await self.run.all("list_live_gate_rules", {"tool_name": tool_name, "task_id": task_id,
                                                           "thread_id": thread_id, "project_id": project_id},
                                  into=GateRule)

    async def insert_rule(self, rule: NewRule) -> uuid.UUID:
        found = await self.run.one("insert_gate_rule", {
            "scope": rule.scope, "session_id": rule.session_id, "project_id": rule.project_id,
            "task_id": rule.task_id, "tool_name": rule.tool_name, "pattern": rule.pattern,
            "decision": rule.decision, "category": rule.category, "created_by": rule.created_by}, into=_Id)
        assert found is not None  # INSERT … RETURNING gives its row
        return found.id

    # ---- the standing-rules queue ----------------------------------------------------------------------

    async def claim_rule_requests(self) -> list[RuleRequest]:
        return await self.run.all("claim_gate_rule_requests", into=RuleRequest)

    async def rule_scope_exists(self, req: RuleRequest) -> bool:
        """Whether the thread or project a request names exists."""
        found = await self.run.one("get_gate_rule_scope", {"scope": req.scope, "thread_id": req.thread_id,
                                                           "project_id": req.project_id}, into=_Found)
        return bool(found and found.found)

    async def finish_rule_request(self, request_id: uuid.UUID, *, status: str, rule_id: uuid.UUID | None,
                                  error: str | None) -> None:
        await self.run.execute("finish_gate_rule_request", {"id": request_id, "status": status, "rule_id": rule_id,
                                                            "error": error})

    async def requeue_rule_requests(self) -> None:
        """After a restart: the requests a dead executor claimed are taken again."""
        await self.run.execute("requeue_gate_rule_requests")

    async def orphaned_cards(self, card_prefix: str) -> list[OrphanedCard]:
        return await self.run.all("list_orphaned_gate_cards", {"card_prefix": card_prefix + "%"}, into=OrphanedCard)
