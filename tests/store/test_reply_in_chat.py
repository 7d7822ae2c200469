"""A chat message sent while a turn waits on a question answers it; if the question was answered (or timed out) after
the threads loop read the thread's state, the message is not spent on it: it stays queued for the next pass."""

from __future__ import annotations

import uuid

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.journal.writer import JournalWriter
from executor.settle.threads import Threads
from tests import tables
from tests.pg import DB


def _setup(conn: psycopg.Connection) -> tuple[uuid.UUID, uuid.UUID]:
    thread = tables.insert_thread(conn, lifecycle="running")
    turn = tables.insert_task(conn, session_id=thread, role="orchestrator", status="running")
    asked = Jsonb([{"question": "Which?", "options": []}])
    question = tables.insert(conn, "questions", tool_use_id=f"toolu_{thread.hex}", source_session_uuid=thread,
                             task_id=turn, questions=asked, asked_by="model")
    tables.insert(conn, "chat_queue", thread_id=thread, text="the blue one", origin="user")
    return thread, question


def _after(conn: psycopg.Connection, thread: uuid.UUID, question: uuid.UUID) -> tuple[str, str | None, int]:
    ((chat,),) = tables.rows(conn, "chat_queue", "status", thread_id=thread)
    ((response,),) = tables.rows(conn, "questions", "response", id=question)
    echoed = tables.count_events(conn, "task.user_message", session_id=thread)
    return chat, response, echoed


async def test_a_reply_answers_a_pending_question_and_is_kept_for_one_answered_meanwhile(
        pool: AsyncConnectionPool, db: DB) -> None:
    threads = Threads(pool, JournalWriter(pool))
    admin_conn = psycopg.connect(db.admin_dsn, autocommit=True)
    pending_thread, pending = _setup(admin_conn)
    await threads._reply_in_chat(pending_thread, pending)
    # the negative control: a question still pending is answered by the message
    assert _after(admin_conn, pending_thread, pending) == ("delivered", "the blue one", 1)
    late_thread, late = _setup(admin_conn)
    tables.answer(admin_conn, late, response="from the panel", answered_by="u")
    await threads._reply_in_chat(late_thread, late)
    assert _after(admin_conn, late_thread, late) == ("pending", "from the panel", 0)
    admin_conn.close()
