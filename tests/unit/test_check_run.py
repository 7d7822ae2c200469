"""A project's check command as code runs it (executor/run/check.py), here without a sandbox (the operator's
PETAL_SANDBOX=off; the sandboxed run is tests/e2e/test_checks.py): passed only on exit 0, its last lines kept,
a check past its time stopped, with what it left behind, and none of the executor's environment in its own."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from executor.run import check

pytestmark = pytest.mark.unit


async def test_exit_zero_passes_and_anything_else_fails_with_its_last_lines(tmp_path: Path) -> None:
    ok = await check.run_check(None, None, tmp_path, "echo fine", 30)
    bad = await check.run_check(None, None, tmp_path, "seq 1 300; echo broken >&2; exit 4", 30)
    assert (ok.passed, ok.exit_code, ok.tail) == (True, 0, ["fine"])
    assert (bad.passed, bad.exit_code, len(bad.tail)) == (False, 4, check.TAIL_LINES)
    assert bad.tail[0] == "102" and bad.tail[-1] == "broken"  # the last 200 lines, stderr with stdout


async def test_a_check_past_its_time_is_stopped_and_fails_and_what_it_started_goes_with_it(tmp_path: Path) -> None:
    stopped = await check.run_check(None, None, tmp_path, "sleep 300 & echo $! > sleeper.pid; wait", 0.5)
    assert (stopped.passed, stopped.exit_code, stopped.timed_out) == (False, None, True)
    assert stopped.tail == ["… the check was stopped after 0.5 s"]
    # the very process the check started (by its pid: another `sleep 300` on the machine is none of this test's)
    sleeper = int((tmp_path / "sleeper.pid").read_text())
    assert not _alive(sleeper)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_the_check_sees_none_of_the_executors_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PETAL_DATABASE_URL", "postgresql://secret@db/petal")
    seen = await check.run_check(None, None, tmp_path, "env | sort", 30)
    assert not any(line.startswith("PETAL_") and not line.startswith("PETAL_TASK") for line in seen.tail)
    assert f"HOME={tmp_path}" in seen.tail and "CI=true" in seen.tail


async def test_a_check_that_prints_tells_its_run_it_is_not_silent(tmp_path: Path) -> None:
    told: list[int] = []

    async def printed() -> None:
        told.append(1)

    quiet = await check.run_check(None, None, tmp_path, "true", 30, on_output=printed)
    assert quiet.passed and told == []
    await check.run_check(None, None, tmp_path, "echo one; echo two", 30, on_output=printed)
    assert told == [1]  # at most once a second
