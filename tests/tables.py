"""The store's rows as tests read and make them, by name: one place for the SQL the tests repeat.

Each takes the admin DSN (a connection of its own, autocommit) or an open connection (to read or write inside
the test's own transaction). Filters are keywords, a column each, equal to the value (None: IS NULL, NOT_NULL: IS
NOT NULL, Like(pattern): LIKE); a read with anything more (a join, an aggregate) stays in its test, where it says
what it looks for. What the services run
stays in their stores; these are the test's views and the rows it makes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
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


@dataclass(frozen=True)
class Like:
    """A filter's value: the column matches this LIKE pattern."""
    pattern: str


class _NotNull:
    pass


NOT_NULL = _NotNull()
"""A filter's value: the column has one."""


def _test(v: Any) -> LiteralString:
    if v is None:
        return "{} IS NULL"
    if v is NOT_NULL:
        return "{} IS NOT NULL"
    return "{} LIKE %s" if isinstance(v, Like) else "{} = %s"


def _where(equal: dict[str, Any]) -> sql.Composed:
    """` WHERE a = %s AND b IS NULL` over the keywords; nothing for none."""
    if not equal:
        return sql.Composed([])
    return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(
        sql.SQL(_test(v)).format(sql.Identifier(k)) for k, v in equal.items())


def _params(equal: dict[str, Any]) -> list[Any]:
    return [v.pattern if isinstance(v, Like) else v for v in equal.values() if v is not None and v is not NOT_NULL]


def _columns(columns: tuple[str, ...]) -> sql.Composable:
    return sql.SQL(", ").join(map(sql.Identifier, columns)) if columns else sql.SQL("*")


def _value_of(v: Any) -> Any:
    """A value as it goes in: a dict as JSON (a Composable is SQL, put in the statement, not a parameter)."""
    return Jsonb(v) if isinstance(v, dict) else v


def _slot(v: Any) -> sql.Composable:
    return v if isinstance(v, sql.Composable) else sql.Placeholder()


def _sets(values: dict[str, Any]) -> tuple[sql.Composed, list[Any]]:
    return sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(k), _slot(v)) for k, v in values.items()), \
        [_value_of(v) for v in values.values() if not isinstance(v, sql.Composable)]


# ---- any table ----------------------------------------------------------------------------------------------

def count(db: DB, table: str, **equal: Any) -> int:
    """How many rows of a table match the keywords."""
    return int(_value(db, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)) + _where(equal),
                      _params(equal)))


def _select(table: str, columns: tuple[str, ...], order: tuple[str, ...], equal: dict[str, Any]) -> sql.Composed:
    return sql.SQL("SELECT {} FROM {}").format(_columns(columns), sql.Identifier(table)) + _where(equal) + \
        sql.SQL(" ORDER BY {}").format(_columns(order))


def rows(db: DB, table: str, *columns: str, order: tuple[str, ...] = ("created_at", "id"),
         **equal: Any) -> list[tuple[Any, ...]]:
    """The named columns of the rows of a table that match the keywords, ordered by the `order` columns."""
    return _all(db, _select(table, columns, order, equal), _params(equal))


def dict_rows(db: DB, table: str, *columns: str, order: tuple[str, ...] = ("created_at", "id"),
              **equal: Any) -> list[dict[str, Any]]:
    """`rows` as dicts by column name; every column when none is named."""
    with _connected(db) as conn:
        return conn.cursor(row_factory=dict_row).execute(_select(table, columns, order, equal),
                                                         _params(equal)).fetchall()


def row(db: DB, table: str, row_id: Id, *columns: str) -> tuple[Any, ...]:
    """The named columns of one row of a table, by its id."""
    found = _all(db, sql.SQL("SELECT {} FROM {} WHERE id = %s").format(_columns(columns), sql.Identifier(table)),
                 [row_id])
    assert found, f"no {table} row {row_id}"
    return found[0]


NOW = sql.SQL("now()")
"""A column's value as the database's clock reads it (`ended_at=NOW`)."""


def from_now(**delta: float) -> sql.Composable:
    """A column's value as the database's clock reads it, moved by a timedelta's keywords
    (`lease_until=from_now(seconds=-30)`)."""
    return sql.SQL("now() + {}").format(sql.Literal(timedelta(**delta)))


def moved(column: str, **delta: float) -> sql.Composable:
    """A column's own value moved by a timedelta's keywords (`received_at=moved("received_at", days=-31)`)."""
    return sql.SQL("{} + {}").format(sql.Identifier(column), sql.Literal(timedelta(**delta)))


