"""A chat message sent while a turn waits on a question answers it; if the question was answered (or timed out) after
the threads loop read the thread's state, the message is not spent on it: it stays queued for the next pass."""

from __future__ import annotations

import uuid

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from executor.journal.writer import JournalWriter
from executor.settle.threads import Threads
from tests.pg import DB


def _setup(conn: psycopg.Connection) -> tuple[uuid.UUID, uuid.UUID]:
    thread = uuid.uuid4()
    conn.execute("INSERT INTO sessions (id, role, lifecycle) VALUES (%s, 'orchestrator', 'running')", [thread])
    turn = conn.execute("INSERT INTO tasks (session_id, role, status) VALUES (%s, 'orchestrator', 'running') "
                        "RETURNING id", [thread]).fetchone()[0]  # type: ignore[index]
    asked = Jsonb([{"question": "Which?", "options": []}])
    question = conn.execute("INSERT INTO questions (tool_use_id, source_session_uuid, task_id, questions, asked_by) "
                            "VALUES (%s, %s, %s, %s, 'model') RETURNING id",
                            [f"toolu_{thread.hex}", thread, turn, asked]).fetchone()[0]  # type: ignore[index]
    conn.execute("INSERT INTO chat_queue (thread_id, text, origin) VALUES (%s, 'the blue one', 'user')", [thread])
    return thread, question


def _after(conn: psycopg.Connection, thread: uuid.UUID, question: uuid.UUID) -> tuple[str, str | None, int]:
    chat = conn.execute("SELECT status FROM chat_queue WHERE thread_id = %s", [thread]).fetchone()[0]  # type: ignore[index]
    response = conn.execute("SELECT response FROM questions WHERE id = %s", [question]).fetchone()[0]  # type: ignore[index]
    echoed = conn.execute("SELECT count(*) FROM journal WHERE session_id = %s AND event_type = 'task.user_message'",
                          [thread]).fetchone()[0]  # type: ignore[index]
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
    admin_conn.execute("UPDATE questions SET status = 'answered', answers = '{}', response = 'from the panel', "
                       "answered_by = 'u' WHERE id = %s", [late])
    await threads._reply_in_chat(late_thread, late)
    assert _after(admin_conn, late_thread, late) == ("pending", "from the panel", 0)
    admin_conn.close()
