"""A thread's reads cost what the thread holds, not what the store holds: its tasks and its usage are picked by
their indexes, never found by walking every task (tests/store/test_query_plans.py checks the journal's side;
a year's store has 20,000 tasks, and a walk of them was most of the page's slowest reads on it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ingress.sql import queries as ingress_sql
from shared import journal
from shared.models import NewEvent
from shared.sql import queries as shared_sql
from tests import tables
from tests.pg import DB, Cluster

OTHER_THREADS, TURNS = 500, 5
TASKS_EACH = 2 * TURNS  # a thread's task list: its turns and their workers (an extractor is its worker's)
# a read that picks the thread's rows touches tens of task and session rows; a walk touches thousands
MAX_ROWS = 200
# the shape of the reads before they were picked by index, kept as the check's negative control
WALKING_TASK_LIST = """SELECT t.id FROM tasks t
WHERE t.session_id = %(thread_id)s::uuid OR t.parent_task_id IN (SELECT id FROM tasks WHERE session_id = %(thread_id)s::uuid)
ORDER BY t.created_at DESC, t.id DESC LIMIT %(limit)s"""


@pytest.fixture(scope="module")
def store(cluster: Cluster) -> Iterator[tuple[DB, Any]]:
    """Many threads of five turns, each with a worker and the worker's extractor, and one more to read; a result
    line for every run."""
    db = cluster.create_migrated()
    try:
        with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
            conn.execute("""
                WITH th AS (INSERT INTO sessions (role, lifecycle)
                            SELECT 'orchestrator', 'running' FROM generate_series(1, %s) RETURNING id),
                     turns AS (INSERT INTO tasks (session_id, role, status)
                               SELECT th.id, 'orchestrator', 'success' FROM th, generate_series(1, %s) RETURNING id),
                     workers AS (INSERT INTO tasks (role, status, parent_task_id)
                                 SELECT 'worker', 'success', id FROM turns RETURNING id)
                INSERT INTO tasks (role, status, parent_task_id) SELECT 'extractor', 'success', id FROM workers""",
                         [OTHER_THREADS + 1, TURNS])
            thread = conn.execute("SELECT id FROM sessions WHERE role = 'orchestrator' ORDER BY created_at DESC, id "
                                  "LIMIT 1").fetchone()[0]  # type: ignore[index]
            tasks = tables.tasks(conn, "id", "session_id")
        asyncio.run(_results(db.executor_dsn, tasks))
        with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
            conn.execute("ANALYZE")
        yield db, thread
    finally:
        cluster.drop(db)


async def _results(dsn: str, tasks: list[Any]) -> None:
    """A result line for every run, as every run ends with one: what usage sums (and what tempted the planner
    to start from the journal's result lines and hash every task to place them)."""
    result = {"usage": {"input_tokens": 10, "output_tokens": 5}, "total_cost_usd": 0.01}
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await journal.append_on(conn, [NewEvent("stream.result", result, task_id=t, session_id=s) for t, s in tasks])


def _rows_read(plan: dict[str, Any], relations: tuple[str, ...]) -> int:
    def nodes(p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield p
        for child in p.get("Plans", ()):
            yield from nodes(child)
    return sum(round((n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1))
               for n in nodes(plan) if n.get("Relation Name") in relations)


def _plan(db: DB, sql: str, params: dict[str, Any]) -> tuple[dict[str, Any], int]:
    with psycopg.connect(db.admin_dsn) as conn:
        row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return plan, round(plan.get("Actual Rows", 0))


CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "a thread's tasks": (ingress_sql["list_thread_tasks"], {"status": None, "running": None, "limit": 500,
                                                             "before_at": None, "before_id": None}),
    "a thread's usage": (shared_sql["list_thread_usage"], {"by": "thread", "task_id": None, "project_id": None}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_threads_read_touches_its_own_rows_not_every_tasks(store: tuple[DB, Any], case: str) -> None:
    db, thread = store
    sql, params = CASES[case]
    plan, returned = _plan(db, sql, {**params, "thread_id": thread})
    assert returned == (TASKS_EACH if case == "a thread's tasks" else 1)  # usage: one row, the thread's
    read = _rows_read(plan, ("tasks", "sessions"))
    assert read <= MAX_ROWS, f"{case} read {read} task and session rows: {json.dumps(plan)[:3000]}"


@pytest.mark.parametrize("by", ["thread", "task", "project", "day"])
def test_a_threads_usage_sums_what_the_every_run_query_sums_for_it(store: tuple[DB, Any], by: str) -> None:
    db, thread = store
    params = {"by": by, "task_id": None, "thread_id": thread, "project_id": None}
    with psycopg.connect(db.admin_dsn) as conn:
        picked = conn.execute(shared_sql["list_thread_usage"], params).fetchall()
        placed = conn.execute(shared_sql["list_usage"], params).fetchall()
    assert picked == placed
    # its turns, their workers and the workers' extractors: 15 runs
    assert sum(r[1] for r in picked) == 3 * TURNS


@pytest.mark.parametrize(("shape", "sql"), [("task list", WALKING_TASK_LIST), ("usage", shared_sql["list_usage"])])
def test_the_check_catches_a_walk_of_every_task(store: tuple[DB, Any], shape: str, sql: str) -> None:
    # negative controls: the task list as it was read, and the every-run usage query given the thread
    db, thread = store
    plan, returned = _plan(db, sql, {"thread_id": thread, "limit": 500, "by": "thread", "task_id": None,
                                     "project_id": None})
    assert returned == (TASKS_EACH if shape == "task list" else 1)
    assert _rows_read(plan, ("tasks", "sessions")) > 10 * MAX_ROWS
