from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import psycopg

from shared import availability
from shared.availability import Availability
from shared.listener import RESYNC, Listener, Notification
from tests.pg import DB
from tests.proxy import FreezableProxy


async def _notify(dsn: str, channel: str, payload: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def _down(seen: Availability) -> bool:
    return seen.down  # read anew each time (an assert on the property narrows it for the type checker)


async def _next(sub_get: Awaitable[Notification], timeout: float = 10) -> Notification:
    return await asyncio.wait_for(sub_get, timeout)


async def test_subscribers_get_only_their_channels_and_a_resync_after_connecting(db: DB) -> None:
    listener = Listener(db.executor_dsn, ["a", "b"])
    only_b = listener.subscribe(["b"])
    runner = asyncio.create_task(listener.run())
    try:
        assert await _next(only_b.get()) is RESYNC
        await _notify(db.executor_dsn, "a", "1")
        await _notify(db.executor_dsn, "b", "2")
        assert await _next(only_b.get()) == Notification("b", "2")
    finally:
        runner.cancel()


async def test_listener_reconnects_after_its_backend_is_terminated_and_asks_for_a_catch_up(db: DB) -> None:
    listener = Listener(db.executor_dsn, ["journal"])
    sub = listener.subscribe()
    runner = asyncio.create_task(listener.run())
    try:
        assert await _next(sub.get()) is RESYNC
        first_pid = listener.backend_pid
        async with await psycopg.AsyncConnection.connect(db.admin_dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", [first_pid])

        assert await _next(sub.get()) is RESYNC
        assert listener.connects == 2 and listener.backend_pid != first_pid
        await _notify(db.executor_dsn, "journal", "7")
        assert await _next(sub.get()) == Notification("journal", "7")
    finally:
        runner.cancel()


async def test_a_reconnect_within_an_outages_settling_second_is_declared_back_once_the_server_speaks(
        db: DB) -> None:
    # A failover quicker than SETTLE_S: the reconnect's success is not taken as the outage's end (a connection
    # at an outage's edge may still work while the next fails), and a process that only listens (the
    # ingress) asked nothing else of the server that would say so: it stayed "down" for good.
    seen = Availability("test")
    listener = Listener(db.executor_dsn, ["journal"], availability=seen, probe_interval_s=0.2)
    sub = listener.subscribe()
    runner = asyncio.create_task(listener.run())
    try:
        assert await _next(sub.get()) is RESYNC
        async with await psycopg.AsyncConnection.connect(db.admin_dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", [listener.backend_pid])
        assert await _next(sub.get()) is RESYNC  # back within the settling second: not yet declared
        assert _down(seen) and seen.outages == 1
        await asyncio.sleep(availability.SETTLE_S)  # not a wait for a condition: the settling second passes
        await _notify(db.executor_dsn, "journal", "8")
        assert await _next(sub.get()) == Notification("journal", "8")  # declared back as it came in
        assert not _down(seen) and seen.outages == 1
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_a_silent_half_open_connection_fails_its_probe_and_is_replaced(db: DB) -> None:
    async with FreezableProxy(db.executor_dsn) as proxy:
        listener = Listener(proxy.dsn(), ["journal"], probe_interval_s=0.2, probe_timeout_s=0.5)
        sub = listener.subscribe()
        runner = asyncio.create_task(listener.run())
        try:
            assert await _next(sub.get()) is RESYNC
            proxy.freeze_existing()  # no FIN, no RST: the connection just goes quiet

            assert await _next(sub.get(), 15) is RESYNC
            assert listener.connects == 2
            await _notify(db.executor_dsn, "journal", "9")
            assert await _next(sub.get()) == Notification("journal", "9")
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)


async def test_a_subscriber_that_falls_behind_is_told_to_resync_instead_of_slowing_others(db: DB) -> None:
    listener = Listener(db.executor_dsn, ["journal"])
    slow = listener.subscribe()
    fast = listener.subscribe()
    slow.queue = asyncio.Queue(3)
    runner = asyncio.create_task(listener.run())
    try:
        assert await _next(fast.get()) is RESYNC
        for i in range(5):
            await _notify(db.executor_dsn, "journal", str(i))
        got = [await _next(fast.get()) for _ in range(5)]
        assert [n.payload for n in got] == ["0", "1", "2", "3", "4"]
        drained = []
        while not slow.queue.empty():
            drained.append(slow.queue.get_nowait())
        assert RESYNC in drained
    finally:
        runner.cancel()
