from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool

from shared import errors, journal
from shared.database import Database
from shared.models import NewEvent
from tests import tables
from tests.pg import DB, Cluster, lock_waiter


def _events(n: int, **kw: object) -> list[NewEvent]:
    # NewEvent's keyword fields, passed through
    return [NewEvent("task.stderr", {"line": f"line {i}"}, **kw) for i in range(n)]  # type: ignore[arg-type]


async def test_append_assigns_consecutive_seqs_in_the_given_order(pool: AsyncConnectionPool) -> None:
    first = await journal.append(pool, _events(3))
    second = await journal.append(pool, _events(2))

    assert (first.first_seq, first.last_seq) == (1, 3)
    assert (second.first_seq, second.last_seq) == (4, 5)
    async with pool.connection() as conn:
        events = await journal.read_since(conn, 0)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [e.payload["line"] for e in events] == ["line 0", "line 1", "line 2", "line 0", "line 1"]


async def test_payloads_with_nul_characters_are_kept_with_a_replacement(pool: AsyncConnectionPool) -> None:
    await journal.append(pool, [NewEvent("stream.unparsed", {"line": "a\x00b", "n\x00": ["\x00"]})])
    async with pool.connection() as conn:
        (event,) = await journal.read_since(conn, 0)
    assert event.payload == {"line": "a\ufffdb", "n\ufffd": ["\ufffd"]}


