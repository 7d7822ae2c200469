"""Routines on a fleet: two executor processes share one schedule, driven by a clock file (the routines' test
clock), and one is SIGKILLed half-way: every instant runs exactly once, none lost, none doubled."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.fault.test_fleet import Fleet
from tests import tables
from tests.pg import DB
from tests.served import ingress_server

pytestmark = pytest.mark.fault

INSTANTS = 20
KILL_AT = 10


def _set(clock: Path, at: datetime) -> None:
    """Move the executors' clock: written aside, then renamed over (a reader never sees half a file)."""
    aside = clock.with_suffix(".new")
    aside.write_text(at.isoformat())
    aside.replace(clock)


def _turns(db: DB, routine_id: str | None = None) -> set[str]:
    """The routine runs' turns (the tasks they started), of one routine or all."""
    equal: dict[str, Any] = {"routine_id": routine_id} if routine_id else {}
    return {t for (t,) in tables.rows(db.admin_dsn, "routine_runs", "task_id", **equal)
            if t is not None and tables.status(db.admin_dsn, t) is not None}


@pytest.mark.timeout(240)
async def test_two_executors_one_schedule_twenty_instants_one_killed_midway_each_instant_runs_exactly_once(
    db: DB, tmp_path: Path
) -> None:
    clock = tmp_path / "clock"
    now = datetime.now(UTC)
    _set(clock, now)
    with ScriptedModelServer(Scenario.single({"text": "checked"})) as model:
        fleet = Fleet(db, model, tmp_path)
        try:
            # the clock file's changes wake nobody: a short poll notices them
            env = {"PETAL_ROUTINES_CLOCK_FILE": str(clock), "PETAL_ROUTINE_POLL_S": "0.2"}
            alpha = await fleet.start("alpha", **env)
            await fleet.start("beta", **env)
            async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
                made = await http.post("/api/routines", json={
                    "name": "nightly", "prompt": "check the build",
                    "schedule": {"cron": "* * * * *", "tz": "Europe/Berlin", "overlap": "parallel"}})
                assert made.status_code == 202, made.text
            routine = made.json()["id"]
            # the first instant after the routine was made (the executors' clock still shows the test's start)
            first = datetime.fromisoformat(made.json()["next_fire_times"][0])
            for i in range(INSTANTS):
                instant = first + timedelta(minutes=i)
                _set(clock, instant + timedelta(seconds=1))
                if i == KILL_AT:
                    # mid-way, while the instant is being scheduled: its lock dies with it, the survivor goes on
                    alpha.send_signal(signal.SIGKILL)
                    alpha.wait(10)
                await fleet.until(lambda: any(t is not None for (t,) in tables.rows(
                    db.admin_dsn, "routine_runs", "task_id", routine_id=routine, scheduled_at=instant)),
                    f"the run of instant {i}", timeout=30)
            runs = tables.rows(db.admin_dsn, "routine_runs", "scheduled_at", "status", "task_id",
                               order=("scheduled_at",), routine_id=routine)
            turns = _turns(db, routine_id=routine)
            scheduled_by = {name for t in _turns(db) if (name := tables.task(db.admin_dsn, t, "executor_name")[0])}
        finally:
            fleet.stop_all()
    assert [r[0] for r in runs] == [first + timedelta(minutes=i) for i in range(INSTANTS)]  # none lost or doubled
    assert len(turns) == INSTANTS and all(r[2] is not None for r in runs)
    assert "beta" in scheduled_by
