"""A task's statuses are defined once: the code's constants are the `task_statuses` table's rows."""

from __future__ import annotations

import psycopg

from shared.models import ACTIVE_STATUSES, FINAL_STATUSES
from tests.pg import DB


def test_the_status_constants_are_the_task_statuses_table(db: DB) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT name, final FROM task_statuses").fetchall()
    assert sorted(name for name, final in rows if final) == sorted(FINAL_STATUSES)
    assert sorted(name for name, final in rows if not final) == sorted(ACTIVE_STATUSES)
