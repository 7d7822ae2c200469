"""The threads loop's reads and writes, by name (SQL in executor/sql/threads.sql): thread controls, the chat
queue and its turn boundaries, archived threads, attachments' retention.

A `ThreadStore` runs its queries on what it is given: the pool's `Queries` (each statement on its own) or a
unit of work (shared/work.py), whose records commit with its rows. Rows come back as frozen dataclasses
(shared.query.FromRow).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Self

from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared.query import FromRow, Queries, Transaction
from shared.work import Work, work


@dataclass(frozen=True)
class ThreadControl(FromRow):
    """A claimed thread control: create, rename, set_mode, archive or retry, with its arguments."""

    id: uuid.UUID
    thread_id: uuid.UUID
    action: str
    args: dict[str, Any] | None


@dataclass(frozen=True)
class PendingThread(FromRow):
    """A thread with chat waiting, and what its delivery depends on (`list_threads_with_pending_chat`)."""

    thread_id: uuid.UUID
    found: bool  # false: no such thread (yet)
    lifecycle: str | None
    project_id: uuid.UUID | None
    executor_name: str | None  # the executor its turns are pinned to
    adopted: bool  # it continues a stored conversation of the CLI's
    turn_open: bool
    controls_pending: bool
    blocked_question: uuid.UUID | None  # a question its running turn waits on (a message answers it)
    terminal_executor: str | None  # the executor holding the thread's live terminal session (migration 0047)


@dataclass(frozen=True)
class ChatMessage(FromRow):
    """A chat message taken for delivery, with what the journal keeps of its files."""

    id: uuid.UUID
    text: str
    origin: str  # user, or harness (a note to the orchestrator)
    attachment_ids: list[uuid.UUID] | None
    attachments: list[dict[str, Any]]


@dataclass(frozen=True)
class ThreadProject(FromRow):
    id: uuid.UUID
    name: str
    workdir: str | None
    plan: Any


@dataclass(frozen=True)
class ArchivedTurn(FromRow):
    id: uuid.UUID
    session_id: uuid.UUID


@dataclass(frozen=True)
class ClosedQuestion(FromRow):
    """A pending question its thread's archiving closed; `asker_running`: a live tool call journals the close."""

    id: uuid.UUID
    tool_use_id: str
    thread_id: uuid.UUID
    task_id: uuid.UUID | None
    asker_running: bool


@dataclass(frozen=True)
class PurgedAttachment(FromRow):
    id: uuid.UUID
    name: str
    media_type: str
    size_bytes: int
    sha256: str
    chat_message_id: uuid.UUID | None


@dataclass(frozen=True)
class _Id(FromRow):
    id: uuid.UUID


@dataclass(frozen=True)
class _TaskId(FromRow):
    task_id: uuid.UUID


@dataclass(frozen=True)
class _Mode(FromRow):
    mode: str


