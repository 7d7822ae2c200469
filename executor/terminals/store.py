"""The store of terminal sessions (executor/sql/terminals.sql): a session's thread, task and row, who holds
its screen, its end, and the page's messages it types.

The one module of this room that runs these queries. Rows come back as frozen dataclasses (shared.query.FromRow).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared.query import FromRow, Queries, Transaction
from shared.work import Work, work


@dataclass(frozen=True)
class NewTerminal:
    """What a terminal session's start writes: its thread (made, or the one already in its conversation), its
    task and its row."""

    task_id: uuid.UUID
    thread_id: uuid.UUID
    executor: str
    cli_session_id: str
    cwd: str
    config_dir: str
    title: str
    offset: int  # the conversation file's length at start
    resume_command: str
    sandboxed: bool
    held_by: str | None
    pid: int | None = None


@dataclass(frozen=True)
class TypedMessage(FromRow):
    id: uuid.UUID
    text: str


@dataclass(frozen=True)
class Orphan(FromRow):
    task_id: uuid.UUID
    thread_id: uuid.UUID


@dataclass(frozen=True)
class _Id(FromRow):
    id: uuid.UUID


@dataclass(frozen=True)
class _TaskId(FromRow):
    task_id: uuid.UUID


@dataclass(frozen=True)
class _Waiting(FromRow):
    waiting: int


@dataclass(frozen=True)
class _Threads(FromRow):
    threads: int


class TerminalStore:
    def __init__(self, q: Queries | Transaction):
        self.q = q

    @classmethod
    def over(cls, pool: AsyncConnectionPool) -> TerminalStore:
        return cls(Queries(pool, queries))

    @asynccontextmanager
    async def work(self) -> AsyncIterator[tuple[TerminalStore, Work]]:
        """A unit of work: this store inside it, and the unit (to `emit` the records that commit with it)."""
        assert isinstance(self.q, Queries), "a unit of work begins over the pool"
        async with work(self.q) as unit:
            yield TerminalStore(unit), unit

    async def conversation_thread(self, cli_session_id: str) -> uuid.UUID | None:
        found = await self.q.one("find_conversation_thread", {"cli_session_id": cli_session_id}, into=_Id)
        return found.id if found else None

    async def insert(self, t: NewTerminal, *, new_thread: bool) -> None:
        """The session's rows (its thread too when `new_thread`), in the caller's unit of work."""
        if new_thread:
            await self.q.one("insert_terminal_thread", {
                "id": t.thread_id, "title": t.title[:200], "executor": t.executor, "cli_session_id": t.cli_session_id,
                "config_dir": t.config_dir, "cwd": t.cwd, "offset": t.offset, "resume_command": t.resume_command},
                into=_Id)
        await self.q.execute("insert_terminal_task", {"id": t.task_id, "thread_id": t.thread_id,
                                                      "brief": f"interactive Claude Code in {t.cwd}"[:2000],
                                                      "executor": t.executor, "cwd": t.cwd, "pid": t.pid})
        await self.q.execute("insert_terminal_session", {
            "task_id": t.task_id, "thread_id": t.thread_id, "executor": t.executor,
            "cli_session_id": t.cli_session_id, "cwd": t.cwd, "sandboxed": t.sandboxed, "held_by": t.held_by})

    async def set_pid(self, task_id: uuid.UUID, pid: int) -> None:
        await self.q.execute("set_terminal_pid", {"id": task_id, "pid": pid})

    async def set_holder(self, task_id: uuid.UUID, held_by: str | None) -> None:
        await self.q.execute("set_terminal_holder", {"id": task_id, "held_by": held_by[:200] if held_by else None})

    async def set_input_waiting(self, task_id: uuid.UUID, waiting: bool) -> bool:
        """True when it changed."""
        return await self.q.one("set_terminal_input_waiting", {"id": task_id, "waiting": waiting},
                                into=_TaskId) is not None

    async def end(self, task_id: uuid.UUID, exit_code: int | None, status: str, reason: str) -> bool:
        return await self.q.one("end_terminal_session", {"id": task_id, "exit_code": exit_code, "status": status,
                                                         "reason": reason}, into=_Id) is not None

    async def end_orphans(self, executor: str) -> list[Orphan]:
        return await self.q.all("end_orphaned_terminal_sessions", {"executor": executor}, into=Orphan)

    async def take_message(self, thread_id: uuid.UUID) -> TypedMessage | None:
        return await self.q.one("take_terminal_chat", {"thread_id": thread_id}, into=TypedMessage)

    async def new_title(self, cwd: str) -> str:
        """A new terminal thread's title: its directory's name, numbered when sessions there made threads before
        ("Terminal: app", then "Terminal: app (2)")."""
        title = f"Terminal: {(Path(cwd).name or cwd)[:180]}"  # its number stays within the title's 200 characters
        found = await self.q.one("count_terminal_threads_in", {"cwd": cwd}, into=_Threads)
        return f"{title} ({found.threads + 1})" if found and found.threads else title

    async def messages_waiting(self, thread_id: uuid.UUID) -> int:
        found = await self.q.one("count_terminal_chat", {"thread_id": thread_id}, into=_Waiting)
        return found.waiting if found else 0
