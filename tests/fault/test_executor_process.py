"""The executor as a process: crash recovery, the singleton, graceful shutdown, the orphan sweep."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import psycopg
import pytest

from executor.run import substrate
from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from shared import errors
from tests.harness import claude_bin, claude_env, config_for, running_supervisor, substrate_for, worker
from tests.pg import DB
from tests import tables
from tests.served import free_port
from tests.wait import until


def _executor_env(db: DB, model: ScriptedModelServer, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env.update(claude_env(model, tmp / "home"))
    workdir = tmp / "work"
    workdir.mkdir(exist_ok=True)
    env.update(
        PETAL_EXECUTOR_DSN=db.executor_dsn,
        PETAL_INGRESS_DSN=db.ingress_dsn,
        PETAL_DATA_DIR=str(tmp / "var"),
        PETAL_WORKDIR=str(workdir),
        PETAL_CLAUDE_BIN=claude_bin(),
        PETAL_CLAUDE_CONFIG_DIR=str(tmp / "claude-config"),
        PETAL_CLAUDE_MAX_RETRIES="0",
        PETAL_STOP_GRACE_S="5",
        PETAL_LOG_FORMAT="json",
        PETAL_MCP_PORT=str(free_port()),
    )
    return env


def _spawn_executor(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "petal_dispatch.cli", "executor"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)


async def _dispatch_until_running(db: DB, tmp: Path, log: Path) -> uuid.UUID:
    """Dispatch a worker that waits forever and return once its claude process exists."""
    from executor.settle import dispatch
    from shared.database import Database

    async with Database(db.executor_dsn, name="test-dispatcher") as d:
        task_id = await dispatch.request(d.pool, worker("wait forever", workdir=tmp / "work"))
    await until(lambda: _task_processes(task_id), lambda: f"the worker's claude\n{log.read_text()}", 60)
    return task_id


def _task_processes(task_id: object) -> list[psutil.Process]:
    from executor.run import process

    return [p for p in process.find_by_env(substrate.TASK_ENV_VAR, str(task_id)) if _alive(p)]


def _claude_of(task_id: object) -> list[psutil.Process]:
    """The task's CLI process itself (not its sandbox's init or forwarders)."""
    return [p for p in _task_processes(task_id) if "claude" in _command_line(p).split(" ", 1)[0]]


def _command_line(p: psutil.Process) -> str:
    """The process's command line; "" for one that exited since it was listed (the CLI's short-lived helpers)."""
    try:
        return " ".join(p.cmdline())
    except psutil.NoSuchProcess:
        return ""


def _alive(p: psutil.Process) -> bool:
    """Not a zombie; a process that exited since it was listed is not alive either."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_after_the_executor_is_killed_mid_task_its_claude_dies_too_and_a_new_one_sweeps_any_survivor(
    db: DB, tmp_path: Path
) -> None:
    with ScriptedModelServer(Scenario.single({"stall": {"seconds": None}})) as model:
        env = _executor_env(db, model, tmp_path)
        first = _spawn_executor(env, tmp_path / "executor1.log")
        task_id = await _dispatch_until_running(db, tmp_path, tmp_path / "executor1.log")
        # what the wait below watches is there (a running task's CLI may still be starting inside its sandbox)
        await until(lambda: _claude_of(task_id), lambda: f"the task's CLI among {_task_processes(task_id)}", 30)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        # its own session does not save it: the parent-death signal set at spawn ends it. (Its sandbox's own
        # processes — bubblewrap's init of the spawn's PID namespace, the port forwarders — sometimes outlive it:
        # bubblewrap's --die-with-parent did not always take that init down, seen in 2 of 9 runs; the sweep below
        # ends whatever is left.)
        await until(lambda: not _claude_of(task_id), lambda: (
            "the claude process to die with its executor: "
            f"{[(p.pid, p.name(), p.status()) for p in _task_processes(task_id)]}"), 5)
        # a process of the task that survives all the same (one that ignores SIGTERM) is the sweep's
        survivor = subprocess.Popen(["sleep", "300"], env={**os.environ, substrate.TASK_ENV_VAR: str(task_id)},
                                    start_new_session=True)

        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path)) as h:
            row = await h.task(task_id)
            events = await h.events(task_id)
            started = [e for e in await h.events() if e.event_type == "executor.started"]
        survivor.wait(10)

    assert row["status"] == "crashed" and row["status_reason"] == "executor_restart"
    assert events[-1].event_type == "task.crashed" and survivor.pid in events[-1].payload["killed_pids"]
    assert str(task_id) in started[-1].payload["reconciled"]["crashed_tasks"]
    assert _task_processes(task_id) == []


