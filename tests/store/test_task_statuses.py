"""A task's statuses are defined once: the code's constants are the `task_statuses` table's rows."""

from __future__ import annotations

from shared.models import ACTIVE_STATUSES, FINAL_STATUSES
from tests import tables
from tests.pg import DB


def test_the_status_constants_are_the_task_statuses_table(db: DB) -> None:
    rows = tables.rows(db.admin_dsn, "task_statuses", "name", "final", order=("name",))
    assert sorted(name for name, final in rows if final) == sorted(FINAL_STATUSES)
    assert sorted(name for name, final in rows if not final) == sorted(ACTIVE_STATUSES)