def now(db: DB) -> datetime:
    """The database's clock."""
    read: datetime = _value(db, "SELECT now()")
    return read


def _insert(table: str, values: dict[str, Any], tail: str) -> tuple[sql.Composed, list[Any]]:
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(table), _columns(tuple(values)), sql.SQL(", ").join(map(_slot, values.values())))
    return query + sql.SQL(tail), [_value_of(v) for v in values.values() if not isinstance(v, sql.Composable)]


def insert(db: DB, table: str, **values: Any) -> uuid.UUID:
    """A row the test makes, its columns as keywords (a dict goes in as JSON, NOW as the database's now()); its
    id."""
    made: uuid.UUID = _value(db, *_insert(table, values, " RETURNING id"))
    return made


def add(db: DB, table: str, **values: Any) -> None:
    """`insert` into a table keyed otherwise than by an id (nothing read back)."""
    with _connected(db) as conn:
        conn.execute(*_insert(table, values, ""))


def ensure(db: DB, table: str, **values: Any) -> None:
    """`insert`, unless a row with its id is there already (a fixture another may have made, as the Default
    thread)."""
    with _connected(db) as conn:
        conn.execute(*_insert(table, values, " ON CONFLICT (id) DO NOTHING"))


def update(db: DB, table: str, row_id: Id, **values: Any) -> None:
    """Set a row's columns (a dict goes in as JSON, NOW as the database's now())."""
    sets, params = _sets(values)
    query = sql.SQL("UPDATE {} SET {} WHERE id = %s").format(sql.Identifier(table), sets)
    with _connected(db) as conn:
        assert conn.execute(query, [*params, row_id]).rowcount == 1, f"no {table} row {row_id}"


def update_all(db: DB, table: str, where: dict[str, Any], **values: Any) -> int:
    """Set the columns of every row matching `where` (a column each, as the reads' keywords); how many."""
    sets, params = _sets(values)
    query = sql.SQL("UPDATE {} SET {}").format(sql.Identifier(table), sets) + _where(where)
    with _connected(db) as conn:
        return conn.execute(query, [*params, *_params(where)]).rowcount


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
    return row(db, "tasks", task_id, *columns)


def turns(db: DB, thread_id: Id, *columns: str) -> list[tuple[Any, ...]]:
    """The named columns of a thread's turns (its orchestrator tasks), oldest first."""
    return tasks(db, *columns, session_id=thread_id, role="orchestrator")


def thread(db: DB, thread_id: Id, *columns: str) -> tuple[Any, ...]:
    """The named columns of one thread (a session row)."""
    return row(db, "sessions", thread_id, *columns)


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


def credential(db: DB, task_id: Id) -> tuple[bytes, datetime | None] | None:
    """A spawn's harness credential: its token's hash and when it was revoked (None: it holds); None while the
    task has none."""
    found = rows(db, "harness_credentials", "token_sha256", "revoked_at", order=("created_at",), task_id=task_id)
    return (bytes(found[0][0]), found[0][1]) if found else None


# ---- the journal --------------------------------------------------------------------------------------------

def _of(event_type: str | Like, task_id: Id | None, equal: dict[str, Any]) -> dict[str, Any]:
    return {"event_type": event_type, **({"task_id": task_id} if task_id is not None else {}), **equal}


def count_events(db: DB, event_type: str | Like, task_id: Id | None = None, **equal: Any) -> int:
    """Journal records of a type, or of types Like a pattern (of one task, or any; `session_id=` one thread's)."""
    return count(db, "journal", **_of(event_type, task_id, equal))


def payloads(db: DB, event_type: str, task_id: Id | None = None, **equal: Any) -> list[Any]:
    """The payloads of a type's journal records (of one task, or any; `session_id=` one thread's), in order."""
    return [p for (p,) in rows(db, "journal", "payload", order=("seq",), **_of(event_type, task_id, equal))]


def records(db: DB, *columns: str, **equal: Any) -> list[tuple[Any, ...]]:
    """The named columns of the journal records that match the keywords, in order."""
    return rows(db, "journal", *columns, order=("seq",), **equal)


def event_types(db: DB, task_id: Id | None = None, after: int | None = None) -> list[str]:
    """The types of the journal's records (of one task, or all; after a seq, or from the start), in order."""
    return [t for (t,) in _all(db, "SELECT event_type FROM journal WHERE (%s::uuid IS NULL OR task_id = %s)"
                                   " AND seq > coalesce(%s::bigint, 0) ORDER BY seq", [task_id, task_id, after])]


