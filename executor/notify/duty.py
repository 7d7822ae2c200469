"""A once-per-fleet job (the notifier's): held through a session advisory lock by one executor at a time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from executor.notify.store import try_duty_lock
from shared import logs

log = logs.get(__name__)

# a connection of its own for the duty's lock (the lock is its session's): dsn, application_name
Connect = Callable[[str, str], Awaitable[psycopg.AsyncConnection[Any]]]


async def _connect(dsn: str, name: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, application_name=name)


class Duty:
    """A once-per-fleet job: whoever holds the session advisory lock does it; when the holder's session ends
    (its executor died), the next `held()` of a survivor takes it."""

    def __init__(self, dsn: str, duty: str, holder: str = "", connect: Connect | None = None):
        self.dsn = dsn
        self.duty = duty
        self.holder = holder  # shown in pg_stat_activity: who holds the duty
        self._connect = connect or _connect
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._failing = False

    async def held(self) -> bool:
        if self._conn is not None and not self._conn.closed:
            try:
                await self._conn.execute("SELECT 1")
                return True
            except psycopg.Error:
                await self._conn.close()  # the lock went with the session
        try:
            name = f"petal-duty:{self.duty}:{self.holder}"[:63]
            self._conn = await self._connect(self.dsn, name)
            taken = await try_duty_lock(self._conn, self.duty)
        except psycopg.Error as exc:
            if not self._failing:  # said once per outage
                self._failing = True
                log.warning("duty_check_failed", duty=self.duty, error=str(exc))
            return False
        self._failing = False
        if taken:
            log.info("duty_taken", duty=self.duty)
            return True
        await self._conn.close()
        self._conn = None
        return False

    async def release(self) -> None:
        if self._conn is not None:
            await self._conn.close()
