"""request_task on a real PostgreSQL: the row and its record commit together or not at all, and a task is
run again at most once."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from executor.settle import dispatch
from executor.settle.dispatch import TaskRequest
from executor.sql import queries
from shared.query import Queries
from shared.work import work


async def _row_and_records(pool: AsyncConnectionPool, task_id: uuid.UUID) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    q = Queries(pool, {"get": "SELECT status, attempt, retry_of, not_before IS NOT NULL AS waits, required_labels "
                              "FROM tasks WHERE id = %(id)s",
                       "records": "SELECT event_type, payload FROM journal WHERE task_id = %(id)s ORDER BY seq"})
    return await q.one("get", {"id": task_id}), await q.all("records", {"id": task_id})


async def test_the_row_and_its_record_commit_together(pool: AsyncConnectionPool) -> None:
    task_id = await dispatch.request(pool, TaskRequest("worker", "count", labels=("gpu",), requested_by="a test"))
    row, records = await _row_and_records(pool, task_id)
    assert row == {"status": "pending", "attempt": 1, "retry_of": None, "waits": False, "required_labels": ["gpu"]}
    assert [(r["event_type"], r["payload"]["requested_by"]) for r in records] == [
        ("task.dispatch_requested", "a test")]


async def test_a_unit_of_work_that_fails_leaves_neither_the_row_nor_the_record(pool: AsyncConnectionPool) -> None:
    asked = TaskRequest("worker", "count")
    with pytest.raises(RuntimeError):
        async with work(Queries(pool, queries)) as unit:
            await dispatch.request_task(unit, asked)
            raise RuntimeError("after the request")
    assert await _row_and_records(pool, asked.id) == (None, [])


async def test_a_task_is_run_again_at_most_once(pool: AsyncConnectionPool) -> None:
    first = await dispatch.request(pool, TaskRequest("worker", "count"))
    async with work(Queries(pool, queries)) as unit:
        again = await dispatch.request_task(unit, await dispatch.retry_request(unit, first, requested_by="policy"))
    async with work(Queries(pool, queries)) as unit:
        twice = await dispatch.retry_request(unit, first, requested_by="policy")
        with pytest.raises(dispatch.AlreadyRepeated):
            await dispatch.request_task(unit, twice)
    row, records = await _row_and_records(pool, again)
    assert row is not None and (row["attempt"], row["retry_of"], row["waits"]) == (2, first, True)
    assert [r["payload"]["retry_of"] for r in records] == [str(first)]
    assert await _row_and_records(pool, twice.id) == (None, [])
