"""The store's rows as tests read and make them, by name: one place for the SQL the tests repeat.

Each takes the admin DSN (a connection of its own, autocommit) or an open connection (to read or write inside
the test's own transaction). Filters are keywords, a column each, equal to the value (None: IS NULL); a read
with anything more (a LIKE, a join) stays in its test, where it says what it looks for. What the services run
stays in their stores; these are the test's views and the rows it makes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

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
    assert row is not None, query  # an aggregate, or a row RETURNING made
    return row[0]


def _where(equal: dict[str, Any]) -> sql.Composed:
    """` WHERE a = %s AND b IS NULL` over the keywords; nothing for none."""
    if not equal:
        return sql.Composed([])
    return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(
        sql.SQL("{} IS NULL" if v is None else "{} = %s").format(sql.Identifier(k)) for k, v in equal.items())


def _params(equal: dict[str, Any]) -> list[Any]:
    return [v for v in equal.values() if v is not None]


def _columns(columns: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, columns))


# ---- any table ----------------------------------------------------------------------------------------------

def count(db: DB, table: str, **equal: Any) -> int:
    """How many rows of a table match the keywords."""
    return int(_value(db, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)) + _where(equal),
                      _params(equal)))


def rows(db: DB, table: str, *columns: str, order: tuple[str, ...] = ("created_at", "id"),
         **equal: Any) -> list[tuple[Any, ...]]:
    """The named columns of the rows of a table that match the keywords, ordered by the `order` columns."""
    query = sql.SQL("SELECT {} FROM {}").format(_columns(columns), sql.Identifier(table)) + _where(equal) + \
        sql.SQL(" ORDER BY {}").format(_columns(order))
    return _all(db, query, _params(equal))


NOW = sql.SQL("now()")
"""A column's value as the database's clock reads it (`ended_at=NOW`)."""


def _insert(table: str, values: dict[str, Any], tail: str) -> tuple[sql.Composed, list[Any]]:
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(table), _columns(tuple(values)),
        sql.SQL(", ").join(v if isinstance(v, sql.SQL) else sql.Placeholder() for v in values.values()))
    return query + sql.SQL(tail), [Jsonb(v) if isinstance(v, dict) else v for v in values.values()
                                  if not isinstance(v, sql.SQL)]


def insert(db: DB, table: str, **values: Any) -> uuid.UUID:
    """A row the test makes, its columns as keywords (a dict goes in as JSON, NOW as the database's now()); its
    id."""
    made: uuid.UUID = _value(db, *_insert(table, values, " RETURNING id"))
    return made


def ensure(db: DB, table: str, **values: Any) -> None:
    """`insert`, unless a row with its id is there already (a fixture another may have made, as the Default
    thread)."""
    with _connected(db) as conn:
        conn.execute(*_insert(table, values, " ON CONFLICT (id) DO NOTHING"))


def update(db: DB, table: str, row_id: Id, **values: Any) -> None:
    """Set a row's columns (a dict goes in as JSON, NOW as the database's now())."""
    query = sql.SQL("UPDATE {} SET {} WHERE id = %s").format(sql.Identifier(table), sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(k), v if isinstance(v, sql.SQL) else sql.Placeholder())
        for k, v in values.items()))
    params = [Jsonb(v) if isinstance(v, dict) else v for v in values.values() if not isinstance(v, sql.SQL)]
    with _connected(db) as conn:
        assert conn.execute(query, [*params, row_id]).rowcount == 1, f"no {table} row {row_id}"


# ---- tasks and threads ----------------------------------------------------------------------------------------

def count_running(db: DB, role: str | None = None) -> int:
    """Tasks running with a process (of one role, or any)."""
    return int(_value(db, "SELECT count(*) FROM tasks WHERE status = 'running' AND pid IS NOT NULL"
                          " AND (%s::text IS NULL OR role = %s)", [role, role]))


def count_tasks(db: DB, **equal: Any) -> int:
    """How many tasks match the keywords (`role="worker"`, `parent_task_id=...`)."""
    return count(db, "tasks", **equal)


def tasks(db: DB, *columns: str, **equal: Any) -> list[tuple[Any, ...]]:
    """The named columns of the tasks that match the keywords, oldest first."""
    return rows(db, "tasks", *columns, **equal)


def task(db: DB, task_id: Id, *columns: str) -> tuple[Any, ...]:
    """The named columns of one task."""
    found = _all(db, sql.SQL("SELECT {} FROM tasks WHERE id = %s").format(_columns(columns)), [task_id])
    assert found, f"no task {task_id}"
    return found[0]


def status(db: DB, task_id: Id) -> str | None:
    """A task's status; None while there is no such task."""
    found = _all(db, "SELECT status FROM tasks WHERE id = %s", [task_id])
    return found[0][0] if found else None


