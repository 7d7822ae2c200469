"""A graceful executor stop (SIGTERM, a deploy) and the runtime cap are not the user's cancellation: a
thread's worker the stop cut off is retried by the policy, an orchestrator turn it cut off runs again with
its messages, and a run past the cap ends failed (the real executor process, the real CLI, PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import httpx

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.harness import config_for, running_supervisor, substrate_for
from tests.pg import DB
from tests.resilience import check_invariants, settled
from tests.fault.test_executor_process import _executor_env, _spawn_executor
from tests.scenarios import STALL_FOREVER, handoff, one_worker
from tests import tables
from tests.served import ingress_server
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)


async def _wait_running(admin_dsn: str, role: str, log: Path, timeout: float = 90) -> None:
    await until(lambda: tables.count_running(admin_dsn, role), lambda: f"a {role} running\n{log.read_text()[-3000:]}",
                timeout)


async def _printed(admin_dsn: str, role: str, log: Path, timeout: float = 60) -> None:
    """Wait until the running `role`'s first lines are journaled."""
    def printed() -> bool:
        return any(tables.count_events(admin_dsn, "stream.system.init", task_id)
                   for (task_id,) in tables.tasks(admin_dsn, "id", role=role))

    await until(printed, lambda: f"the {role}'s first lines\n{log.read_text()[-3000:]}", timeout)


async def _model_has(model: ScriptedModelServer, role: str, log: Path, timeout: float = 60) -> None:
    """Wait until a run of `role` has sent the model its request (a cut-off before that is not mid-run)."""
    await until(lambda: any(f"[petal-role: {role}]" in json.dumps(r.body.get("system")) for r in list(model.requests)),
                lambda: f"a {role} request at the model\n{log.read_text()[-3000:]}", timeout, every=0.05)


async def _stop(executor: subprocess.Popen[bytes]) -> int:
    executor.send_signal(signal.SIGTERM)
    return await asyncio.to_thread(executor.wait, 60)


async def test_a_worker_cut_off_by_a_graceful_stop_is_retried_by_the_policy_after_the_restart(
    db: DB, tmp_path: Path
) -> None:
    # the first run hangs; the retry finishes
    scenario = one_worker("a long job", {"text": "finished on the retry"}, first_run=[STALL_FOREVER],
                          result=handoff("a long job"))
    log = tmp_path / "executor.log"
    with ScriptedModelServer(scenario) as model:
        env = _executor_env(db, model, tmp_path)
        async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            executor = _spawn_executor(env, log)
            try:
                thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
                await http.post("/api/chat", json={"text": "run the long job", "thread_id": thread})
                await _wait_running(db.admin_dsn, "worker", log)
                await _model_has(model, "worker", log)  # mid-run: the worker's request reached the model
                await _printed(db.admin_dsn, "worker", log)
                rc = await _stop(executor)
                at_stop = tables.tasks(db.admin_dsn, "status", "status_reason", role="worker")
                executor = _spawn_executor(env, log)
                try:
                    await settled(db.admin_dsn, timeout=120)
                except AssertionError:
                    raise AssertionError(tables.tasks(db.admin_dsn, "role", "status", "status_reason", "settled_at",
                                                      "brief")) from None
            finally:
                await _stop(executor)
    check_invariants(db.admin_dsn)
    workers = tables.tasks(db.admin_dsn, "status", "status_reason", "attempt", role="worker")
    decisions = tables.policy_actions(db.admin_dsn)
    reports = tables.count_tasks(db.admin_dsn, role="orchestrator", brief=tables.Like("[harness] Worker%"))
    assert rc == 0 and at_stop == [("crashed", "executor_shutdown")], log.read_text()[-3000:]
    assert workers == [("crashed", "executor_shutdown", 1), ("success", "completed", 2)], log.read_text()[-3000:]
    assert decisions == ["retry_same", "report"] and reports == 1


async def test_a_turn_cut_off_by_a_graceful_stop_runs_again_with_its_messages_before_later_ones(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"stall": {"seconds": 4, "text": "turn done"}}])])
    log = tmp_path / "executor.log"
    with ScriptedModelServer(scenario) as model:
        env = _executor_env(db, model, tmp_path)
        async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            executor = _spawn_executor(env, log)
            try:
                thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
                await http.post("/api/chat", json={"text": "first", "thread_id": thread})
                await _wait_running(db.admin_dsn, "orchestrator", log)
                await _model_has(model, "orchestrator", log)  # mid-turn: the CLI has recorded the conversation
                await _printed(db.admin_dsn, "orchestrator", log)
                rc = await _stop(executor)
                await http.post("/api/chat", json={"text": "second", "thread_id": thread})  # sent while it is down
                executor = _spawn_executor(env, log)
                await settled(db.admin_dsn, timeout=120)
            finally:
                await _stop(executor)
    check_invariants(db.admin_dsn)
    turns = tables.tasks(db.admin_dsn, "brief", "status", "status_reason", "attempt", role="orchestrator")
    echoes = tables.user_messages(db.admin_dsn)
    assert rc == 0, log.read_text()[-3000:]
    assert turns == [("first", "crashed", "executor_shutdown", 1), ("first", "success", "completed", 2),
                     ("second", "success", "completed", 1)], log.read_text()[-3000:]
    assert echoes == ["first", "second"]  # each message shown once; the re-run carries "first" again


async def test_a_task_past_the_runtime_cap_is_stopped_and_ends_failed_not_cancelled(db: DB, tmp_path: Path) -> None:
    cap, grace = 2.0, 1.0
    with ScriptedModelServer(Scenario.single({"stall": {"seconds": None}})) as model:
        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path, max_runtime_s=cap, stop_grace_s=grace)) as h:
            task_id = await h.dispatch("take forever")
            row = await h.wait_final(task_id, timeout=60)
            events = await h.events(task_id)
    assert (row["status"], row["status_reason"]) == ("failed", "max_runtime")
    signals = [e.payload for e in events if e.event_type == "task.signal_sent"]
    assert signals[0]["signal"] == "SIGTERM" and signals[0]["reason"] == "max_runtime"
    # the time bound, from the journal's own records: not stopped before its cap, ended within cap + grace + 1 s
    # of its start (the watchdog looks every 0.2 s; SIGKILL follows SIGTERM after the grace)
    spawned = next(e for e in events if e.event_type == "task.spawned")
    exited = next(e for e in events if e.event_type == "task.exited")
    ran_s = (exited.created_at - spawned.created_at).total_seconds()
    assert exited.payload["duration_s"] > cap, exited.payload
    assert cap - 0.5 < ran_s <= cap + grace + 1.0, ran_s
