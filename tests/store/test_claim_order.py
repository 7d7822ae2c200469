"""The claim's order (executor/sql/tasks.sql claim_pending_tasks): chat turns ahead of unattended work, which
never takes the slot kept for chat; what cannot be claimed for want of a slot says so (waiting_for_slot)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from executor.run.task_store import TaskStore
from executor.sql import queries
from shared.database import Database
from tests import tables
from tests.pg import DB


async def test_chat_is_claimed_first_then_the_users_work_and_unattended_work_never_takes_the_kept_slot(
        db: DB) -> None:
    thread, routine_thread = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        for sid in (thread, routine_thread):
            tables.insert_thread(conn, sid, title="t", mode="interactive")
        routine = tables.insert(conn, "routines", name="nightly", prompt="p", cron="0 9 * * *", tz="UTC")
        tables.insert(conn, "routine_runs", routine_id=routine, trigger="run", status="running",
                      thread_id=routine_thread)

        def task(role: str, age: int, session: uuid.UUID | None = None, attempt: int = 1, chat: bool = False) -> Any:
            return tables.insert_task(conn, role=role, brief="b", status="pending", session_id=session, attempt=attempt,
                                      chat=chat, created_at=tables.from_now(seconds=-age))

        # oldest first: a routine run's turn, a retry, a worker (the user's work), then a chat turn
        run_turn = task("orchestrator", 40, routine_thread)
        retry = task("worker", 30, attempt=2)
        worker = task("worker", 20)
        chat = task("orchestrator", 0, thread, chat=True)
    async with Database(db.executor_dsn, name="claim-test", max_size=2) as database:
        async with database.pool.connection() as aconn:
            epoch = (await (await aconn.execute(queries["join_fleet"], {
                "name": "solo", "labels": [], "capacity": 2, "lease_s": 60, "version": "test",
                "sandbox": "bwrap", "workdir": "/tmp"})).fetchone())[0]  # type: ignore[index]
        store = TaskStore(database.pool)
        where: dict[str, Any] = {"name": "solo", "labels": [], "shared_config": True}
        # one slot (none kept): the chat turn, though the newest
        first = await store.claim_tasks(1, n_unattended=1, epoch=epoch, **where)
        # two free slots, one kept for chat: the worker, though younger than the unattended two; nothing more
        second = await store.claim_tasks(2, n_unattended=1, epoch=epoch, **where)
        # the last free slot: unattended work may not take it
        third = await store.claim_tasks(1, n_unattended=0, epoch=epoch, **where)
        marked = await store.mark_waiting_for_slot(chat_too=False, **where)
        again = await store.mark_waiting_for_slot(chat_too=False, **where)  # said once
        # two free slots again: the oldest unattended task
        fourth = await store.claim_tasks(2, n_unattended=1, epoch=epoch, **where)
    left = tables.tasks(db.admin_dsn, "id", "status", "activity", status="pending")
    assert [(t.id, t.chat) for t in first] == [(chat, True)]
    assert [t.id for t in second] == [worker]
    assert third == []
    assert (marked, again) == (2, 0)
    assert [t.id for t in fourth] == [run_turn]
    assert left == [(retry, "pending", "waiting_for_slot")]