def append(db: DB, event_type: str, payload: dict[str, Any], tier: str = "raw", **columns: Any) -> int:
    """A journal record the test writes (`task_id=`, `session_id=`, `project_id=` its own), its seq taken under
    the journal head's lock as the executor's writer takes it; its seq."""
    with _connected(db) as conn, conn.transaction():
        seq = int(_value(conn, "UPDATE journal_head SET last_seq = last_seq + 1 RETURNING last_seq"))
        add(conn, "journal", event_id=uuid.uuid4(), seq=seq, event_type=event_type, tier=tier, payload=payload,
            **columns)
    return seq


def deltas(db: DB, task_id: Id) -> int:
    """The text deltas of a task's token stream in the journal (a line each)."""
    return int(_value(db, "SELECT count(*) FROM journal WHERE task_id = %s AND event_type = 'stream.stream_event'"
                          " AND payload -> 'event' ->> 'type' = 'content_block_delta'", [task_id]))


def shown_seqs(db: DB, since: int | None = None, task_id: Id | None = None) -> list[int]:
    """The seqs of the records a feed shows (all but the token stream's), in order: from a seq on, of one task."""
    return [q for (q,) in _all(
        db, "SELECT seq FROM journal WHERE event_type <> 'stream.stream_event' AND seq >= coalesce(%s::bigint, 0)"
            " AND (%s::uuid IS NULL OR task_id = %s) ORDER BY seq", [since, task_id, task_id])]


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


# ---- the fleet ----------------------------------------------------------------------------------------------

def executors(db: DB, *columns: str, **equal: Any) -> list[tuple[Any, ...]]:
    """The named columns of the executors that match the keywords, by name."""
    return rows(db, "executors", *columns, order=("name",), **equal)


def executor(db: DB, name: str, *columns: str) -> tuple[Any, ...]:
    """The named columns of one executor."""
    found = executors(db, *columns, name=name)
    assert found, f"no executor {name}"
    return found[0]


def epochs(db: DB) -> dict[str, int]:
    """Each executor's epoch, by name."""
    return dict(executors(db, "name", "epoch"))


def insert_executor(db: DB, name: str, **columns: Any) -> None:
    """An executor row the test makes: four slots and a 15 s lease running for an hour, unless the keywords say
    otherwise (`lease_until=from_now(seconds=-30)`: its lease run out)."""
    add(db, "executors", **{"name": name, "capacity": 4, "lease_s": 15, "lease_until": from_now(hours=1), **columns})


def joined(db: DB, name: str, within_s: float = 60) -> bool:
    """An executor of that name runs: not stopped, its lease running, joined within the last `within_s` seconds
    (this run, not a former one of the name)."""
    return bool(_all(db, "SELECT 1 FROM executors WHERE name = %s AND stopped_at IS NULL AND lease_until > now()"
                         " AND started_at > now() - make_interval(secs => %s)", [name, within_s]))


# ---- questions ----------------------------------------------------------------------------------------------

def ask(db: DB, questions: list[dict[str, Any]], **columns: Any) -> uuid.UUID:
    """A question put to the user (a tool use of its own unless `tool_use_id=` names one); its id."""
    return insert(db, "questions", **{"tool_use_id": f"toolu_{uuid.uuid4().hex}", "questions": Jsonb(questions),
                                      **columns})


def only_ask(db: DB, questions: list[dict[str, Any]], **columns: Any) -> uuid.UUID:
    """`ask`, the one pending: any question still pending is cancelled first, in the same transaction."""
    with _connected(db) as conn, conn.transaction():
        update_all(conn, "questions", {"status": "pending"}, status="cancelled")
        return ask(conn, questions, **columns)


def answer(db: DB, question_id: Id, answers: dict[str, Any] | None = None, **columns: Any) -> None:
    """A question answered: its status, its answers (`{}` unless given) and any more columns as keywords
    (`answered_by=`: who, as the ingress records it; an answer without one is not the user's)."""
    update(db, "questions", question_id, status="answered", answers={} if answers is None else answers, **columns)


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


def advisory_holders(db: DB, application_name: str) -> list[str]:
    """The connections named like `application_name` (a LIKE pattern) holding an advisory lock (a duty's)."""
    return [name for (name,) in _all(
        db, "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()"
            " AND a.application_name LIKE %s", [application_name])]


def blocked(db: DB, pid: int) -> tuple[str, list[int]]:
    """A backend's statement and the backends it waits on."""
    found = _all(db, "SELECT query, pg_blocking_pids(pid) FROM pg_stat_activity WHERE pid = %s", [pid])
    assert found, f"no backend {pid}"
    return found[0][0], found[0][1]