async def test_a_copied_batch_keeps_each_events_ids_time_and_text(pool: AsyncConnectionPool, db: DB) -> None:
    # past SMALL_BATCH the batch goes as COPY rows, where ids and times shared by many events are formatted
    # once per batch: each event must still get its own
    sessions = [tables.insert_thread(db.admin_dsn, role="worker", lifecycle="running") for _ in range(2)]
    tasks = [tables.insert_task(db.admin_dsn, session_id=s) for s in sessions]
    root = NewEvent("task.stderr", {"line": "root"})
    await journal.append(pool, [root])
    times = [datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC)]
    messages = [uuid.uuid4() for _ in range(3)]
    events = []
    for i, event_id in enumerate(journal.new_event_ids(journal.SMALL_BATCH + 10)):
        text = f'{{"line":\t"tab\\there \\\\ {i}"}}' if i % 2 else None
        events.append(NewEvent(
            "task.stderr", None if text else {"line": f"new\nline {i}"}, payload_json=text,
            session_id=sessions[i % 2], task_id=tasks[i % 2], parent_id=root.event_id if i % 3 else None,
            message_id=messages[i % 3], created_at=times[i // 40] if i % 5 else None, event_id=event_id))
    await journal.append(pool, events)

    async with pool.connection() as conn:
        _, *read = await journal.read_since(conn, 0)
    assert [(e.event_id, e.session_id, e.task_id, e.parent_id, e.message_id) for e in read] == [
        (e.event_id, e.session_id, e.task_id, e.parent_id, e.message_id) for e in events]
    assert all(e.created_at == ev.created_at for e, ev in zip(read, events, strict=True) if ev.created_at)
    assert [e.payload for e in read] == [
        {"line": f"tab\there \\ {i}"} if i % 2 else {"line": f"new\nline {i}"} for i in range(len(events))]


async def test_an_unknown_event_type_is_refused_with_its_name_and_nothing_is_written(
    pool: AsyncConnectionPool,
) -> None:
    batch = [*_events(2), NewEvent("worker.sneezed", {}), NewEvent("handoff", {}, tier="raw")]
    with pytest.raises(errors.UnknownEventType) as caught:
        await journal.append(pool, batch)

    assert caught.value.pairs == [("handoff", "raw"), ("worker.sneezed", "raw")]
    assert "INSERT INTO event_types" in str(caught.value)
    async with pool.connection() as conn:
        assert await journal.read_since(conn, 0) == []
        assert await journal.head(conn) == 0

    await journal.register_event_type(pool, "worker.sneezed", "raw", "a test type")
    appended = await journal.append(pool, [NewEvent("worker.sneezed", {})])
    assert appended.first_seq == 1


async def test_a_batch_that_fails_midway_leaves_no_rows_and_no_hole_in_seq(pool: AsyncConnectionPool) -> None:
    missing_task = uuid.uuid4()
    with pytest.raises(errors.JournalWriteError):
        await journal.append(pool, [*_events(5), NewEvent("task.stderr", {}, task_id=missing_task)])
    appended = await journal.append(pool, _events(1))
    assert appended.first_seq == 1


async def test_append_notifies_journal_once_per_batch_with_the_last_seq(
    executor_db: Database, pool: AsyncConnectionPool
) -> None:
    listener = executor_db.listener(["journal"])
    sub = listener.subscribe(["journal"])
    runner = asyncio.create_task(listener.run())
    try:
        assert (await asyncio.wait_for(sub.get(), 10)).payload == "resync"
        await journal.append(pool, _events(4))
        await journal.append(pool, _events(2))
        notes = [await asyncio.wait_for(sub.get(), 10) for _ in range(2)]
    finally:
        runner.cancel()
    assert [(n.channel, n.payload.partition(" ")[0]) for n in notes] == [("journal", "4"), ("journal", "6")]
    # a small batch's notification carries its rows as stored (the SSE fan-out sends them without a read)
    carried = [[row["seq"] for row in json.loads(n.payload.partition(" ")[2])] for n in notes]
    assert carried == [[1, 2, 3, 4], [5, 6]]
    assert sub.queue.empty()


async def test_a_batch_too_large_for_a_notification_notifies_its_last_seq_alone(
    executor_db: Database, pool: AsyncConnectionPool
) -> None:
    listener = executor_db.listener(["journal"])
    sub = listener.subscribe(["journal"])
    runner = asyncio.create_task(listener.run())
    try:
        assert (await asyncio.wait_for(sub.get(), 10)).payload == "resync"
        await journal.append(pool, [NewEvent("task.stderr", {"line": "x" * 9000})])
        note = await asyncio.wait_for(sub.get(), 10)
    finally:
        runner.cancel()
    assert note.payload == "1"  # past NOTIFY's 8000-byte cap: readers read the row


async def test_append_survives_its_connection_dropping_mid_batch_and_writes_the_batch_once(db: DB) -> None:
    async with Database(db.executor_dsn, name="dropped-appender", max_size=2) as appender:
        blocker = await psycopg.AsyncConnection.connect(db.admin_dsn)
        # Hold the head's lock so the append is caught inside its transaction, then kill its backend.
        await blocker.execute("SELECT * FROM journal_head FOR UPDATE")
        batch = _events(50)
        task = asyncio.create_task(journal.append(appender.pool, batch))
        pid = await lock_waiter(db.admin_dsn, "application_name = %s", ["dropped-appender"])
        async with await psycopg.AsyncConnection.connect(db.admin_dsn, autocommit=True) as killer:
            await killer.execute("SELECT pg_terminate_backend(%s)", [pid])
        await blocker.commit()
        await blocker.close()

        appended = await asyncio.wait_for(task, 30)

        async with appender.pool.connection() as conn:
            events = await journal.read_since(conn, 0)
    assert (appended.first_seq, appended.last_seq) == (1, 50)
    assert [e.event_id for e in events] == [e.event_id for e in batch]


async def test_a_retry_after_a_lost_commit_acknowledgement_returns_the_existing_seqs(
    pool: AsyncConnectionPool,
) -> None:
    batch = _events(3)
    await journal.append(pool, batch)
    async with pool.connection() as conn:
        found = await journal._already_written(conn, batch)
    assert found == journal.Appended(1, 3)


async def _scenario(dsn: str, batches: list[list[int]]) -> None:
    total = sum(sum(w) for w in batches)
    done = asyncio.Event()
    seen: list[int] = []

    async def writer(sizes: list[int]) -> None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as p:
            for n in sizes:
                await journal.append(p, _events(n))

    async def reader() -> None:
        # Every read must continue exactly where the last one stopped: no gap that fills later.
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            last = 0
            while True:
                events = await journal.read_since(conn, last, limit=50)
                for e in events:
                    assert e.seq == last + 1, f"reader saw seq {e.seq} right after {last}"
                    last = e.seq
                    seen.append(e.seq)
                if done.is_set() and not events and last == total:
                    return
                await asyncio.sleep(0)  # not a wait: a turn for the writers between reads

    read = asyncio.create_task(reader())
    await asyncio.gather(*(writer(w) for w in batches))
    done.set()
    await asyncio.wait_for(read, 60)
    assert seen == list(range(1, total + 1))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=12), min_size=4, max_size=4))
def test_seq_is_gap_free_for_a_reader_while_four_writers_append_concurrently(
    cluster: Cluster, batches: list[list[int]]
) -> None:
    db = cluster.create_migrated()
    try:
        asyncio.run(_scenario(db.executor_dsn, batches))
    finally:
        cluster.drop(db)
