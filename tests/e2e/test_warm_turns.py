"""Warm turns: a thread's next turn's CLI started ahead of its message (executor/run/spawn/warm_pool.py), against the
real CLI and the scripted model, sandboxed as every spawn is in the suite."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from executor.run.spawn.warm_pool import WarmConfig
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer, last_user_text
from tests import tables
from tests.bench import services
from tests.harness import running_executor
from tests.harness_caller import mcp_client
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until

# the pool looks again often in tests, so a turn's end or a death is acted on at once
WARM = WarmConfig(turns=2, idle_s=120, poll_s=0.2)


def _journal(db: DB, event_type: str, session_id: str) -> list[dict[str, Any]]:
    return tables.payloads(db.admin_dsn, event_type, session_id=session_id)


def _turns(db: DB, thread: str) -> list[tuple[Any, ...]]:
    return tables.turns(db.admin_dsn, thread, "id", "status")


async def _turn_done(db: DB, thread: str, n: int) -> uuid.UUID:
    def done() -> uuid.UUID | None:
        turns = _turns(db, thread)
        return turns[n - 1][0] if len(turns) >= n and turns[n - 1][1] == "success" else None
    return await until(done, f"turn {n} of the thread to succeed", timeout=90)


async def _warm_started(db: DB, thread: str, n: int) -> dict[str, Any]:
    def started() -> dict[str, Any] | None:
        found = _journal(db, "warm.started", thread)
        return found[n - 1] if len(found) >= n else None
    return await until(started, f"warm process {n} of the thread", timeout=60)


async def _thread(http: httpx.AsyncClient) -> str:
    created = await http.post("/api/threads", json={"mode": "autonomous"})
    assert created.status_code in (200, 201, 202), created.text
    return str(created.json()["thread_id"])


async def _warm_thread(http: httpx.AsyncClient, db: DB) -> tuple[str, dict[str, Any]]:
    """A new thread whose first turn has run, and the warm process its next turn got (its warm.started)."""
    thread = await _thread(http)
    await http.post("/api/chat", json={"text": "first message", "thread_id": thread})
    await _turn_done(db, thread, 1)
    return thread, await _warm_started(db, thread, 1)


def _spawned(db: DB, task_id: uuid.UUID) -> dict[str, Any]:
    payload: dict[str, Any] = tables.payloads(db.admin_dsn, "task.spawned", task_id)[0]
    return payload


async def test_a_message_to_a_warm_thread_goes_once_to_the_waiting_process_and_is_journaled_from_its_first_line(
        db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path, warm=WARM), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread, warm = await _warm_thread(http, db)
            waiting = psutil.Process(warm["pid"])
            assert waiting.is_running()
            # waiting is not running: no task claims a worker slot for it, and the model has not been asked
            running = tables.count_tasks(db.admin_dsn, status="running")
            asked_before = len(model.requests)
            await http.post("/api/chat", json={"text": "second message", "thread_id": thread})
            second = await _turn_done(db, thread, 2)
            spawned = _spawned(db, second)
            lines = tables.event_types(db.admin_dsn, second)
            # and the next: a turn that ran warm leaves its thread warm again
            again = await _warm_started(db, thread, 2)
            await http.post("/api/chat", json={"text": "third message", "thread_id": thread})
            third = _spawned(db, await _turn_done(db, thread, 3))
    assert running == 0 and asked_before == 1
    # the turn is the warm process: its pid, its spawn id, its stream-json input
    assert spawned["pid"] == warm["pid"] and spawned["warm"]["spawn_id"] == warm["spawn_id"]
    assert "--input-format" in spawned["argv"] and "--resume" in spawned["argv"]
    assert third.get("warm", {}).get("spawn_id") == again["spawn_id"]
    # delivered exactly once: one request of the model carries it as the new message, once
    carrying = [r for r in model.requests if last_user_text(r.body).endswith("second message")]
    assert len(carrying) == 1 and json.dumps(carrying[0].body).count("second message") == 1
    # journaled from its first line: the message, spawned, then the CLI's init, ..., its result, its exit
    stream = [t for t in lines if t.startswith("stream.")]
    at = lines.index("task.spawned")
    assert not any(t.startswith("stream.") for t in lines[:at])
    assert lines[at + 1] == "stream.system.init" and stream[-1] == "stream.result"
    assert lines[-1] == "task.exited" and stream.count("stream.system.init") == 1


async def test_a_warm_process_killed_before_its_message_is_replaced_and_the_message_still_goes(
        db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path, warm=WARM), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread, killed = await _warm_thread(http, db)
            os.killpg(killed["pid"], signal.SIGKILL)  # the sandbox and the CLI in it
            replacement = await _warm_started(db, thread, 2)
            retired = await until(lambda: _journal(db, "warm.retired", thread), "the dead one's end")
            await http.post("/api/chat", json={"text": "second message", "thread_id": thread})
            second = await _turn_done(db, thread, 2)
            spawned = _spawned(db, second)
    assert replacement["pid"] != killed["pid"]
    assert [(r["spawn_id"], r["reason"]) for r in retired] == [(killed["spawn_id"], "died")]
    assert spawned["warm"]["spawn_id"] == replacement["spawn_id"]
    assert sum(last_user_text(r.body).endswith("second message") for r in model.requests) == 1


async def test_a_warm_process_carries_its_own_credential_bound_only_to_the_turn_that_takes_it(
        db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", match_last="use the harness", replies=[
        {"tool_use": {"name": "mcp__harness__get_handoffs", "input": {"scope_id": str(uuid.uuid4())}}}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, warm=WarmConfig(turns=1, idle_s=8, poll_s=0.2)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread, first = await _warm_thread(http, db)
            config = tmp_path / "run" / "mcp" / f"mcp-warm-{first['spawn_id']}.json"
            token = json.loads(config.read_text())["mcpServers"]["harness"]["headers"]["Authorization"][7:]
            async with mcp_client(h.mcp_url or "", token) as client:  # nobody's yet: refused
                early = await client.call_tool("get_handoffs", {"scope_id": thread})
            await http.post("/api/chat", json={"text": "use the harness", "thread_id": thread})
            second = await _turn_done(db, thread, 2)
            used = tables.credential(db.admin_dsn, second)
            results = [b for p in tables.payloads(db.admin_dsn, "stream.user", second)
                       for b in p["message"]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
            # the next warm process (after turn 2) is never taken: retired when idle, its credential with it
            unused = await _warm_started(db, thread, 2)
            unused_config = tmp_path / "run" / "mcp" / f"mcp-warm-{unused['spawn_id']}.json"
            unused_token = json.loads(unused_config.read_text())["mcpServers"]["harness"]["headers"]["Authorization"][7:]
            retired = await until(lambda: [r for r in _journal(db, "warm.retired", thread)
                                           if r["spawn_id"] == unused["spawn_id"]], "the idle one's end", timeout=30)
            async with mcp_client(h.mcp_url or "", unused_token) as client:
                late = await client.call_tool("get_handoffs", {"scope_id": thread})
            bound = tables.count(db.admin_dsn, "harness_credentials",
                                 token_sha256=hashlib.sha256(unused_token.encode()).digest())
            alive = psutil.pid_exists(unused["pid"]) and psutil.Process(unused["pid"]).status() != psutil.STATUS_ZOMBIE
    assert early.is_error and "unknown credential" in str(early.content)
    # the turn that took the first warm process called as itself, with that process's own credential,
    # revoked when the turn's process exited
    assert len(results) == 1 and not results[0].get("is_error"), results
    assert used and used[0] == hashlib.sha256(token.encode()).digest() and used[1] is not None
    assert not config.exists()
    assert retired[0]["reason"] == "idle" and retired[0]["rss_bytes"] > 0
    assert not unused_config.exists() and bound == 0 and not alive
    assert late.is_error and "unknown credential" in str(late.content)


def _claudes_of(config_dir: Path) -> list[int]:
    """Live processes started with this executor's CLI config directory (its spawns and their sandboxes)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if (proc.environ().get("CLAUDE_CONFIG_DIR") == str(config_dir)
                    and proc.status() != psutil.STATUS_ZOMBIE):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.mark.timeout(180)
async def test_an_executor_stopped_by_sigterm_leaves_no_warm_process(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario()) as model:
        env = {**services.service_env(db, model, tmp_path), "PETAL_WARM_TURNS": "1", "PETAL_LOG_LEVEL": "warning"}
        config_dir = Path(env["PETAL_CLAUDE_CONFIG_DIR"])
        executor = subprocess.Popen([sys.executable, "-m", "petal_dispatch.cli", "executor"], env=env)
        try:
            await services.executor_started(db.admin_dsn, 1)
            async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
                thread, warm = await _warm_thread(http, db)
                before = _claudes_of(config_dir)  # the control: the scan sees the warm process
                executor.send_signal(signal.SIGTERM)
                rc = await asyncio.to_thread(executor.wait, 60)
            after = await until(lambda: _claudes_of(config_dir) == [] or None, "no process of the executor left",
                                timeout=10)
        finally:
            if executor.poll() is None:
                executor.kill()
                executor.wait(10)
    assert warm["pid"] in before and rc == 0 and after
    retired = _journal(db, "warm.retired", thread)
    assert [r["reason"] for r in retired] == ["executor_stopping"]
