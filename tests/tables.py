"""The store's rows as tests read and make them, by name: one place for the SQL the tests repeat.

A reader takes the admin DSN (a connection of its own, autocommit) or an open connection (to read inside the
test's transaction). What the services themselves run stays in their stores; these are the test's views."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from ingress.sql import queries as ingress_queries

DB = str | psycopg.Connection[Any]
Id = uuid.UUID | str


@contextmanager
def _connected(db: DB) -> Iterator[psycopg.Connection[Any]]:
    if isinstance(db, str):
        with psycopg.connect(db, autocommit=True) as conn:
            yield conn
    else:
        yield db


def _all(db: DB, query: LiteralString | sql.Composed, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with _connected(db) as conn:
        return conn.execute(query, params or []).fetchall()


def _value(db: DB, query: LiteralString | sql.Composed, params: list[Any] | None = None) -> Any:
    with _connected(db) as conn:
        row = conn.execute(query, params or []).fetchone()
    assert row is not None, query  # an aggregate or a row the test made
    return row[0]


# ---- tasks --------------------------------------------------------------------------------------------------

def count_running(db: DB, role: str | None = None) -> int:
    """Tasks running with a process (of one role, or any)."""
    return int(_value(db, "SELECT count(*) FROM tasks WHERE status = 'running' AND pid IS NOT NULL"
                          " AND (%s::text IS NULL OR role = %s)", [role, role]))


def count_tasks(db: DB, role: str | None = None) -> int:
    return int(_value(db, "SELECT count(*) FROM tasks WHERE %s::text IS NULL OR role = %s", [role, role]))


def tasks(db: DB, *columns: str, role: str | None = None) -> list[tuple[Any, ...]]:
    """The named columns of every task (of one role), oldest first."""
    query = sql.SQL("SELECT {} FROM tasks WHERE %s::text IS NULL OR role = %s ORDER BY created_at, id").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)))
    return _all(db, query, [role, role])


def task(db: DB, task_id: Id, *columns: str) -> tuple[Any, ...]:
    """The named columns of one task."""
    query = sql.SQL("SELECT {} FROM tasks WHERE id = %s").format(sql.SQL(", ").join(map(sql.Identifier, columns)))
    found = _all(db, query, [task_id])
    assert found, f"no task {task_id}"
    return found[0]


# ---- the journal --------------------------------------------------------------------------------------------

def count_events(db: DB, event_type: str, task_id: Id | None = None) -> int:
    """Journal records of a type (of one task, or any)."""
    return int(_value(db, "SELECT count(*) FROM journal WHERE event_type = %s"
                          " AND (%s::uuid IS NULL OR task_id = %s)", [event_type, task_id, task_id]))


def payloads(db: DB, event_type: str, task_id: Id | None = None) -> list[Any]:
    """The payloads of a type's journal records (of one task, or any), in journal order."""
    return [p for (p,) in _all(db, "SELECT payload FROM journal WHERE event_type = %s"
                                   " AND (%s::uuid IS NULL OR task_id = %s) ORDER BY seq",
                               [event_type, task_id, task_id])]


def event_types(db: DB, task_id: Id | None = None) -> list[str]:
    """The types of the journal's records (of one task, or all), in journal order."""
    return [t for (t,) in _all(db, "SELECT event_type FROM journal WHERE %s::uuid IS NULL OR task_id = %s"
                                   " ORDER BY seq", [task_id, task_id])]


def user_messages(db: DB) -> list[str]:
    """The chat messages the turns echoed to the journal, in order."""
    return [t for (t,) in _all(db, "SELECT payload ->> 'text' FROM journal WHERE event_type = 'task.user_message'"
                                   " ORDER BY seq")]


def policy_actions(db: DB) -> list[str]:
    """The policy's decisions, in order."""
    return [a for (a,) in _all(db, "SELECT payload ->> 'action' FROM journal WHERE event_type = 'policy.decision'"
                                   " ORDER BY seq")]


# ---- queues -------------------------------------------------------------------------------------------------

async def ask_stop(ingress_dsn: str, task_id: Id, reason: str = "user") -> None:
    """A stop as the ingress asks it: its own query, as its role."""
    async with await psycopg.AsyncConnection.connect(ingress_dsn, autocommit=True) as conn:
        await conn.execute(ingress_queries["enqueue_stop"], {"task_id": task_id, "reason": reason})


# ---- connections --------------------------------------------------------------------------------------------

def listening(db: DB, application_name: str, besides: list[int] | None = None) -> set[str]:
    """The listen connections named like `application_name` (a LIKE pattern) that have LISTENed: their last
    statement is a LISTEN or the probe a listener sends only after its LISTENs; `besides`: backends left out
    (those a test ended)."""
    return {name for (name,) in _all(
        db, "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE %s AND pid <> ALL(%s)"
            " AND (query ILIKE 'LISTEN %%' OR query ILIKE 'SELECT pg_notify(%%')", [application_name, besides or []])}