def insert_task(db: DB, **columns: Any) -> uuid.UUID:
    """A task row the test makes (a worker unless `role=` says otherwise); its id."""
    return insert(db, "tasks", **{"role": "worker", **columns})


def insert_thread(db: DB, thread_id: Id | None = None, **columns: Any) -> uuid.UUID:
    """A thread (an orchestrator's session, idle unless `lifecycle=` says otherwise) the test makes; its id."""
    return insert(db, "sessions", **({"id": thread_id} if thread_id is not None else {}),
                  **{"role": "orchestrator", "lifecycle": "idle", **columns})


def ensure_thread(db: DB, thread_id: Id, **columns: Any) -> None:
    """`insert_thread`, unless the thread is there already (the Default thread, made at start)."""
    ensure(db, "sessions", id=thread_id, **{"role": "orchestrator", "lifecycle": "idle", **columns})


def thread_with_turn(db: DB, mode: str = "interactive") -> tuple[uuid.UUID, uuid.UUID]:
    """A thread and one ended, settled orchestrator turn of it, as the threads loop leaves them."""
    thread = insert_thread(db, title="t", mode=mode)
    turn = insert_task(db, session_id=thread, role="orchestrator", brief="go", status="success", ended_at=NOW,
                       settled_at=NOW)
    return thread, turn


# ---- the journal --------------------------------------------------------------------------------------------

def _of(event_type: str, task_id: Id | None, equal: dict[str, Any]) -> dict[str, Any]:
    return {"event_type": event_type, **({"task_id": task_id} if task_id is not None else {}), **equal}


def count_events(db: DB, event_type: str, task_id: Id | None = None, **equal: Any) -> int:
    """Journal records of a type (of one task, or any; `session_id=` one thread's)."""
    return count(db, "journal", **_of(event_type, task_id, equal))


def payloads(db: DB, event_type: str, task_id: Id | None = None, **equal: Any) -> list[Any]:
    """The payloads of a type's journal records (of one task, or any; `session_id=` one thread's), in order."""
    return [p for (p,) in rows(db, "journal", "payload", order=("seq",), **_of(event_type, task_id, equal))]


def event_types(db: DB, task_id: Id | None = None) -> list[str]:
    """The types of the journal's records (of one task, or all), in order."""
    return [t for (t,) in rows(db, "journal", "event_type", order=("seq",),
                               **({"task_id": task_id} if task_id is not None else {}))]


def journal_head(db: DB) -> int:
    """The journal head's last seq (its one row)."""
    return int(_value(db, "SELECT last_seq FROM journal_head"))


def seqs(db: DB) -> list[int]:
    """Every journal record's seq, in order."""
    return [q for (q,) in _all(db, "SELECT seq FROM journal ORDER BY seq")]


def user_messages(db: DB) -> list[str]:
    """The chat messages the turns echoed to the journal, in order."""
    return [p.get("text") for p in payloads(db, "task.user_message")]


def policy_actions(db: DB, task_id: Id | None = None) -> list[str]:
    """The policy's decisions (about one task, or all), in order."""
    return [p.get("action") for p in payloads(db, "policy.decision", task_id)]


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
