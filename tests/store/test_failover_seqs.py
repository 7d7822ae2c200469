"""A database that comes back without seqs a process saw committed (what an asynchronous standby's promotion
looks like to the services), on one server: the journal's tail is cut and every session of the service ended,
so its next connections are new ones. The two-server failover is tests/fault/test_failover.py."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psycopg

from executor.journal.writer import JournalWriter
from shared.database import Database
from shared.failover import SEQS_LOST
from shared.models import NewEvent
from tests import tables
from tests.pg import DB
from tests.served import collect, ingress_server
from tests.wait import until


def _lose_tail(db: DB, keep: int, app: str) -> None:
    """The journal as a standby that replayed only up to `keep` has it, and `app`'s sessions ended."""
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # past the append-only trigger, as a replica is
        conn.execute("DELETE FROM journal WHERE seq > %s", [keep])
        conn.execute("UPDATE journal_head SET last_seq = %s", [keep])
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                     " AND application_name LIKE %s", [app + "%"])


def _seqs(db: DB) -> list[tuple[int, str]]:
    return [(seq, event_type) for seq, event_type in tables.records(db.admin_dsn, "seq", "event_type")]


async def _write_after_loss(db: DB, guard: bool) -> list[tuple[int, str]]:
    async with Database(db.executor_dsn, name="test-writer", guard_seqs=guard) as d:
        writer = JournalWriter(d.pool)
        await writer.start()
        try:
            appended = await writer.write([NewEvent("task.stderr", {"n": i}) for i in range(5)])
            assert appended.last_seq == 5
            _lose_tail(db, 2, "test-writer")
            await writer.write([NewEvent("task.stderr", {"n": "after"})])
        finally:
            await writer.flush_and_stop()
        if guard:
            assert [loss.as_dict()["lost"] for loss in d.seq_mark.losses] == [3]
    return _seqs(db)


async def test_a_head_found_below_a_seq_the_writer_saw_is_advanced_past_it_with_a_record_and_no_seq_reused(
    db: DB
) -> None:
    assert await _write_after_loss(db, guard=True) == [
        (1, "task.stderr"), (2, "task.stderr"), (6, SEQS_LOST), (7, "task.stderr")]
    (payload,) = tables.payloads(db.admin_dsn, SEQS_LOST)
    assert (payload["after"], payload["upto"], payload["lost"]) == (2, 5, 3)


async def test_without_the_guard_the_lost_seqs_would_be_given_again(db: DB) -> None:
    # the negative control of the test above: the same loss, a pool that does not check, seq 3 given twice
    assert await _write_after_loss(db, guard=False) == [(1, "task.stderr"), (2, "task.stderr"), (3, "task.stderr")]


async def test_the_ingress_finds_a_head_below_what_it_sent_says_so_in_readyz_and_its_clients_skip_no_new_seq(
    db: DB
) -> None:
    async with Database(db.executor_dsn, name="test-writer") as d:
        writer = JournalWriter(d.pool)
        await writer.start()
        try:
            await writer.write([NewEvent("task.stderr", {"n": i}) for i in range(5)])
            async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
                assert [e.id for e in await collect(http, 5, params={"after_seq": "0"})] == ["1", "2", "3", "4", "5"]
                assert "journal_lost" not in (await http.get("/readyz")).json()
                _lose_tail(db, 2, "petal-ingress")  # its listener reconnects: perhaps to another server

                async def named() -> list[dict[str, Any]] | None:
                    found: list[dict[str, Any]] | None = (await http.get("/readyz")).json().get("journal_lost")
                    return found

                lost = await until(named, "/readyz never named the loss", 30)
                assert [(x["after"], x["upto"], x["detected_by"]) for x in lost] == [(2, 5, "ingress")]
                # a client that was sent seq 5 goes on from there: it gets the seqs past the lost ones
                reader = asyncio.create_task(collect(http, 1, headers={"Last-Event-ID": "5"}))
                await asyncio.sleep(0.5)  # not a wait: the stream is open before the next append
                with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
                    conn.execute("UPDATE journal_head SET last_seq = 5")  # as the executor's guard leaves it
                await writer.write([NewEvent("task.stderr", {"n": "after"})])
                assert [e.id for e in await asyncio.wait_for(reader, 30)] == ["6"]
        finally:
            await writer.flush_and_stop()
