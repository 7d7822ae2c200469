"""The thread and task lists a page at a time: newest first, keyset cursors that neither skip nor repeat a
row (rows made in the same instant included), threads still being made on the first page only, and a cursor
that is not one the list gave refused."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from tests import tables
from tests.pg import DB
from tests.served import ingress_server

pytestmark = pytest.mark.store


@pytest.fixture
async def http(db: DB) -> AsyncIterator[httpx.AsyncClient]:
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        yield client


def _seed(db: DB) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """Seven threads and nine tasks, three of each made in one instant: their ids newest first."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        threads = [tables.insert_thread(conn, title=f"t{i}", created_at=start + timedelta(minutes=min(i, 4)))
                   for i in range(7)]
        tasks = [tables.insert_task(conn, brief=f"b{i}", status="success",
                                    created_at=start + timedelta(minutes=min(i, 6))) for i in range(9)]
        tables.insert(conn, "thread_control_queue", thread_id=uuid.uuid4(), action="create",
                      args={"title": "being made"})
    def newest_first(ids: list[uuid.UUID], minutes: list[int]) -> list[uuid.UUID]:
        return [i for _, i in sorted(zip(minutes, ids, strict=True), key=lambda p: (p[0], p[1].hex), reverse=True)]
    return (newest_first(threads, [min(i, 4) for i in range(7)]), newest_first(tasks, [min(i, 6) for i in range(9)]))


async def _walk(http: httpx.AsyncClient, path: str, key: str, limit: int) -> list[list[dict[str, Any]]]:
    pages, before = [], None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"before": before} if before else {})}
        got = (await http.get(path, params=params)).json()
        pages.append(got[key])
        before = got["next_before"]
        if before is None:
            return pages
        assert len(pages) < 20, "the cursor does not move"


async def test_threads_and_tasks_page_newest_first_without_a_gap_or_a_repeat(db: DB, http: httpx.AsyncClient) -> None:
    threads, tasks = _seed(db)
    thread_pages = await _walk(http, "/api/threads", "threads", 3)
    task_pages = await _walk(http, "/api/tasks", "tasks", 2)
    whole = (await http.get("/api/threads")).json()
    # the thread being made leads the first page, and only the first
    assert thread_pages[0][0]["title"] == "being made" and thread_pages[0][0]["pending"] is True
    assert [uuid.UUID(t["id"]) for page in thread_pages for t in page if not t["pending"]] == threads
    assert [len(p) for p in thread_pages] == [3, 3, 2] and whole["next_before"] is None
    assert [uuid.UUID(t["id"]) for page in task_pages for t in page] == tasks
    assert [len(p) for p in task_pages] == [2, 2, 2, 2, 1]


async def test_a_cursor_the_list_did_not_give_is_refused_and_a_limit_past_the_bound_too(
    db: DB, http: httpx.AsyncClient
) -> None:
    _seed(db)
    for path in ("/api/threads", "/api/tasks"):
        bad = await http.get(path, params={"before": "not-a-cursor"})
        assert bad.status_code == 400 and "next_before" in bad.json()["detail"], bad.text
        over = await http.get(path, params={"limit": 1001})
        assert over.status_code == 400 and "limit" in over.json()["detail"], over.text
