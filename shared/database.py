"""The one object per process that owns the connection pool and the LISTEN connection, and knows whether
the database is there.

An outage of any length is a state, not an error: every loop that meets one reports it to the pool's
`Availability` and waits (with back-off) instead of ending; the process says once that the database went
away and once that it came back, and `/readyz` names the cause meanwhile.

A failover is such an outage, ended by a different server: every connection asks for a primary
(`failover.primary_dsn`: a multi-host DSN skips a standby, a server in recovery is refused and retried), and
the journal's writer checks each new connection's journal head against the seqs it saw (`failover`).
"""

from __future__ import annotations

import asyncio
import logging
import select
import time
import types
from typing import Any, Literal, TypedDict, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from shared import failover, logs, migrate
from shared.availability import OUTAGE_ERRORS as OUTAGE_ERRORS
from shared.availability import Availability as Availability
from shared.listener import Listener

log = logs.get(__name__)
T = TypeVar("T")
StartMode = Literal["fail", "wait", "serve"]

class _Keepalives(TypedDict):  # libpq's keepalive parameters, as psycopg's connect() takes them
    keepalives: int
    keepalives_idle: int
    keepalives_interval: int
    keepalives_count: int


# Detect half-open TCP connections (a phone-network style drop) instead of waiting on them forever.
KEEPALIVE_KWARGS = _Keepalives(keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3)
# A connection attempt to a server that is away gives up after this long (libpq's minimum is 2 s).
CONNECT_TIMEOUT_S = 3
# Waiting for a pooled connection: a request handler must answer 503 within a few seconds, not hang.
ACQUIRE_TIMEOUT_S = 30.0
# The pool gives up one reconnection series after this long and starts a fresh one on the next request,
# so after a long outage it reconnects at once instead of sleeping out a back-off grown to minutes.
RECONNECT_TIMEOUT_S = 2.0
POOL_OPEN_TIMEOUT_S = 30.0
# A checkout that finds a dead connection replaces every idle one, at most this often (a flapping server
# would otherwise have the pool reconnect at each checkout).
DRAIN_EVERY_S = 1.0
# The pool logs every failed attempt; Availability says it once per outage instead.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


class Pool(AsyncConnectionPool):
    """The process's pool, carrying its view of the database's availability to whoever holds the pool."""

    availability: Availability
    seq_mark: failover.SeqMark

    async def reconnect_failed(self) -> None:
        """A series of connection attempts gave up (RECONNECT_TIMEOUT_S). psycopg_pool starts the next one only
        for the next request, so a request already waiting (the journal writer's append, while a standby is
        promoted) would sit out its whole acquire timeout though the database may be back: start it now."""
        grow = getattr(self, "_maybe_grow_pool", None)  # psycopg_pool's own, where it has one
        if self.closed or grow is None or not getattr(self, "_waiting", None):
            return
        async with self._lock:
            grow()


def availability(pool: AsyncConnectionPool) -> Availability:
    """The availability tracker of a pool made by `Database` (a throwaway one for any other pool)."""
    found = getattr(pool, "availability", None)
    return found if isinstance(found, Availability) else Availability(pool.name)


async def pause(pool: AsyncConnectionPool, exc: BaseException, where: str) -> None:
    """For loops that hold only the pool: report an outage error and wait out the back-off."""
    await availability(pool).pause(exc, where)


