"""The ingress's reads of the journal — the SSE stream's catch-up and a client's replay, and the page's REST reads —
come in pages bounded by size as well as by count: a spawn writes its CLI's stdout, a line can be 64 MiB, and 500 such rows in one read would take the
ingress's memory (ingress/stream.py `_read_since`, shared/sql/journal.sql `read_journal_page`, ingress/reads.py `_sized`)."""

from __future__ import annotations

import uuid

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool

from ingress import reads, stream
from shared import journal
from shared.models import NewEvent
from shared.query import Queries
from shared.sql import queries as shared_sql
from tests import tables
from tests.pg import DB
from tests.served import ingress_server


async def _append(pool: AsyncConnectionPool, sizes: list[int]) -> None:
    await journal.append(pool, [NewEvent("task.stderr", {"line": "x" * n}, task_id=None) for n in sizes])


async def test_a_page_of_large_rows_is_cut_by_size_and_the_reads_still_bring_every_row_in_order(
        pool: AsyncConnectionPool, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = [10, 400_000, 400_000, 10, 700_000, 10, 10, 10, 400_000, 400_000, 10]
    await _append(pool, sizes)
    monkeypatch.setattr(stream, "PAGE_BYTES", 500_000)
    monkeypatch.setattr(stream, "PAGE", 4)
    q = Queries(pool, shared_sql)
    pages: list[list[int]] = []
    cut = 0  # pages that ended before the count did, with more to come
    after, more = 0, True
    while more:
        events, more = await stream._read_since(q, after)
        assert events, "a page past the head is the last one, never an empty one before it"
        pages.append([len(e.payload["line"]) for e in events])
        # what a page holds past its first row stays under the bound
        assert sum(pages[-1][:-1]) < 500_000
        cut += more and len(events) < 4
        after = events[-1].seq
    assert [n for page in pages for n in page] == sizes  # all of it, in order, once
    assert max(len(p) for p in pages) <= 4 and cut >= 2
    first, more = await stream._read_since(q, after)
    assert first == [] and not more


async def test_a_row_larger_than_the_bound_still_comes_alone(pool: AsyncConnectionPool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    await _append(pool, [2_000_000, 10])
    monkeypatch.setattr(stream, "PAGE_BYTES", 1_000)
    q = Queries(pool, shared_sql)
    events, more = await stream._read_since(q, 0)
    assert [len(e.payload["line"]) for e in events] == [2_000_000] and more
    events, more = await stream._read_since(q, events[-1].seq)
    assert [len(e.payload["line"]) for e in events] == [10] and not more
    assert isinstance(events[0].event_id, uuid.UUID)


async def test_the_pages_reads_are_bounded_by_size_too_and_page_on_to_every_record(
        db: DB, pool: AsyncConnectionPool, monkeypatch: pytest.MonkeyPatch) -> None:
    task = tables.insert_task(db.executor_dsn, status="running")
    thread = tables.insert_thread(db.executor_dsn)
    sizes = [10, 300_000, 300_000, 10, 10]
    await journal.append(pool, [NewEvent("task.stderr", {"line": "x" * n}, task_id=task) for n in sizes])
    await journal.append(pool, [NewEvent("thread.harness_message", {"text": "y" * n}, session_id=thread)
                                for n in sizes])
    monkeypatch.setattr(reads, "PAGE_BYTES", 500_000)
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        got: list[int] = []
        after, more, cut = 0, True, False
        while more:
            page = (await http.get(f"/api/tasks/{task}/events", params={"after_seq": after, "limit": 100})).json()
            got += [len(e["payload"]["line"]) for e in page["events"]]
            more, after = page["more"], page["next_after_seq"]
            cut |= more and len(page["events"]) < 100
            assert not {"rows_in_page", "bytes_before"} & set(page["events"][0])
        activity = (await http.get("/api/events", params={"limit": 100})).json()
        newest = (await http.get(f"/api/threads/{thread}/conversation", params={"limit": 100})).json()
        older = (await http.get(f"/api/threads/{thread}/conversation",
                                params={"limit": 100, "before_seq": newest["events"][0]["seq"]})).json()
    assert got == sizes and cut  # every record, in order, in pages the bound cut short
    assert len(activity["events"]) < 2 * len(sizes) and activity["more"] is True
    # the conversation keeps its newest records within the bound, says there is more, and pages back to the rest
    texts = [len(e["payload"]["text"]) for e in older["events"] + newest["events"]
             if e["event_type"] == "thread.harness_message"]
    assert newest["more"] is True and texts == sizes
