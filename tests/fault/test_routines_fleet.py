"""Routines on a fleet: two executor processes share one schedule, driven by a clock file (the routines' test
clock), and one is SIGKILLed half-way: every instant runs exactly once, none lost, none doubled."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.fault.test_fleet import Fleet
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
                await fleet.until(lambda: fleet.one(
                    "SELECT count(*) FROM routine_runs WHERE routine_id = %s AND scheduled_at = %s"
                    " AND task_id IS NOT NULL", routine, instant), f"the run of instant {i}", timeout=30)
            runs = fleet.rows("SELECT scheduled_at, status, task_id FROM routine_runs WHERE routine_id = %s"
                              " ORDER BY scheduled_at", routine)
            turns = fleet.one("SELECT count(DISTINCT r.task_id) FROM routine_runs r JOIN tasks t ON t.id = r.task_id"
                              " WHERE r.routine_id = %s", routine)
            scheduled_by = fleet.rows("SELECT DISTINCT executor_name FROM tasks t JOIN routine_runs r"
                                      " ON r.task_id = t.id WHERE t.executor_name IS NOT NULL")
        finally:
            fleet.stop_all()
    assert [r[0] for r in runs] == [first + timedelta(minutes=i) for i in range(INSTANTS)]  # none lost or doubled
    assert turns == INSTANTS and all(r[2] is not None for r in runs)
    assert ("beta",) in scheduled_by
