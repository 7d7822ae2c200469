"""Parking (executor/run/parking.py): which parked processes are ended — past PETAL_PARK_AFTER_S only a thread's
turn waiting on its own question (its answer resumes that conversation), past PETAL_MAX_PARKED the oldest whose
question can outlive them; each question marked late before its process is stopped, one answered meanwhile left."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from executor.run.outcome import PARKED_LIMIT
from executor.run.parking import Parking
from executor.run.task_rows import Parked

pytestmark = pytest.mark.unit


@dataclass
class Run:
    task_id: uuid.UUID
    stop_reason: str | None = None


class Store:
    def __init__(self, parked: list[Parked], answered: frozenset[uuid.UUID] = frozenset()):
        self.parked, self.answered = parked, answered
        self.released: list[uuid.UUID] = []

    async def parked_tasks(self, ids: list[uuid.UUID]) -> list[Parked]:
        return [p for p in self.parked if p.task_id in ids]

    async def release_parked_questions(self, task_id: uuid.UUID) -> list[uuid.UUID]:
        if task_id in self.answered:
            return []
        self.released.append(task_id)
        return [uuid.uuid4()]


class Runner:
    def __init__(self) -> None:
        self.stopped: list[tuple[uuid.UUID, str]] = []

    async def request_stop(self, r: Any, reason: str) -> None:
        self.stopped.append((r.task_id, reason))


def parked(age_s: float, *, resumes: bool = True, late_ok: bool = True) -> Parked:
    return Parked(uuid.uuid4(), uuid.uuid4(), datetime.now(UTC) - timedelta(seconds=age_s), late_ok, resumes)


def parking(rows: list[Parked], *, after: float | None = 60.0, max_parked: int = 16,
            answered: frozenset[uuid.UUID] = frozenset()) -> tuple[Parking, Store, Runner]:
    store, runner = Store(rows, answered), Runner()
    runs = {p.task_id: Run(p.task_id) for p in rows}
    return Parking(cast(Any, store), runner, lambda: cast(Any, runs), max_parked, after), store, runner


async def test_past_the_grace_only_a_thread_turn_waiting_on_its_own_question_is_ended() -> None:
    turn_old, turn_young = parked(61), parked(59)
    worker_old = parked(600, resumes=False)  # a worker's question, or a gate card: its answer needs the process
    p, store, runner = parking([turn_old, turn_young, worker_old])
    await p.end_overdue()
    assert runner.stopped == [(turn_old.task_id, PARKED_LIMIT)]
    assert store.released == [turn_old.task_id]  # the question marked late before the stop


async def test_one_answered_meanwhile_is_left_to_run_and_without_a_grace_none_is_ended() -> None:
    old = parked(120)
    p, _, runner = parking([old], answered=frozenset({old.task_id}))
    await p.end_overdue()
    assert runner.stopped == []
    p, _, runner = parking([parked(10_000)], after=None)
    await p.end_overdue()
    assert runner.stopped == []


async def test_past_the_bound_the_oldest_that_can_outlive_their_process_are_ended() -> None:
    rows = [parked(30, resumes=False), parked(20, late_ok=False), parked(10), parked(5)]
    p, _, runner = parking(rows, after=None, max_parked=2)
    await p.end_past_bound(rows)
    assert runner.stopped == [(rows[0].task_id, PARKED_LIMIT), (rows[2].task_id, PARKED_LIMIT)]


def test_the_grace_is_looked_at_every_quarter_of_it_within_half_a_second_and_ten() -> None:
    assert [parking([], after=a)[0].timer(cast(Any, None)).due for a in (1.0, 20.0, 600.0)] == [0.5, 5.0, 10.0]
