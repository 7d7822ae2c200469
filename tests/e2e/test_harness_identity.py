"""Who may call the harness MCP: only a process the harness spawned, identified by its per-spawn credential.

Forged calls go through the mcp SDK's own streamable-HTTP client; the positive path is the real CLI with
the config the supervisor wrote for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from mcp.types import CallToolResult

from petal_dispatch import executor_wiring
from petal_dispatch.config import Settings
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import errors
from tests import tables
from tests.harness import running_executor
from tests.harness_caller import add_spawn, mcp_client, wait_started
from tests.pg import DB

Q = {"question": "Which database?", "header": "DB", "multiSelect": False,
     "options": [{"label": "Postgres", "description": "a"}, {"label": "SQLite", "description": "b"}]}


def _text(result: CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def test_calls_without_a_live_credential_are_refused_and_leave_only_a_refusal_record(
        db: DB, tmp_path: Path) -> None:
    stale = tmp_path / "run" / "mcp" / f"mcp-{uuid.uuid4()}.json"  # left by an executor that crashed
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path) as h:
            await wait_started(h)
            live = add_spawn(db)  # a running orchestrator turn whose identity a forger names
            ended = add_spawn(db, status="success")
            exited = add_spawn(db, revoked=True)  # its process exited; the task is not settled yet
            tasks_before = tables.count(db.admin_dsn, "tasks")
            seq_before = tables.journal_head(db.admin_dsn)
            url = h.mcp_url or ""
            forged = {"X-Petal-Session": str(live.session_id), "X-Petal-Task": str(live.task_id)}
            attempts = {
                "no credential": (None, {}),
                "forged headers": (None, forged),
                "random credential": (secrets.token_urlsafe(32), forged),
                "ended task's credential": (ended.token, {}),
                "exited process's credential": (exited.token, {}),
                "not a bearer token": (None, {"Authorization": f"Basic {live.token}"}),
            }
            dispatched = {}
            for name, (token, headers) in attempts.items():
                async with mcp_client(url, token, headers) as client:
                    dispatched[name] = await client.call_tool("dispatch_worker", {"brief": "delete the repository"})
            async with mcp_client(url, headers=forged) as client:
                others = [await client.call_tool("ask_user_question", {"questions": [Q]}),
                          await client.call_tool("get_handoffs", {"scope_id": str(live.session_id)}),
                          await client.call_tool("get_project_state", {"project_id": str(uuid.uuid4())}),
                          await client.call_tool("check_ruled_out", {"scope_id": str(live.session_id),
                                                                     "candidate": "anything"})]
            events = [e for e in await h.events() if e.seq > seq_before]
    assert not stale.exists()
    for name, result in dispatched.items():
        assert result.is_error and "dispatch_worker refused" in _text(result), name
    assert all(r.is_error and "refused" in _text(r) for r in others)
    # nothing written: no task, no question, no journal event but the refusals
    assert tables.count(db.admin_dsn, "tasks") == tasks_before
    assert tables.count(db.admin_dsn, "questions") == 0
    assert [e.event_type for e in events] == ["harness.call_refused"] * (len(attempts) + len(others))
    assert [e.payload["reason"] for e in events[:len(attempts)]] == [
        "no credential", "no credential", "unknown credential", "the credential's task has ended (success)",
        "the credential's process has exited", "no credential"]
    assert [e.payload["tool"] for e in events[len(attempts):]] == [
        "ask_user_question", "get_handoffs", "get_project_state", "check_ruled_out"]
    assert all(e.payload["peer"].startswith("127.0.0.1:") and e.task_id is None for e in events)
    assert events[1].payload["ignored_headers"] == ["x-petal-session", "x-petal-task"]
    assert events[3].payload["credential_task_id"] == str(ended.task_id)


async def test_a_real_spawns_calls_work_and_its_config_is_private_and_gone_after_exit(
        db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(match="parent brief", role="worker", replies=[
        {"tool_use": {"name": "mcp__harness__dispatch_worker", "input": {"brief": "child brief"}}},
        {"tool_use": {"name": "mcp__harness__ask_user_question", "input": {"questions": [Q]}}},
        {"text": "done"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, ask_timeout_s=5) as h:
            task_id = await h.dispatch("parent brief", allowed_tools=[
                "mcp__harness__dispatch_worker", "mcp__harness__ask_user_question"])
            during = await h.wait_task(task_id, lambda r: r["activity"] == "awaiting_user", 60)
            config = tmp_path / "run" / "mcp" / f"mcp-{task_id}.json"
            mode, dir_mode = stat.S_IMODE(config.stat().st_mode), stat.S_IMODE(config.parent.stat().st_mode)
            server = json.loads(config.read_text())["mcpServers"]["harness"]
            parent = await h.wait_final(task_id)
            events = await h.events(task_id)
            token = server["headers"]["Authorization"].removeprefix("Bearer ")
            async with mcp_client(h.mcp_url or "", token) as client:  # the same credential, after its exit
                late = await client.call_tool("get_handoffs", {"scope_id": str(task_id)})
            refusals = [e for e in await h.events() if e.event_type == "harness.call_refused"]
    assert (mode, dir_mode) == (0o600, 0o700)
    assert list(server["headers"]) == ["Authorization"] and len(token) >= 40
    assert not config.exists()
    assert parent["status"] == "success" and during["activity"] == "awaiting_user"
    results = [b for e in events if e.event_type == "stream.user" for b in e.payload["message"]["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert len(results) == 2 and not any(b.get("is_error") for b in results), results
    # the identity came from the credential: the child and the question name the caller's task and session
    with psycopg.connect(db.admin_dsn) as conn:
        child = tables.tasks(conn, "parent_task_id", brief="child brief")
        question = tables.rows(conn, "questions", "task_id", "source_session_uuid")
        stored = tables.credential(conn, task_id)
        leaked = conn.execute("SELECT count(*) FROM journal WHERE payload::text LIKE %s",
                              [f"%{token}%"]).fetchone()
    assert child == [(task_id,)] and question == [(task_id, parent["session_id"])]
    assert stored is not None and stored[0] == hashlib.sha256(token.encode()).digest()
    assert stored[1] is not None  # revoked when the process exited
    assert leaked == (0,)  # only the hash is stored; the argv in task.spawned names the file, not the token
    assert late.is_error and [e.payload["reason"] for e in refusals] == ["the credential's task has ended (success)"]


def test_a_non_loopback_mcp_host_refuses_to_start_unless_forced(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PETAL_") and k != "DATABASE_URL"}
    # were the check missing, the executor would fail later, on this unreachable database instead
    env.update(PETAL_MCP_HOST="0.0.0.0", DATABASE_URL="postgresql://petal@127.0.0.1:1/none",
               PETAL_DATA_DIR=str(tmp_path / "var"))
    done = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "executor"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "PETAL_MCP_HOST=0.0.0.0" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        executor_wiring.check_executor_bind(Settings(mcp_host=host))
    executor_wiring.check_executor_bind(Settings(mcp_host="0.0.0.0", mcp_force_bind=True))
    with pytest.raises(errors.ConfigError):
        executor_wiring.check_executor_bind(Settings(mcp_host="192.168.1.5"))