async def test_a_second_executor_on_the_same_database_refuses_to_start(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario.single({"text": "x"})) as model:
        sub = substrate_for(model, tmp_path)
        async with running_supervisor(db.executor_dsn, db.admin_dsn, sub, config_for(tmp_path)):
            with pytest.raises(errors.PetalError, match="another executor"):
                async with running_supervisor(db.executor_dsn, db.admin_dsn, sub, config_for(tmp_path)):
                    pass


async def test_a_loop_that_crashes_brings_the_executor_down_in_order_and_exits_non_zero(
    db: DB, tmp_path: Path
) -> None:
    # the projects loop cannot take back its claimed rows at start: a bug-like error, not an outage
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        conn.execute("REVOKE UPDATE ON project_queue FROM petal_executor")
    log = tmp_path / "executor.log"
    with ScriptedModelServer(Scenario.single({"text": "x"})) as model:
        proc = _spawn_executor(_executor_env(db, model, tmp_path), log)
        try:
            # past its stop's deadline (petal_dispatch/signals.py) it exits anyway, saying what it waited on
            rc = await asyncio.to_thread(proc.wait, 150)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert rc not in (0, None) and '"stop_overdue"' not in text, text
    assert '"executor_loop_crashed"' in text and '"loop": "projects"' in text, text
    # it came down in order, not cut off: the supervisor left its lease, the journal writer flushed
    with psycopg.connect(db.admin_dsn) as conn:
        stopped = tables.executors(conn, "stopped_at")
        started = tables.count_events(conn, "executor.started")
    assert len(stopped) == 1 and stopped[0][0] is not None, text
    assert started == 1, text


async def test_sigterm_to_the_executor_stops_its_workers_journals_their_ends_as_crashed_and_exits_zero(
    db: DB, tmp_path: Path
) -> None:
    with ScriptedModelServer(Scenario.single({"stall": {"seconds": None}})) as model:
        proc = _spawn_executor(_executor_env(db, model, tmp_path), tmp_path / "executor.log")
        task_id = await _dispatch_until_running(db, tmp_path, tmp_path / "executor.log")
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 30)

        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path)) as h:
            row = await h.task(task_id)
            events = await h.events(task_id)
    assert rc == 0, (tmp_path / "executor.log").read_text()
    assert row["status"] == "crashed" and row["status_reason"] == "executor_shutdown"  # not the user's cancel
    assert events[-1].event_type == "task.exited"
    assert _task_processes(task_id) == []


@pytest.mark.parametrize("sandboxed", [False, True])
async def test_after_a_sigkill_the_bash_children_claude_leaves_behind_are_swept(
        db: DB, tmp_path: Path, sandboxed: bool) -> None:
    """Unsandboxed, the sweep by environment finds the Bash child that left claude's session; sandboxed, the
    SIGKILL of the sandbox takes its whole PID namespace down, so nothing is left to sweep."""
    scenario = Scenario.single({"tool_use": {"name": "Bash", "input": {"command": "tail -f /dev/null", "timeout": 600000}}},
                               {"text": "slept"})
    with ScriptedModelServer(scenario) as model:
        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path, **({} if sandboxed else {"sandbox": None}))) as h:
            # no harness MCP here, so no permission path: the task pre-allows Bash itself
            task_id = await h.dispatch("sleep a while", allowed_tools=["Bash"])
            row = await h.wait_task(task_id, lambda r: r["pid"] is not None)
            await until(lambda: any("tail" in _command_line(p) for p in _task_processes(task_id)
                                    if p.pid != row["pid"]), "the Bash tool started", 60)
            os.kill(row["pid"], signal.SIGKILL)
            final = await h.wait_final(task_id, timeout=30)
            events = await h.events(task_id)
    assert final["status"] == "crashed"
    assert bool(events[-1].payload.get("swept_pids")) is not sandboxed, events[-1].payload
    assert _task_processes(task_id) == []


async def test_no_more_workers_run_at_once_than_the_limit(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario.single({"stall": {"seconds": 3, "text": "done"}})) as model:
        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path, max_workers=2)) as h:
            ids = [await h.dispatch(f"job {i}") for i in range(4)]
            peak = 0

            async def all_done() -> bool:
                """Each look also notes how many ran at once."""
                nonlocal peak
                statuses = await h.statuses(ids)
                peak = max(peak, statuses.count("running"))
                assert set(statuses) <= {"pending", "running", "success"}, statuses
                return statuses.count("success") == len(ids)

            await until(all_done, "the four jobs done", every=0.05)
    assert peak == 2
