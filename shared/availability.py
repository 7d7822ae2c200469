"""Whether a process can reach the database: an outage is a state (said once when it begins and once when
it ends, the cause kept for /readyz), and every loop that meets one waits it out with back-off."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from psycopg import errors as pgerrors

from shared import aio, logs
from shared.errors import Contended, DatabaseUnavailable
from shared.query import CONTENDED_PG

log = logs.get(__name__)
T = TypeVar("T")

# Waits between attempts while the database is away, growing to the last value and staying there.
OUTAGE_DELAYS_S = (0.5, 1.0, 2.0, 3.0, 5.0)
# A success this soon after a failure does not end an outage (connections die one by one at its start).
SETTLE_S = 1.0
# A failure this soon after the database came back is the outage's tail (a request that began before).
TAIL_S = 5.0

# What "the database is away" looks like: a lost or refused connection, a server shutting down or
# starting up, a pool that found no connection in time (PoolTimeout is an OperationalError). A loop that
# meets one waits and tries again; so it does for a transaction aborted for a concurrent one (CONTENDED),
# which is no outage: `Availability.failed` tells them apart. A write refused by a server in recovery (25006:
# a standby, reached through a DSN that allows one) is an outage too: a primary is waited for, never a retry there.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (psycopg.OperationalError, OSError, DatabaseUnavailable, Contended,
                                              pgerrors.ReadOnlySqlTransaction)
# A deadlock (40P01) or serialization failure (40001): the database is there and chose a victim; retry soon.
CONTENDED: tuple[type[Exception], ...] = (*CONTENDED_PG, Contended)
CONTENDED_RETRY_S = 0.1



class Availability:
    """Whether this process can reach the database: said once when it goes away and once when it
    returns, whoever notices; the cause is kept for /readyz."""

    def __init__(self, name: str):
        self.name = name
        self.down_since: float | None = None  # time.time() of the first failure of this outage
        self.cause: str | None = None
        self.failures = 0
        self.outages = 0
        self._last_failure = 0.0
        self._recovered_at = -TAIL_S

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, exc: BaseException, where: str) -> float:
        """Record a failure; returns how long to wait before the next attempt."""
        if isinstance(exc, CONTENDED):  # not an outage: nothing to declare, the next attempt soon
            log.info("transaction_contended", service=self.name, where=where, error=str(exc).strip()[:200])
            return CONTENDED_RETRY_S
        self.cause = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        self._last_failure = time.monotonic()
        if self.down_since is None and self._last_failure - self._recovered_at < TAIL_S:
            # a request that began before the database returned (the pool reconnects a moment later
            # than the listener): the same outage's tail, already reported; a real new one persists
            delay = OUTAGE_DELAYS_S[min(self.failures, len(OUTAGE_DELAYS_S) - 1)]
            self.failures += 1
            return delay
        if self.down_since is None:
            self.down_since = time.time()
            self.outages += 1
            log.warning("database_unavailable", service=self.name, where=where, error=self.cause,
                        note="waiting for it with back-off")
        delay = OUTAGE_DELAYS_S[min(self.failures, len(OUTAGE_DELAYS_S) - 1)]
        self.failures += 1
        return delay

    def succeeded(self) -> None:
        if self.down_since is not None:
            if time.monotonic() - self._last_failure < SETTLE_S:
                return  # at an outage's edge one connection still works while the next fails: not back yet
            log.warning("database_available", service=self.name, down_s=round(time.time() - self.down_since, 1))
            self._recovered_at = time.monotonic()
        self.down_since = None
        self.cause = None
        self.failures = 0

    async def pause(self, exc: BaseException, where: str, stop: asyncio.Event | None = None) -> None:
        """Record a failure and wait out the back-off (shorter if `stop` is set meanwhile)."""
        delay = self.failed(exc, where)
        if stop is None:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await aio.wait_for(stop.wait(), delay)

    async def retry(self, fn: Callable[[], Awaitable[T]], where: str) -> T:
        """`fn()` until it gets through; an outage only delays it (a cancellation ends it, one that `fn` swallowed
        too: a wait for a pool connection may, and the outage's error would then retry it forever)."""
        while True:
            aio.raise_if_cancelled()
            try:
                result = await fn()
            except OUTAGE_ERRORS as exc:
                await self.pause(exc, where)
                continue
            self.succeeded()
            return result
