"""A once-per-fleet job (the notifier's): held through a session advisory lock by one executor at a time."""

from __future__ import annotations

import psycopg

from executor.sql import queries
from shared import logs

log = logs.get(__name__)


class Duty:
    """A once-per-fleet job: whoever holds the session advisory lock does it; when the holder's session ends
    (its executor died), the next `held()` of a survivor takes it."""

    def __init__(self, dsn: str, duty: str, holder: str = ""):
        self.dsn = dsn
        self.duty = duty
        self.holder = holder  # shown in pg_stat_activity: who holds the duty
        self._conn: psycopg.AsyncConnection | None = None
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
            self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, application_name=name)
            cur = await self._conn.execute(queries["try_duty_lock"], {"duty": self.duty})
            row = await cur.fetchone()
        except psycopg.Error as exc:
            if not self._failing:  # said once per outage
                self._failing = True
                log.warning("duty_check_failed", duty=self.duty, error=str(exc))
            return False
        self._failing = False
        if row and row[0]:
            log.info("duty_taken", duty=self.duty)
            return True
        await self._conn.close()
        self._conn = None
        return False

    async def release(self) -> None:
        if self._conn is not None:
            await self._conn.close()
