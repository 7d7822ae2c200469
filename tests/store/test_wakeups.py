"""The notifications a change sends wake only the loops that have work for it (migration 0035): a task's
activity is not an end, and a question whose asking tool waits for it is nothing for the settler."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tests.pg import DB

QUESTIONS = [{"question": "Go on?", "header": "Go", "multiSelect": False,
              "options": [{"label": "Yes", "description": ""}, {"label": "No", "description": ""}]}]
CHANNELS = ("task_changed", "task_activity", "question_answered", "question_settle")


def _heard(conn: psycopg.Connection, admin: psycopg.Connection, sql: str, args: list[object]) -> list[str]:
    """The channels (of CHANNELS) one committed statement notified, in order: up to a marker notified after
    its commit (notifications arrive in commit order), so nothing late is missed and no wait is timed."""
    admin.execute(sql, args)
    admin.execute("NOTIFY wake_probe")
    heard: list[str] = []
    for note in conn.notifies(timeout=30):
        if note.channel == "wake_probe":
            return heard
        heard.append(note.channel)
    raise AssertionError(f"the marker never came (heard {heard})")


@contextlib.contextmanager
def _listening(db: DB) -> Iterator[tuple[psycopg.Connection[Any], psycopg.Connection[Any]]]:
    """A connection listening on CHANNELS (and the marker), and one to change the store with."""
    with psycopg.connect(db.admin_dsn, autocommit=True) as listen, \
            psycopg.connect(db.admin_dsn, autocommit=True) as admin:
        for channel in (*CHANNELS, "wake_probe"):
            listen.execute(f"LISTEN {channel}")
        yield listen, admin


def test_an_activity_change_is_not_a_task_change_and_an_end_is(db: DB) -> None:
    with _listening(db) as (listen, admin):
        session = admin.execute("INSERT INTO sessions (role, lifecycle) VALUES ('worker', 'running') "
                                "RETURNING id").fetchone()[0]  # type: ignore[index]
        task = admin.execute("INSERT INTO tasks (session_id, role, status, started_at) "
                             "VALUES (%s, 'worker', 'running', now()) RETURNING id", [session]).fetchone()[0]  # type: ignore[index]
        assert _heard(listen, admin, "UPDATE tasks SET activity = 'awaiting_user' WHERE id = %s", [task]) \
            == ["task_activity"]
        assert _heard(listen, admin, "UPDATE tasks SET activity = 'running' WHERE id = %s", [task]) \
            == ["task_activity"]
        assert _heard(listen, admin, "UPDATE tasks SET activity = 'running' WHERE id = %s", [task]) == []
        assert _heard(listen, admin, "UPDATE tasks SET status = 'success', activity = NULL, ended_at = now() "
                      "WHERE id = %s", [task]) == ["task_changed"]


def test_only_the_answers_the_settler_acts_on_wake_it(db: DB) -> None:
    with _listening(db) as (listen, admin):
        session = admin.execute("INSERT INTO sessions (role, lifecycle) VALUES ('orchestrator', 'running') "
                                "RETURNING id").fetchone()[0]  # type: ignore[index]

        def question(kind: str) -> object:
            task = admin.execute("INSERT INTO tasks (session_id, role, status) VALUES (%s, 'worker', 'pending') "
                                 "RETURNING id", [session]).fetchone()[0]  # type: ignore[index]
            qid = admin.execute("INSERT INTO questions (tool_use_id, questions, task_id) VALUES (%s, %s, %s) "
                                "RETURNING id", [f"{kind}-{task}", Jsonb(QUESTIONS), task]).fetchone()[0]  # type: ignore[index]
            if kind in ("approvals", "escalations"):
                admin.execute(f"INSERT INTO {kind} (task_id, thread_id, question_id) VALUES (%s, %s, %s)",
                              [task, session, qid])
            if kind == "late":
                admin.execute("UPDATE questions SET timed_out_at = now() WHERE id = %s", [qid])
            _heard(listen, admin, "SELECT 1", [])  # the asking's own notifications
            return qid

        answer = ("UPDATE questions SET status = 'answered', answers = %s, answered_by = 'user', answered_at = now() "
                  "WHERE id = %s")
        # the negative control: a question its asking tool waits for wakes its waiter and the page, not the settler
        assert _heard(listen, admin, answer, [Jsonb({"Go on?": "Yes"}), question("model")]) == ["question_answered"]
        for kind in ("approvals", "escalations", "late"):
            assert _heard(listen, admin, answer, [Jsonb({"Go on?": "Yes"}), question(kind)]) \
                == ["question_answered", "question_settle"], kind
        cancel = "UPDATE questions SET status = 'cancelled', response = 'dismissed' WHERE id = %s"
        assert _heard(listen, admin, cancel, [question("approvals")]) == ["question_answered", "question_settle"]
