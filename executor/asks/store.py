"""The Asks panel's questions, by name (SQL in executor/sql/asks.sql): put up, joined, answered, closed.

An `AskStore` runs its queries on what it is given: the pool's `Queries`, or a caller's transaction (a
unit of work that records a question with its own rows). Rows come back as frozen dataclasses
(shared.query.FromRow).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared.query import FromRow, Queries, Transaction
from shared.work import Work, work


@dataclass(frozen=True)
class Question(FromRow):
    """How a question stands (`get_question`): a notification of its close carries the same fields."""

    id: uuid.UUID
    status: str
    answers: dict[str, Any] | None
    response: str | None
    answered_via: str | None
    answered_by: str | None


@dataclass(frozen=True)
class Taken(FromRow):
    """A row the same questions already have, taken over by a new call (`take_asked_question`)."""

    id: uuid.UUID
    tool_use_id: str
    status: str


@dataclass(frozen=True)
class Repeat(Question):
    """The thread's same question, pending or answered within the window (`get_thread_repeat`)."""

    tool_use_id: str
    timed_out_at: datetime | None


@dataclass(frozen=True)
class Receipt:
    """An approval acted on: what its card approved (`approved_sha256`; None for a card asked before
    receipts) against what was about to run (`checked_sha256`); `matched` says whether it may run."""

    kind: str  # gate | dispatch
    question_id: uuid.UUID
    task_id: uuid.UUID
    thread_id: uuid.UUID | None
    subject: str
    answer: str | None
    answered_by: str | None
    approved_sha256: str | None
    checked_sha256: str
    tool_use_id: str | None = None

    @property
    def matched(self) -> bool:
        # a card from before receipts binds nothing, so it cannot mismatch (it is recorded as unbound: NULL)
        return self.approved_sha256 is None or self.approved_sha256 == self.checked_sha256


@dataclass(frozen=True)
class _Sha(FromRow):
    sha256: str | None


@dataclass(frozen=True)
class _Id(FromRow):
    id: uuid.UUID


class AskStore:
    """asks.sql's queries on `run`: the pool's Queries, or a caller's transaction."""

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

    async def insert(self, questions: list[dict[str, Any]], *, tool_use_id: str, session_id: uuid.UUID | None,
                     task_id: uuid.UUID | None, asked_by: str) -> uuid.UUID | None:
        """A new pending question; None when `tool_use_id` was asked already."""
        found = await self.run.one("insert_question", {"tool_use_id": tool_use_id, "session_id": session_id,
                                                       "task_id": task_id, "questions": Jsonb(questions),
                                                       "asked_by": asked_by}, into=_Id)
        return found.id if found else None

    async def by_tool_use_id(self, tool_use_id: str, task_id: uuid.UUID | None,
                             session_id: uuid.UUID | None) -> uuid.UUID | None:
        """The question asked under this tool call's id by this task or in this thread (never another's)."""
        found = await self.run.one("get_question_by_tool_use_id", {"tool_use_id": tool_use_id, "task_id": task_id,
                                                                   "session_id": session_id}, into=_Id)
        return found.id if found else None

    async def get(self, question_id: uuid.UUID) -> Question | None:
        return await self.run.one("get_question", {"id": question_id}, into=Question)

    async def approved_sha256(self, question_id: uuid.UUID) -> str | None:
        found = await self.run.one("get_question_receipt", {"id": question_id}, into=_Sha)
        return found.sha256 if found else None

    async def insert_receipt(self, receipt: Receipt) -> uuid.UUID:
        found = await self.run.one("insert_approval_receipt", {
            "kind": receipt.kind, "question_id": receipt.question_id, "task_id": receipt.task_id,
            "thread_id": receipt.thread_id, "tool_use_id": receipt.tool_use_id, "subject": receipt.subject[:500],
            "answer": receipt.answer, "answered_by": receipt.answered_by,
            "approved_sha256": receipt.approved_sha256, "checked_sha256": receipt.checked_sha256,
            "matched": receipt.matched}, into=_Id)
        assert found is not None
        return found.id

    async def take_asked(self, questions: list[dict[str, Any]], *, asked_by: str, session_id: uuid.UUID | None,
                         task_id: uuid.UUID | None) -> Taken | None:
        return await self.run.one("take_asked_question", {"questions": Jsonb(questions), "asked_by": asked_by,
                                                          "session_id": session_id, "task_id": task_id}, into=Taken)

    async def close(self, question_id: uuid.UUID, response: str) -> bool:
        """Cancel a pending question with `response`; False when it was not pending."""
        return await self.run.one("close_question", {"id": question_id, "response": response}, into=_Id) is not None

    async def close_abandoned(self, question_id: uuid.UUID, response: str) -> bool:
        return await self.run.one("close_abandoned_question", {"id": question_id, "response": response},
                                  into=_Id) is not None

    async def mark_timed_out(self, question_id: uuid.UUID) -> bool:
        return await self.run.one("mark_question_timed_out", {"id": question_id}, into=_Id) is not None

    async def lock_thread(self, thread_id: uuid.UUID) -> None:
        """Hold the thread's questions lock to the transaction's end (one asker at a time)."""
        await self.run.one("lock_thread_questions", {"thread_id": thread_id})

    async def thread_repeat(self, thread_id: uuid.UUID, questions: list[dict[str, Any]], *, asked_by: str,
                            window_s: float) -> Repeat | None:
        return await self.run.one("get_thread_repeat", {"thread_id": thread_id, "questions": Jsonb(questions),
                                                        "asked_by": asked_by, "window_s": window_s}, into=Repeat)

    async def take_late(self, question_id: uuid.UUID, task_id: uuid.UUID | None) -> None:
        await self.run.one("take_late_question", {"id": question_id, "task_id": task_id})
