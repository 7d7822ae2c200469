"""The claim's order (executor/sql/tasks.sql claim_pending_tasks): chat turns ahead of unattended work, which
never takes the slot kept for chat; what cannot be claimed for want of a slot says so (waiting_for_slot)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from executor.run.task_store import TaskStore
from executor.sql import queries
from shared.database import Database
from tests.pg import DB


async def test_chat_is_claimed_first_and_unattended_work_never_takes_the_kept_slot(db: DB) -> None:
    thread = uuid.uuid4()
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions (id, role, lifecycle, title, mode) VALUES (%s, 'orchestrator', 'idle', "
                     "'t', 'interactive')", [thread])
        # oldest first: two unattended tasks (a routine's run, a worker), then a chat turn
        routine, worker = (conn.execute("INSERT INTO tasks (role, brief, status, created_at) VALUES (%s, 'u', "
                                        "'pending', now() - make_interval(secs => %s)) RETURNING id",
                                        [role, age]).fetchone()[0]  # type: ignore[index]
                           for role, age in (("orchestrator", 30), ("worker", 20)))
        chat = conn.execute("INSERT INTO tasks (role, brief, status, session_id, chat) VALUES ('orchestrator', 'hi', "
                            "'pending', %s, true) RETURNING id", [thread]).fetchone()[0]  # type: ignore[index]
    async with Database(db.executor_dsn, name="claim-test", max_size=2) as database:
        async with database.pool.connection() as conn:
            epoch = (await (await conn.execute(queries["join_fleet"], {
                "name": "solo", "labels": [], "capacity": 2, "lease_s": 60, "version": "test",
                "sandbox": "bwrap", "workdir": "/tmp"})).fetchone())[0]  # type: ignore[index]
        store = TaskStore(database.pool)
        where: dict[str, Any] = {"name": "solo", "labels": [], "shared_config": True}
        # one slot (none kept): the chat turn, though the newest
        first = await store.claim_tasks(1, n_unattended=1, epoch=epoch, **where)
        # two free slots, one kept for chat: only the oldest unattended task
        second = await store.claim_tasks(2, n_unattended=1, epoch=epoch, **where)
        # the last free slot: unattended work may not take it
        third = await store.claim_tasks(1, n_unattended=0, epoch=epoch, **where)
        marked = await store.mark_waiting_for_slot(chat_too=False, **where)
        again = await store.mark_waiting_for_slot(chat_too=False, **where)  # said once
    with psycopg.connect(db.admin_dsn) as conn:
        left = conn.execute("SELECT id, status, activity FROM tasks WHERE status = 'pending'").fetchall()
    assert [(t.id, t.chat) for t in first] == [(chat, True)]
    assert [(t.id, t.chat) for t in second] == [(routine, False)]
    assert third == []
    assert (marked, again) == (1, 0)
    assert left == [(worker, "pending", "waiting_for_slot")]
