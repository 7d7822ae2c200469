from __future__ import annotations

import asyncio
import uuid

import pytest
from psycopg_pool import AsyncConnectionPool

from executor.journal.writer import JournalWriter
from shared import errors, journal
from shared.models import Event, NewEvent
from tests import tables
from tests.pg import DB


async def _all(pool: AsyncConnectionPool) -> list[Event]:
    async with pool.connection() as conn:
        return await journal.read_since(conn, 0, limit=10_000)


async def test_events_put_by_several_producers_land_in_the_order_they_were_put(pool: AsyncConnectionPool) -> None:
    writer = JournalWriter(pool, max_batch=7)
    await writer.start()
    for i in range(30):
        await writer.put_many([NewEvent("task.stderr", {"i": i, "j": j}) for j in range(3)])
    await writer.put(NewEvent("task.stderr", {"i": 30, "j": 0}))
    await writer.flush_and_stop()

    events = await _all(pool)
    assert [(e.payload["i"], e.payload["j"]) for e in events] == [(i, j) for i in range(30) for j in range(3)] + [(30, 0)]
    assert [e.seq for e in events] == list(range(1, 92))


async def test_a_refused_event_fails_alone_and_the_rest_of_its_batch_is_written_in_order(
    pool: AsyncConnectionPool,
) -> None:
    writer = JournalWriter(pool)
    await writer.start()
    good_before = [NewEvent("task.stderr", {"n": i}) for i in range(5)]
    bad = NewEvent("task.stderr", {"n": "bad"}, task_id=uuid.uuid4())  # no such task
    good_after = [NewEvent("task.stderr", {"n": i}) for i in range(5, 9)]
    await writer.put_many(good_before)
    with pytest.raises(errors.JournalRefused):
        await writer.write([bad])
    await writer.put_many(good_after)
    await writer.flush_and_stop()

    assert [e.payload["n"] for e in await _all(pool)] == list(range(9))


async def test_a_stream_type_first_seen_at_run_time_is_registered_not_dropped(pool: AsyncConnectionPool,
                                                                              db: DB) -> None:
    writer = JournalWriter(pool)
    await writer.start()
    await writer.write([NewEvent("stream.brand_new_kind", {"type": "brand_new_kind"})])
    await writer.flush_and_stop()

    assert tables.rows(db.admin_dsn, "event_types", "tier", order=("name",),
                       name="stream.brand_new_kind") == [("raw",)]
    assert [e.event_type for e in await _all(pool)] == ["stream.brand_new_kind"]


async def test_small_and_large_batches_take_different_paths_with_the_same_result(pool: AsyncConnectionPool) -> None:
    small = [NewEvent("task.stderr", {"k": "small", "tab": "a\tb", "nl": "x\ny", "bs": "c:\\d"}) for _ in range(3)]
    large = [NewEvent("task.stderr", {"k": "large", "tab": "a\tb", "nl": "x\ny", "bs": "c:\\d"})
             for _ in range(journal.SMALL_BATCH + 1)]
    await journal.append(pool, small)
    await journal.append(pool, large)
    events = await _all(pool)
    assert {(e.payload["tab"], e.payload["nl"], e.payload["bs"]) for e in events} == {("a\tb", "x\ny", "c:\\d")}
    assert [e.seq for e in events] == list(range(1, len(small) + len(large) + 1))


async def test_producers_wait_once_two_batches_are_held_and_go_on_as_they_are_written(
    pool: AsyncConnectionPool,
) -> None:
    # the database keeps up no faster for a longer queue; what is held past the next batch only crowds the
    # event loop, so a flood waits in the processes' pipes instead
    writer = JournalWriter(pool, max_batch=7)
    for i in range(14):
        await writer.put(NewEvent("task.stderr", {"n": i}))
    blocked = asyncio.ensure_future(writer.put(NewEvent("task.stderr", {"n": 14})))
    await asyncio.sleep(0.3)  # a window in which the blocked producer must not get through
    assert not blocked.done()
    await writer.start()  # the writer drains: room again
    await asyncio.wait_for(blocked, 5)
    await writer.flush_and_stop()
    assert [e.payload["n"] for e in await _all(pool)] == list(range(15))
