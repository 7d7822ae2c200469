"""The executor's lease: its name, labels and capacity in the `executors` table, renewed every few seconds.

Several executors (hosts) share one database. Each holds a lease row; a claim records the claimer's lease
epoch. When a lease expires, a survivor takes the executor over (`fleet_reap`): its running tasks crash
with `executor_lost` and the settler applies the policy. A taken-over executor is *fenced*: its renewal is
refused, its claims and final-status writes carry an epoch that no longer matches, and its journal writer
drops what it still has (`confirm` before each batch). It then kills its processes and joins again with a
new epoch before claiming anything (the supervisor does that on `fenced`). Its rows are executor/run/fleet_store.py's;
its renewals run on a timer (shared/timers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypeVar

import psycopg

from executor.run.fleet_store import FleetRows, Joining, Reaped
from shared import errors, logs, timers
from shared.models import NewEvent

log = logs.get(__name__)

T = TypeVar("T")

DEFAULT_LEASE_S = 15.0
# renewals per lease: a lease survives two missed renewals
RENEWALS_PER_LEASE = 3
# a renewal waits at least this long for its answer before giving up on the connection
RENEW_TIMEOUT_FLOOR_S = 1.0
# the local view of the lease ends this much earlier than the database's (clock rates and the time a write
# takes between the check and its commit)
LOCAL_MARGIN_FRACTION = 0.2
# a stale holder's session takes a moment to end once terminated
NAME_LOCK_ATTEMPTS = 20
NAME_LOCK_RETRY_S = 0.1


def default_name() -> str:
    return socket.gethostname() or "executor"


def parse_labels(text: str) -> tuple[str, ...]:
    """`gpu, linux` -> ("gpu", "linux"): comma-separated, blanks dropped, order kept, no duplicates."""
    seen: dict[str, None] = {}
    for part in text.split(","):
        if part.strip():
            seen[part.strip()] = None
    return tuple(seen)


def version() -> str:
    try:
        return metadata.version("petal-dispatch")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class FleetConfig:
    name: str
    labels: tuple[str, ...] = ()
    capacity: int = 4
    lease_s: float = DEFAULT_LEASE_S
    sandbox: str = "bwrap"  # or "off": shown to the user as "workers are not isolated"
    workdir: str | None = None  # where its tasks without a project run: shown to the user


class Lease:
    """One executor's lease. `join` takes it (refusing a live namesake), `run` renews it and reaps expired
    ones, `confirm` tells a writer whether this run may still write."""

    def __init__(self, dsn: str, config: FleetConfig,
                 on_reaped: Callable[[Sequence[NewEvent]], Awaitable[Any]] | None = None, *,
                 clock: timers.Clock = timers.MONOTONIC):
        self.dsn = dsn
        self.config = config
        self.epoch: int | None = None
        self.fenced = asyncio.Event()
        self.clock = clock  # the renewals' timer's (the lease's own validity reads time.monotonic)
        self._renew_failing = False
        self._retry_now = False  # the last attempt hung and its connection was abandoned: a new one at once
        self._on_reaped = on_reaped
        self._conn: psycopg.AsyncConnection | None = None
        self._lock = asyncio.Lock()
        self._valid_until = 0.0  # time.monotonic() up to which the lease surely holds

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def interval_s(self) -> float:
        return self.config.lease_s / RENEWALS_PER_LEASE

    async def _connect(self) -> psycopg.AsyncConnection:
        if self._conn is None or self._conn.closed:
            # the name lock lives on this session: a reconnect must take it again
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, application_name=self._app)
            try:
                await self._take_name(conn)
            except BaseException:
                await conn.close()
                raise
            self._conn = conn
        return self._conn

    @property
    def _app(self) -> str:
        return f"petal-executor-lease:{self.name}"[:63]

    async def _take_name(self, conn: psycopg.AsyncConnection) -> None:
        rows = FleetRows(conn)
        for _ in range(NAME_LOCK_ATTEMPTS):
            if await rows.lock_name(self.name):
                return
            if not await rows.name_is_stale(self.name, self.epoch):
                break
            await rows.end_stale_holders(self._app)
            await asyncio.sleep(NAME_LOCK_RETRY_S)
        raise errors.PetalError(
            f"another executor named {self.name!r} is already running on this database "
            "(give this one another PETAL_EXECUTOR_NAME)")

    def _abandon_connection(self) -> None:
        """Close the socket without a word to the server (the link may be stalled): the server ends the
        session (and frees its lock) when it notices; `_take_name` ends it sooner if it must."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    async def join(self) -> int:
        """Take the lease with a new epoch (fencing every earlier run of this name)."""
        async with self._lock:
            started = time.monotonic()
            conn = await self._connect()
            self.epoch = await FleetRows(conn).join(Joining(
                name=self.name, labels=list(self.config.labels), capacity=self.config.capacity,
                lease_s=self.config.lease_s, version=version(), sandbox=self.config.sandbox,
                workdir=self.config.workdir))
            self._mark_valid(started)
            self.fenced.clear()
            log.info("executor_joined", name=self.name, epoch=self.epoch, labels=list(self.config.labels))
            return self.epoch

    def _mark_valid(self, started: float) -> None:
        self._valid_until = started + self.config.lease_s * (1 - LOCAL_MARGIN_FRACTION)

    def _fence(self) -> None:
        if not self.fenced.is_set():
            log.error("executor_fenced", name=self.name, epoch=self.epoch)
            self.fenced.set()

    async def renew(self) -> bool:
        """Renew now; False (and `fenced` set) when a survivor took this run over."""
        async with self._lock:
            if self.fenced.is_set():
                return False
            started = time.monotonic()
            if not await self._bounded(self._renew_once(), "the lease renewal"):
                self._fence()
                return False
            self._mark_valid(started)
            return True

    async def _bounded(self, work: Coroutine[Any, Any, T], what: str) -> T:
        """Run a query on the lease connection for at most a renewal interval. A half-open link would hang
        it past the lease, unnoticed; wait_for would not help (cancelling a query on a stalled link waits
        on that link too), so the attempt and its connection are abandoned instead."""
        attempt = asyncio.create_task(work)
        done, _ = await asyncio.wait({attempt}, timeout=max(self.interval_s, RENEW_TIMEOUT_FLOOR_S))
        if not done:
            attempt.add_done_callback(lambda t: t.cancelled() or t.exception())
            attempt.cancel()
            self._abandon_connection()
            raise TimeoutError(f"{what} got no answer")
        try:
            return attempt.result()
        except psycopg.OperationalError:
            self._abandon_connection()
            raise

    async def _renew_once(self) -> bool:
        return await FleetRows(await self._connect()).renew(self.name, self.epoch)

    async def confirm(self) -> bool:
        """May this run still write? Free while the lease surely holds; past that, renews first (a paused
        process that wakes up learns here that it was taken over, before its next journal batch)."""
        if self.fenced.is_set():
            return False
        if time.monotonic() < self._valid_until:
            return True
        return await self.renew()

    async def reap(self) -> list[NewEvent]:
        """Take over every executor whose lease expired; returns (and hands on) the events to journal."""
        async with self._lock:
            rows = await self._bounded(self._reap_once(), "taking over expired executors")
        events: list[NewEvent] = []
        lost = {r.name: r for r in rows if r.kind == "executor"}
        for name, r in lost.items():
            tasks = [str(t.id) for t in rows if t.kind == "task" and t.name == name]
            events.append(NewEvent("executor.lost", {
                "name": name, "epoch": r.epoch, "lease_until": r.lease_until.isoformat() if r.lease_until else None,
                "taken_over_by": self.name, "crashed_tasks": tasks}, created_at=r.at))
            log.warning("executor_lost", name=name, epoch=r.epoch, crashed_tasks=tasks)
        for r in rows:
            if r.kind == "task":
                events.append(NewEvent("task.crashed", {"reason": "executor_lost", "status": "crashed",
                                                        "executor": r.name, "taken_over_by": self.name},
                                       task_id=r.id, session_id=r.session_id, project_id=r.project_id,
                                       created_at=r.at))
            elif r.kind == "question":
                events.append(NewEvent("question.cancelled", {"question_id": str(r.id),
                                                              "reason": "executor_lost"}, task_id=r.task_id,
                                       created_at=r.at))
        if events and self._on_reaped is not None:
            await self._on_reaped(events)
        return events

    async def _reap_once(self) -> list[Reaped]:
        return await FleetRows(await self._connect()).reap(self.name)

    async def run(self) -> None:
        """Renew and reap every interval until cancelled; returns when this run is fenced. An error that is
        no outage (a namesake took the name meanwhile) ends it, raised."""
        self._retry_now = False
        await timers.every("lease", self._until_renewal, self._renew_and_reap, clock=self.clock, survive=False,
                           at_start=True).run(self.fenced)

    def _until_renewal(self) -> float:
        # The last attempt hung for an interval and its connection was abandoned (a half-open link): try a
        # new one now. Waiting another interval first would leave the next attempt at the lease's very end, so
        # a survivor would take over a run the database can still reach.
        return 0.0 if self._retry_now else self.interval_s

    async def _renew_and_reap(self) -> None:
        self._retry_now = False
        try:
            if await self.renew():
                await self.reap()
            if self._renew_failing:
                self._renew_failing = False
                log.warning("lease_renewed", name=self.name, note="the database is back")
        except (psycopg.Error, OSError, TimeoutError) as exc:
            # a database outage: keep trying; nobody can take us over while nobody can reach it either
            if not self._renew_failing:  # said once per outage
                self._renew_failing = True
                log.warning("lease_renew_failed", name=self.name, error=str(exc))
            self._retry_now = isinstance(exc, TimeoutError)

    async def leave(self) -> None:
        """A clean stop: the row says stopped (no alert, nothing to take over); the name lock is released."""
        if self._conn is None or self._conn.closed:
            return
        with contextlib.suppress(psycopg.Error):
            if self.epoch is not None and not self.fenced.is_set():
                await FleetRows(self._conn).leave(self.name, self.epoch)
        await self._conn.close()

