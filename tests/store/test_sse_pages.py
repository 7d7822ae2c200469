"""The SSE stream's reads of the journal (its catch-up and a client's replay) come in pages bounded by size as well
as by count: a spawn writes its CLI's stdout, a line can be 64 MiB, and 500 such rows in one read would take the
ingress's memory (ingress/stream.py `_read_since`, shared/sql/journal.sql `read_journal_page`)."""

from __future__ import annotations

import uuid

import pytest
from psycopg_pool import AsyncConnectionPool

from ingress import stream
from shared import journal
from shared.models import NewEvent
from shared.query import Queries
from shared.sql import queries as shared_sql


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
