"""The harness MCP seen from the mcp SDK's own client: tools, reads, dispatch and rule-outs."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
from mcp.types import CallToolResult

from petal_dispatch.demo.scripted_model import Scenario, ScriptedModelServer
from tests.harness import running_executor
from tests.harness_caller import add_spawn, mcp_client, wait_started
from tests import tables
from tests.pg import DB


def _handoff(db: DB, project: uuid.UUID, ruled_out: list[dict[str, str]]) -> uuid.UUID:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        task = tables.insert_task(conn, project_id=project, status="success")
        tables.append(conn, "handoff", {"goal": "speed up parsing", "current_state": "done", "next_step": "none",
                                        "status": "success", "ruled_out": ruled_out},
                      tier="derived", project_id=project, task_id=task)
    return task


def _project(db: DB, tmp: Path) -> uuid.UUID:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        return tables.insert(conn, "projects", name="demo", workdir=str(tmp / "work"))


def _structured(result: CallToolResult) -> dict[str, Any]:
    """A tool's structured output (JSON from the server), from either shape of result."""
    structured: dict[str, Any] | None = (getattr(result, "structured_content", None)
                                         or getattr(result, "structuredContent", None))
    if structured is not None:
        return structured
    text: dict[str, Any] = json.loads(result.content[0].text)  # type: ignore[union-attr]  # the one block is text
    return text


async def test_the_sdk_client_lists_the_tools_and_reads_handoffs_and_project_state(db: DB, tmp_path: Path) -> None:
    project = _project(db, tmp_path)
    task = _handoff(db, project, [{"approach": "rewrite the parser in Rust", "reason": "the team knows Python"}])
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path) as h:
            await wait_started(h)
            async with mcp_client(h.mcp_url or "", add_spawn(db, project=project).token) as client:
                listed = (await client.list_tools()).tools
                handoffs = _structured(await client.call_tool("get_handoffs", {"scope_id": str(task)}))
                by_project = _structured(await client.call_tool("get_handoffs", {"scope_id": str(project)}))
                state = _structured(await client.call_tool("get_project_state", {"project_id": str(project)}))
                bad = await client.call_tool("get_handoffs", {"scope_id": "nope"})
    tools = {t.name: t for t in listed}
    assert set(tools) == {"ask_user_question", "get_handoffs", "get_project_state", "check_ruled_out",
                          "dispatch_worker", "permission_prompt"}
    # each tool's result is typed: its output schema names the fields the CLI gets in structuredContent
    fields = {name: set((t.output_schema or {}).get("properties", {})) for name, t in tools.items()}
    assert fields["ask_user_question"] == {"questions", "answers", "response", "annotation"}
    assert fields["get_handoffs"] == {"handoffs"} and fields["check_ruled_out"] == {"matches"}
    assert {"project", "counts", "done", "blocked"} <= fields["get_project_state"]
    assert fields["dispatch_worker"] == {"task_id", "status", "note"}
    assert tools["permission_prompt"].output_schema is None  # one text block: the CLI refuses structuredContent
    assert handoffs["handoffs"][0]["goal"] == "speed up parsing" and by_project == handoffs
    assert state["counts"]["done"] == 1
    assert bad.is_error and "UUID" in bad.content[0].text  # type: ignore[union-attr]  # an error's block is text


