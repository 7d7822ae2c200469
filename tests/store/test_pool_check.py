"""The pool's checkout check: no round trip on a healthy connection, a dead one still replaced."""

from __future__ import annotations

import time

import psycopg

from shared.database import Database
from tests.pg import DB
from tests.wait import until


async def _last_query(admin_dsn: str, pid: int) -> str:
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as admin:
        cur = await admin.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
        row = await cur.fetchone()
        assert row is not None
        return str(row[0])


async def _gone(admin_dsn: str, pid: int) -> bool:
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as admin:
        cur = await admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid])
        return await cur.fetchone() is None


async def test_checking_out_a_healthy_connection_sends_nothing_to_the_server(db: DB) -> None:
    async with Database(db.executor_dsn, name="check-test", min_size=1, max_size=1) as database:
        async with database.pool.connection() as conn:
            pid = conn.info.backend_pid
            await conn.execute("SELECT 1 AS marker")
        async with database.pool.connection() as conn:
            assert conn.info.backend_pid == pid
            # the server's record of this backend's last statement is still ours, not a probe's ""
            assert await _last_query(db.admin_dsn, pid) == "SELECT 1 AS marker"


async def test_a_connection_whose_backend_was_terminated_is_replaced_at_checkout(db: DB) -> None:
    async with Database(db.executor_dsn, name="check-test", min_size=1, max_size=1) as database:
        async with database.pool.connection() as conn:
            pid = conn.info.backend_pid
        async with await psycopg.AsyncConnection.connect(db.admin_dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        # it has sent its FATAL message to the idle socket before it leaves the server's list of backends
        await until(lambda: _gone(db.admin_dsn, pid), "the terminated backend to exit", 30)
        async with database.pool.connection() as conn:
            cur = await conn.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
        assert row is not None and row[0] != pid


async def test_idle_connections_to_a_server_that_went_away_are_replaced_together_not_found_one_by_one(db: DB) -> None:
    async with Database(db.executor_dsn, name="check-test", min_size=1, max_size=3) as database:
        async with database.pool.connection() as a, database.pool.connection() as b, \
                database.pool.connection() as c:
            pids = [conn.info.backend_pid for conn in (a, b, c)]
        async with await psycopg.AsyncConnection.connect(db.admin_dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
        for pid in pids:
            await until(lambda: _gone(db.admin_dsn, pid), "the terminated backends to exit", 30)
        started = time.monotonic()
        async with database.pool.connection() as conn:
            cur = await conn.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
        took = time.monotonic() - started
    assert row is not None and row[0] not in pids
    # found one by one, the second and third dead ones would have cost psycopg_pool's check loop back-off:
    # at least 0.9 + 1.8 s (1 s and 2 s, less 10 % jitter)
    assert took < 2.5, took