class Database:
    """Owns the pool and the listener of one process; everything else receives it as an argument."""

    def __init__(self, dsn: str, *, name: str, min_size: int = 1, max_size: int = 8,
                 acquire_timeout_s: float = ACQUIRE_TIMEOUT_S, at_start: StartMode = "fail",
                 stop: asyncio.Event | None = None, guard_seqs: bool = False):
        """`at_start`, when the database is away as the pool opens: "fail" after POOL_OPEN_TIMEOUT_S (a
        command), "wait" for it as long as it takes (the executor), or "serve" at once and connect when
        asked (the ingress, whose requests answer 503 meanwhile). `stop` ends that wait early.
        `guard_seqs`: this process appends to the journal; each new connection checks that the server has
        every seq it saw committed (`failover.guard_journal_head`)."""
        self.dsn = failover.primary_dsn(dsn)
        self.at_start = at_start
        self._stop = stop
        self.name = name
        self.availability = Availability(name)
        self.seq_mark = failover.SeqMark(name)
        self.pool = Pool(
            self.dsn,
            min_size=min_size,
            max_size=max_size,
            open=False,
            name=name,
            timeout=acquire_timeout_s,
            reconnect_timeout=RECONNECT_TIMEOUT_S,
            check=self._check,
            configure=self._guard if guard_seqs else None,
            # autocommit: a single statement commits by itself; multi-statement work says
            # `async with conn.transaction()`, so no connection sits idle in a transaction
            kwargs={"application_name": name, "autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S,
                    **KEEPALIVE_KWARGS},
        )
        self.pool.availability = self.availability
        self.pool.seq_mark = self.seq_mark
        self._listener: Listener | None = None
        self._drained_at = -DRAIN_EVERY_S

    async def _check(self, conn: psycopg.AsyncConnection) -> None:
        try:
            await check_connection(conn)
        except psycopg.Error:
            # One idle connection found dead: its siblings went to the same server (a restart, a failover).
            # Found one by one, each would cost the request a longer wait (psycopg_pool's check loop backs off
            # 1 s, 2 s, 4 s … between them): replace them all at once instead.
            now = time.monotonic()
            drain = getattr(self.pool, "drain", None)  # psycopg_pool >= 3.2.2
            if drain is not None and now - self._drained_at >= DRAIN_EVERY_S:
                self._drained_at = now
                await drain()
            raise

    async def _guard(self, conn: psycopg.AsyncConnection) -> None:
        # a failure here is the connection's: the pool discards it and tries again
        await failover.guard_journal_head(conn, self.seq_mark)

    def listener(self, channels: list[str]) -> Listener:
        """The process's LISTEN connection (created once; run it with `await listener.run()`)."""
        if self._listener is None:
            self._listener = Listener(
                self.dsn, channels, application_name=f"{self.name}-listen",
                connect_kwargs={"connect_timeout": CONNECT_TIMEOUT_S, **KEEPALIVE_KWARGS},
                availability=self.availability, seq_mark=self.seq_mark,
            )
        return self._listener

    async def open(self, *, wait: bool = True) -> None:
        """Open the pool. `wait`: fail unless the database answers within POOL_OPEN_TIMEOUT_S (commands);
        without it the pool opens at once and connects when asked (services, which wait out an outage)."""
        if wait:
            await self.pool.open(wait=True, timeout=POOL_OPEN_TIMEOUT_S)
        else:
            await self.pool.open(wait=False)

    async def wait_available(self, stop: asyncio.Event | None = None) -> bool:
        """Wait until a connection succeeds; False if `stop` was set first."""
        while stop is None or not stop.is_set():
            try:
                conn = await connect(self.dsn)
            except OUTAGE_ERRORS as exc:
                await self.availability.pause(exc, "connect", stop)
                continue
            await conn.close()
            self.availability.succeeded()
            return True
        return False

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
        await self.pool.close()

    async def __aenter__(self) -> Database:
        if self.at_start == "wait":
            await self.wait_available(self._stop)
        await self.open(wait=self.at_start == "fail")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        await self.close()


async def connect(dsn: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.AsyncConnection:
    """A single connection outside the pool (CLI commands, tests)."""
    kwargs = {"connect_timeout": CONNECT_TIMEOUT_S, **KEEPALIVE_KWARGS, **kwargs}
    return await psycopg.AsyncConnection.connect(failover.primary_dsn(dsn), autocommit=autocommit, **kwargs)


def wait_for_schema(dsn: str, name: str) -> None:
    """A service's start-up check that the schema is current, waiting out an outage (with back-off)
    instead of exiting. Blocking: call it before the event loop starts.

    Raises:
        MigrationError: migrations are pending.
    """
    waiting = Availability(name)
    while True:
        try:
            migrate.require_current(failover.primary_dsn(dsn))
        except OUTAGE_ERRORS as exc:
            time.sleep(waiting.failed(exc, "start"))
            continue
        waiting.succeeded()
        return



async def check_connection(conn: psycopg.AsyncConnection) -> None:
    """The pool's check at each checkout, with a round trip only when there is something to suspect.

    A server that went away (a restart, a terminated backend) leaves the idle connection's socket
    readable with its FATAL message or EOF; a healthy idle connection has nothing to read. Probing
    every checkout instead (psycopg_pool's `check_connection`) doubled the round trips of short queries.
    """
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        await AsyncConnectionPool.check_connection(conn)