async def test_a_brief_matching_a_rule_out_is_refused_and_journaled_unless_overridden(db: DB, tmp_path: Path) -> None:
    project = _project(db, tmp_path)
    _handoff(db, project, [{"approach": "rewrite the parser in Rust", "reason": "the team knows Python"}])
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path, max_workers=1) as h:
            await wait_started(h)
            async with mcp_client(h.mcp_url or "", add_spawn(db, project=project).token) as client:
                check = _structured(await client.call_tool("check_ruled_out", {
                    "scope_id": str(project), "candidate": "Rewrite the parser in Rust for speed"}))
                unrelated = _structured(await client.call_tool("check_ruled_out", {
                    "scope_id": str(project), "candidate": "add caching to the HTTP client"}))
                refused = await client.call_tool("dispatch_worker", {
                    "brief": "Rewriting the parser in Rust", "project_id": str(project)})
                allowed = _structured(await client.call_tool("dispatch_worker", {
                    "brief": "Rewriting the parser in Rust", "project_id": str(project),
                    "override_ruled_out": "the user asked for it explicitly"}))
            events = await h.events()
            new_task = await h.task(uuid.UUID(allowed["task_id"]))
    assert [m["approach"] for m in check["matches"]] == ["rewrite the parser in Rust"]
    assert unrelated["matches"] == []
    assert refused.is_error and "ruled out" in refused.content[0].text  # type: ignore[union-attr]  # text, as above
    refusals = [e for e in events if e.event_type == "task.dispatch_refused"]
    assert len(refusals) == 1 and refusals[0].payload["rule_outs"][0]["reason"] == "the team knows Python"
    assert new_task["project_id"] == project and new_task["brief"].startswith("Rewriting the parser in Rust\n\n")
    # the worker's brief carries the scope's rule-outs, so it knows what the override goes against
    assert "## Already ruled out here" in new_task["brief"] and "the team knows Python" in new_task["brief"]


async def test_the_mcp_endpoint_refuses_a_foreign_host_header(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path) as h, httpx.AsyncClient() as http:
            response = await http.post(h.mcp_url or "", headers={
                "Host": "evil.example", "content-type": "application/json",
                "accept": "application/json, text/event-stream"},
                content=b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
    assert response.status_code == 421  # DNS-rebinding protection: only loopback names


async def test_a_workers_brief_carries_its_plan_tasks_earlier_handoffs(db: DB, tmp_path: Path) -> None:
    project = _project(db, tmp_path)
    earlier = _handoff(db, project, [])
    tables.update(db.admin_dsn, "tasks", earlier, plan_ref="T-007")
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path, max_workers=1) as h:
            await wait_started(h)
            async with mcp_client(h.mcp_url or "", add_spawn(db, project=project).token) as client:
                same = _structured(await client.call_tool("dispatch_worker", {
                    "brief": "finish the parser speed-up", "project_id": str(project), "plan_ref": "T-007"}))
                other = _structured(await client.call_tool("dispatch_worker", {
                    "brief": "write the docs", "project_id": str(project), "plan_ref": "T-008"}))
            same_task = await h.task(uuid.UUID(same["task_id"]))
            other_task = await h.task(uuid.UUID(other["task_id"]))
    assert same_task["brief"].startswith("finish the parser speed-up\n\n## Earlier handoffs for T-007")
    assert "[success] done (next: none)" in same_task["brief"]
    assert other_task["brief"] == "write the docs"  # nothing known about T-008, nothing added


async def test_a_routine_runs_workers_dispatched_at_the_same_moment_stay_within_its_max_workers(
    db: DB, tmp_path: Path
) -> None:
    with ScriptedModelServer(Scenario.single({"text": "ok"})) as model:
        async with running_executor(db, model, tmp_path) as h:
            await wait_started(h)
            turn = add_spawn(db)  # a run's turn: its session is the run's thread
            with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
                routine = tables.insert(conn, "routines", name="r", prompt="p", max_workers=1)
                tables.insert(conn, "routine_runs", routine_id=routine, trigger="run", status="running",
                              thread_id=turn.session_id, task_id=turn.task_id, started_at=tables.NOW)
            async with mcp_client(h.mcp_url or "", turn.token) as client:
                results = await asyncio.gather(*(client.call_tool("dispatch_worker", {"brief": f"part {i}"})
                                                 for i in range(6)))
            with psycopg.connect(db.admin_dsn) as conn:
                workers = tables.count_tasks(conn, parent_task_id=turn.task_id)
    refused = [r.content[0].text for r in results if r.is_error]  # type: ignore[union-attr]  # text blocks
    assert len(refused) == 5 and workers == 1, (refused, workers)
    assert all("runs at most 1 worker(s) at once" in text for text in refused), refused
