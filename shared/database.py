"""The one object per process that owns the connection pool and the LISTEN connection."""

from __future__ import annotations

import select
import types

import psycopg
from psycopg_pool import AsyncConnectionPool

from shared.listener import Listener

# Detect half-open TCP connections (a phone-network style drop) instead of waiting on them forever.
KEEPALIVE_KWARGS = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
POOL_OPEN_TIMEOUT_S = 30.0


class Database:
    """Owns the pool and the listener of one process; everything else receives it as an argument."""

    def __init__(self, dsn: str, *, name: str, min_size: int = 1, max_size: int = 8):
        self.dsn = dsn
        self.name = name
        self.pool = AsyncConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            open=False,
            name=name,
            check=check_connection,
            # autocommit: a single statement commits by itself; multi-statement work says
            # `async with conn.transaction()`, so no connection sits idle in a transaction
            kwargs={"application_name": name, "autocommit": True, **KEEPALIVE_KWARGS},
        )
        self._listener: Listener | None = None

    def listener(self, channels: list[str]) -> Listener:
        """The process's LISTEN connection (created once; run it with `await listener.run()`)."""
        if self._listener is None:
            self._listener = Listener(
                self.dsn, channels, application_name=f"{self.name}-listen", connect_kwargs=KEEPALIVE_KWARGS
            )
        return self._listener

    async def open(self) -> None:
        await self.pool.open(wait=True, timeout=POOL_OPEN_TIMEOUT_S)

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
        await self.pool.close()

    async def __aenter__(self) -> Database:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        await self.close()


async def connect(dsn: str, *, autocommit: bool = True) -> psycopg.AsyncConnection:
    """A single connection outside the pool (CLI commands, tests)."""
    return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, **KEEPALIVE_KWARGS)


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
