"""The fleet's rows (`executors`: leases, epochs, fencing), by name (SQL in executor/sql/fleet.sql), on the
lease's own autocommit connection (executor/run/fleet.py). psycopg's errors are left as they are: the lease
tells a stalled link (abandoned) from a refused renewal (fenced) itself."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from executor.sql import queries
from shared.query import FromRow


@dataclass(frozen=True)
class Reaped(FromRow):
    """One thing a take-over ended: an executor whose lease expired (`kind` executor: name, epoch,
    lease_until), one of its running tasks (task: name, id, session_id, project_id), or a question of one
    (question: id, task_id); `at`, the take-over's time (the rows' lost_at and ended_at)."""

    kind: str
    name: str | None
    epoch: int | None
    lease_until: datetime | None
    id: uuid.UUID | None
    task_id: uuid.UUID | None
    session_id: uuid.UUID | None
    project_id: uuid.UUID | None
    at: datetime


@dataclass(frozen=True)
class Joining:
    """What an executor says of itself when it joins."""

    name: str
    labels: list[str]
    capacity: int
    lease_s: float
    version: str
    sandbox: str
    workdir: str | None


class FleetRows:
    """fleet.sql's statements on `conn`."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]):
        self.conn = conn

    async def _first(self, name: str, params: dict[str, Any]) -> Any:
        row = await (await self.conn.execute(queries[name], params)).fetchone()
        return row[0] if row else None

    async def lock_name(self, name: str) -> bool:
        """Take the name's lock on this session (held for its life); False while another session holds it."""
        return bool(await self._first("lock_fleet_name", {"name": name}))

    async def name_is_stale(self, name: str, epoch: int | None) -> bool:
        """Whether the session holding the name's lock is a dead one (see the query)."""
        return bool(await self._first("get_fleet_name_staleness", {"name": name, "epoch": epoch}))

    async def end_stale_holders(self, app: str) -> None:
        await self.conn.execute(queries["end_stale_fleet_holder"], {"app": app})

    async def join(self, joining: Joining) -> int:
        """The new epoch."""
        epoch = await self._first("join_fleet", {
            "name": joining.name, "labels": joining.labels, "capacity": joining.capacity,
            "lease_s": joining.lease_s, "version": joining.version, "sandbox": joining.sandbox,
            "workdir": joining.workdir})
        assert epoch is not None
        return int(epoch)

    async def renew(self, name: str, epoch: int | None) -> bool:
        """False when refused: a survivor declared this run lost, or a newer run of the name joined."""
        return await self._first("renew_fleet_lease", {"name": name, "epoch": epoch}) is not None

    async def reap(self, name: str) -> list[Reaped]:
        """Take over every other executor whose lease expired: what that ended."""
        async with self.conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(queries["reap_fleet_lease"], {"name": name})
            return [Reaped.from_row(r) for r in await cur.fetchall()]

    async def leave(self, name: str, epoch: int) -> None:
        await self.conn.execute(queries["leave_fleet"], {"name": name, "epoch": epoch})
