"""Processes parked on their user, ended to free what they hold: past `max_parked` (the oldest whose question can
outlive them), and a thread's turn waiting on its own question past `park_after_s` (its answer resumes the same
conversation in a new turn). Each question is marked late first, so it stays answerable and its answer goes to the
thread as a message; then the process is stopped with reason `parked_limit`."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from executor.run.outcome import PARKED_LIMIT
from executor.run.running import Running
from executor.run.task_rows import Parked
from executor.run.task_store import TaskStore
from shared import logs, timers
from shared.database import Availability

log = logs.get(__name__)


class Stopper(Protocol):
    async def request_stop(self, r: Running, reason: str) -> None: ...


class Parking:
    def __init__(self, store: TaskStore, runner: Stopper, runs: Callable[[], Mapping[uuid.UUID, Running]],
                 max_parked: int, park_after_s: float | None):
        self.store = store
        self.runner = runner
        self.runs = runs
        self.max_parked = max_parked
        self.park_after_s = park_after_s

    def timer(self, availability: Availability) -> timers.Timer:
        """The grace's timer: a look every quarter of it (between 0.5 and 10 s)."""
        assert self.park_after_s is not None
        every = min(10.0, max(0.5, self.park_after_s / 4))
        return timers.every("parking", every, self.end_overdue, availability=availability)

    async def end_past_bound(self, parked: list[Parked]) -> None:
        """Past `max_parked`, end the oldest parked processes whose question can outlive them."""
        over = len(parked) - self.max_parked
        await self._end([p for p in parked if p.late_ok][:max(0, over)], "max_parked", len(parked))

    async def end_overdue(self) -> None:
        """End the thread turns parked on their own question past `park_after_s`: their answer resumes the same
        conversation in a new turn (a worker's, or a gate card's, could not reach the call it is for: those keep
        their process, within `max_parked`). A second or so late at most; the question's age is this host's clock
        against the time the database recorded it asked."""
        after = self.park_after_s
        ids = [r.task_id for r in self.runs().values() if r.stop_reason is None]
        if after is None or not ids:
            return
        parked = await self.store.parked_tasks(ids)
        now = datetime.now(UTC)
        await self._end([p for p in parked if p.resumes and (now - p.asked_at).total_seconds() >= after],
                        "park_after", len(parked))

    async def _end(self, parked: list[Parked], why: str, waiting: int) -> None:
        """End these parked processes: each question marked late first, then the process stopped. One answered
        meanwhile is left to run."""
        for p in parked:
            r = self.runs().get(p.task_id)
            if r is None or r.stop_reason is not None:
                continue
            released = await self.store.release_parked_questions(p.task_id)
            if not released:
                continue  # answered since: it resumes
            log.info("parked_process_ended", task_id=str(p.task_id), questions=[str(q) for q in released],
                     why=why, parked=waiting, max_parked=self.max_parked, park_after_s=self.park_after_s)
            await self.runner.request_stop(r, PARKED_LIMIT)
