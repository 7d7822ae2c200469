"""The store of the CLI's stored conversations and the threads made from them (executor/sql/sessions.sql):
the index's published rows, an adoption's checks and its thread, a thread's import offset.

The one module of this room that runs these queries. Rows come back as frozen dataclasses (shared.query.FromRow).
A store runs over the pool (`SessionStore.over(pool)`) or inside a unit of work (`async with store.work()`),
where what it writes commits with the records emitted into the same unit.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared.query import FromRow, Queries, Transaction
from shared.work import Work, work


@dataclass(frozen=True)
class ConversationThread(FromRow):
    """A thread of this executor speaking in a conversation whose file grew; `turn_open`: its own turn may be
    what is writing."""

    id: uuid.UUID
    cli_session_id: str
    cli_config_dir: str | None
    cli_import_offset: int | None
    turn_open: bool


@dataclass(frozen=True)
class TurnWindow(FromRow):
    """When one of a thread's turns ran (`ended_at` None: it still runs)."""

    started_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True)
class NewAdoptedThread:
    """What an adoption writes of its thread (insert_adopted_thread)."""

    id: uuid.UUID
    title: str
    mode: str
    executor: str
    adopted_session_id: str
    cli_session_id: str
    cli_config_dir: str
    cli_workdir: str
    cli_fork_from: str | None
    cli_import_offset: int | None
    resume_command: str


@dataclass(frozen=True)
class _Adopted(FromRow):
    adopted_session_id: str | None


@dataclass(frozen=True)
class _Id(FromRow):
    id: uuid.UUID


class SessionStore:
    def __init__(self, q: Queries | Transaction):
        self.q = q

    @classmethod
    def over(cls, pool: AsyncConnectionPool) -> SessionStore:
        return cls(Queries(pool, queries))

    @asynccontextmanager
    async def work(self) -> AsyncIterator[tuple[SessionStore, Work]]:
        """A unit of work: this store inside it, and the unit (to `emit` the records that commit with it)."""
        assert isinstance(self.q, Queries), "a unit of work begins over the pool"
        async with work(self.q) as unit:
            yield SessionStore(unit), unit

    # ---- the index ---------------------------------------------------------------------------------------

    async def publish(self, executor: str, rows: Sequence[Mapping[str, Any]], gone: Sequence[str], *,
                      keep: Sequence[str] | None = None) -> None:
        """In one transaction: the changed rows written, the conversations `gone` deleted; `keep` (the first
        pass of a run): every other row of this executor deleted first (files gone while it was away)."""
        assert isinstance(self.q, Queries), "a publication is its own transaction"
        async with self.q.transaction() as tx:
            if keep is not None:
                await tx.execute("delete_claude_sessions_except", {"executor": executor, "keep": list(keep)})
            for r in rows:
                await tx.execute("upsert_claude_session", r)
            for session_id in gone:
                await tx.execute("delete_claude_session", {"executor": executor, "session_id": session_id})

    # ---- adoption ----------------------------------------------------------------------------------------

    async def adopted_session(self, thread_id: uuid.UUID) -> str | None:
        """The conversation a thread was made from (None: no such thread, or not adopted)."""
        found = await self.q.one("get_adopted_session", {"id": thread_id}, into=_Adopted)
        return found.adopted_session_id if found else None

    async def conversation_taken(self, session_id: str) -> uuid.UUID | None:
        """The live thread that already continues this conversation, if any."""
        found = await self.q.one("check_conversation_taken", {"session_id": session_id}, into=_Id)
        return found.id if found else None

    async def insert_adopted_thread(self, thread: NewAdoptedThread) -> bool:
        """False when a thread with its id exists."""
        params = {f: getattr(thread, f) for f in thread.__dataclass_fields__}
        return await self.q.one("insert_adopted_thread", params, into=_Id) is not None

    # ---- what a terminal adds ----------------------------------------------------------------------------

    async def threads_of_conversations(self, executor: str, ids: Sequence[str]) -> list[ConversationThread]:
        return await self.q.all("list_threads_of_conversations", {"executor": executor, "ids": list(ids)},
                                into=ConversationThread)

    async def turn_windows(self, thread_id: uuid.UUID) -> list[TurnWindow]:
        return await self.q.all("list_thread_turn_windows", {"id": thread_id}, into=TurnWindow)

    async def advance_import(self, thread_id: uuid.UUID, previous: int | None, offset: int) -> bool:
        """Compare-and-set of a thread's import offset: False when another pass moved it from `previous`."""
        return await self.q.one("advance_thread_import", {"id": thread_id, "previous": previous, "offset": offset},
                                into=_Id) is not None