class ThreadStore:
    """threads.sql's queries on `run`: the pool's Queries, or a unit of work."""

    def __init__(self, run: Queries | Transaction):
        self.run = run

    @classmethod
    def over(cls, pool: AsyncConnectionPool) -> Self:
        """On the pool: each statement commits on its own."""
        return cls(Queries(pool, queries))

    @asynccontextmanager
    async def work(self, *, pipelined: bool = False) -> AsyncIterator[tuple[Self, Work]]:
        """A unit of work on this store's pool (`pipelined`: shared.query's): the store inside it, and the
        unit (what is emitted into it is journaled with its rows)."""
        assert isinstance(self.run, Queries), "already inside a transaction"
        async with work(self.run, pipelined=pipelined) as unit:
            yield type(self)(unit), unit

    # ---- threads and their controls --------------------------------------------------------------------

    async def mode(self, thread_id: uuid.UUID) -> str | None:
        """A thread's mode (interactive, autonomous); None when there is no such thread."""
        found = await self.run.one("get_thread_mode", {"id": thread_id}, into=_Mode)
        return found.mode if found else None

    async def project(self, thread_id: uuid.UUID) -> ThreadProject | None:
        return await self.run.one("get_thread_project", {"id": thread_id}, into=ThreadProject)

    async def claim_controls(self, executor: str | None) -> list[ThreadControl]:
        """Pending thread controls this executor may apply (a thread made from a stored conversation: only the
        executor that holds its file), a Retry only once its thread has no turn open."""
        return await self.run.all("claim_thread_controls", {"executor": executor}, into=ThreadControl)

    async def finish_control(self, control_id: uuid.UUID, status: str, error: str | None) -> None:
        await self.run.execute("finish_thread_control", {"id": control_id, "status": status, "error": error})

    async def create(self, thread_id: uuid.UUID, *, title: str | None, mode: str, project_id: Any) -> bool:
        """A new thread; False when it exists already."""
        return await self.run.one("create_thread", {"id": thread_id, "title": title, "mode": mode,
                                                    "project_id": project_id}, into=_Id) is not None

    async def update(self, thread_id: uuid.UUID, *, title: str | None, mode: str | None, archive: bool) -> bool:
        """Rename, change the mode of or archive a thread; False when there is no such thread."""
        return await self.run.one("update_thread", {"id": thread_id, "title": title, "mode": mode,
                                                    "archive": archive}, into=_Id) is not None

    async def create_pending(self, thread_id: uuid.UUID) -> bool:
        """Whether a control that creates the thread is queued."""
        return await self.run.one("check_thread_create_pending", {"id": thread_id}) is not None

    # ---- chat delivery ---------------------------------------------------------------------------------

    async def threads_with_pending_chat(self, thread_id: uuid.UUID | None = None) -> list[PendingThread]:
        """The threads with chat waiting (only `thread_id`, when given)."""
        return await self.run.all("list_threads_with_pending_chat", {"id": thread_id}, into=PendingThread)

    async def take_chat(self, thread_id: uuid.UUID, limit: int, *, origin: str | None) -> list[ChatMessage]:
        """Take a thread's pending messages for delivery (`origin` None: every one, at a turn boundary; 'user':
        only the user's text, a reply that answers a question)."""
        return await self.run.all("take_pending_chat", {"thread_id": thread_id, "limit": limit, "origin": origin},
                                  into=ChatMessage)

    async def fail_chat(self, thread_id: uuid.UUID, error: str) -> None:
        await self.run.execute("fail_pending_chat", {"thread_id": thread_id, "error": error})

    async def answer_in_chat(self, question_id: uuid.UUID, text: str, chat_id: uuid.UUID) -> bool:
        """Answer a pending question with a chat message; False when it is no longer pending."""
        return await self.run.one("answer_in_chat", {"id": question_id, "text": text, "chat_id": chat_id},
                                  into=_Id) is not None

    async def lock_for_turn(self, thread_id: uuid.UUID) -> None:
        """The thread's row lock, to the unit's end: "no turn open → start one" is one step across executors."""
        await self.run.execute("lock_thread_for_turn", {"id": thread_id})

    # ---- archived threads and retention ----------------------------------------------------------------

    async def cancel_archived_turns(self) -> list[ArchivedTurn]:
        return await self.run.all("cancel_archived_turns", into=ArchivedTurn)

    async def stop_archived_turns(self) -> list[uuid.UUID]:
        return [r.task_id for r in await self.run.all("stop_archived_turns", into=_TaskId)]

    async def close_archived_questions(self, response: str) -> list[ClosedQuestion]:
        return await self.run.all("close_archived_questions", {"response": response}, into=ClosedQuestion)

    async def delete_purgeable_attachments(self, older_than_s: float) -> list[PurgedAttachment]:
        return await self.run.all("delete_purgeable_attachments", {"older_than_s": older_than_s},
                                  into=PurgedAttachment)
