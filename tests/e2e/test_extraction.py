"""The derived layer end to end: the real CLI as worker and as extractor, the gate, the read surface."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from executor.settle import extraction
from executor.settle.store import Ended, SettleStore
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import contract, journal, read_surface
from shared.models import Event, NewEvent
from tests.harness import Harness, running_executor
from tests import tables
from tests.pg import DB
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

HANDOFF = {"goal": "speed up the parser", "current_state": "parser rewritten with a table", "next_step": "benchmark it",
           "ruled_out": [{"approach": "SQLite as the journal store", "reason": "no LISTEN/NOTIFY"}],
           "status": "partial", "artifacts": ["parser.py"]}


def scenario(*extractor_replies: dict[str, Any]) -> Scenario:
    return Scenario(rules=[
        Rule(role="worker", replies=[{"text": "I rewrote the parser. I ruled out SQLite: no LISTEN/NOTIFY."}]),
        Rule(role="extractor", replies=list(extractor_replies)),
    ])


def structured(value: dict[str, Any]) -> dict[str, Any]:
    return {"tool_use": {"name": "StructuredOutput", "input": value}}


async def _extract(db: DB, tmp: Path, sc: Scenario) -> tuple[Harness, uuid.UUID, list[Event], dict[str, Any]]:
    with ScriptedModelServer(sc) as model:
        async with running_executor(db, model, tmp, extract=True) as h:
            worker = await h.dispatch("make the parser faster", workdir=tmp / "work")
            await h.wait_final(worker)
            # the extractor runs after the worker; wait for its derived record
            await until(lambda: _events_where(h, worker, lambda e: e.tier == "derived"), "a derived record", 90)
            return h, worker, await h.events(worker), await h.task(worker)


async def _events_where(h: Harness, task_id: uuid.UUID, keep: Callable[[Event], bool],
                        at_least: int = 1) -> list[Event] | None:
    found = [e for e in await h.events(task_id) if keep(e)]
    return found if len(found) >= at_least else None


async def test_a_valid_extraction_stores_a_handoff_with_the_fields_the_seq_range_and_the_harness_status(
    db: DB, tmp_path: Path
) -> None:
    h, worker, events, row = await _extract(db, tmp_path, scenario(structured(HANDOFF), {"text": "done"}))

    (handoff,) = [e for e in events if e.event_type == "handoff"]
    raw = [e.seq for e in events if e.tier == "raw"]
    assert handoff.tier == "derived" and handoff.task_id == worker
    assert {k: handoff.payload[k] for k in ("goal", "current_state", "next_step", "ruled_out", "artifacts")} == {
        k: HANDOFF[k] for k in ("goal", "current_state", "next_step", "ruled_out", "artifacts")}
    assert handoff.payload["status"] == "success" and handoff.payload["claimed_status"] == "partial"
    assert handoff.payload["raw_seq_range"] == [min(raw), max(raw)]
    ex = tables.task(db.admin_dsn, handoff.payload["extractor_task_id"], "id", "role", "parent_task_id", "status")
    assert ex[1] == "extractor" and ex[2] == worker and ex[3] == "success"
    assert row["status"] == "success"
    async with AsyncConnectionPool(db.executor_dsn, open=False) as pool:
        by_session = await read_surface.get_handoffs(pool, row["session_id"])
    assert [r["event_id"] for r in by_session] == [handoff.event_id]


async def test_an_extractor_that_never_returns_structured_output_fails_the_gate_and_keeps_raw_events(
    db: DB, tmp_path: Path
) -> None:
    _, worker, events, row = await _extract(db, tmp_path, scenario({"text": "here is some prose instead"}))
    failures = [e for e in events if e.event_type == "handoff.extraction_failed"]
    assert row["status"] == "extraction_failed"
    assert "no structured output" in failures[0].payload["errors"][0]
    assert not [e for e in events if e.event_type == "handoff"]
    assert [e.event_type for e in events if e.tier == "raw"][:2] == ["task.dispatch_requested", "task.spawned"]
    assert "stream.result" in [e.event_type for e in events]


async def test_a_missing_required_field_fails_the_gate_with_the_reason(db: DB, tmp_path: Path) -> None:
    no_goal = {k: v for k, v in HANDOFF.items() if k != "goal"}
    _, _, events, row = await _extract(db, tmp_path, scenario(structured(no_goal), {"text": "sorry"}))
    (failure,) = [e for e in events if e.event_type == "handoff.extraction_failed"]
    assert row["status"] == "extraction_failed"
    assert any("goal" in err for err in failure.payload["errors"])


async def test_the_gate_validates_by_itself_whatever_the_cli_let_through(pool: AsyncConnectionPool, db: DB) -> None:
    version, fields = await contract.active(pool)
    schema = contract.schema_for(fields)
    worker = tables.insert_task(db.admin_dsn, status="success", brief="b")
    ex = tables.insert_task(db.admin_dsn, role="extractor", status="success", parent_task_id=worker,
                            json_schema=json.dumps(schema))
    # what the CLI let through, as the journal holds it: a result line whose structured output breaks the schema
    await journal.append(pool, [NewEvent("stream.result", {
        "type": "result", "is_error": False, "structured_output": {**HANDOFF, "ruled_out": "not a list"}},
        task_id=ex)])
    async with SettleStore.over(pool).work() as (_, unit):
        gated = await extraction.validate(unit, Ended(ex, "extractor", "success", "completed", parent_task_id=worker,
                                                      json_schema=schema))
        assert gated is not None  # its records are appended with the unit
    status = tables.status(db.admin_dsn, worker)
    errors = tables.payloads(db.admin_dsn, "handoff.extraction_failed")[0]["errors"]
    assert gated.record_type == "handoff.extraction_failed" and status == "extraction_failed"
    assert errors == ["ruled_out: 'not a list' is not of type 'array'"]


async def test_a_field_added_to_the_contract_is_required_next_time_and_old_handoffs_still_read(
    db: DB, tmp_path: Path
) -> None:
    h, first_worker, events, _ = await _extract(db, tmp_path, scenario(structured(HANDOFF), {"text": "done"}))
    assert [e.event_type for e in events if e.tier == "derived"] == ["handoff"]
    env = {**os.environ, "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn}
    added = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "contract", "add", "risk", "--required",
                            "--shape", '{"type": "string"}', "--semantics", "the biggest risk left"],
                           env=env, capture_output=True, text=True, timeout=60)
    again = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "contract", "add", "risk", "--shape", "{}",
                            "--semantics", "x"], env=env, capture_output=True, text=True, timeout=60)
    listed = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "contract", "list", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    assert again.returncode == 2 and "never edited" in again.stderr
    assert "risk" in json.loads(listed.stdout)["schema"]["required"]

    _, second_worker, events2, row2 = await _extract(db, tmp_path / "2", scenario(structured(HANDOFF), {"text": "ok"}))
    assert row2["status"] == "extraction_failed"
    async with AsyncConnectionPool(db.executor_dsn, open=False) as pool:
        old = await read_surface.get_handoffs(pool, first_worker)
    assert old[0]["payload"]["goal"] == HANDOFF["goal"] and "risk" not in old[0]["payload"]


async def test_rule_outs_are_found_by_meaning_of_words_not_by_a_model(pool: AsyncConnectionPool, db: DB) -> None:
    project = tables.insert(db.admin_dsn, "projects", name="p")
    task = tables.insert_task(db.admin_dsn, project_id=project, status="success")
    await journal.append(pool, [NewEvent("handoff", {"ruled_out": [
        {"approach": "SQLite as the journal store", "reason": "no LISTEN/NOTIFY"},
        {"approach": "polling the API every second", "reason": "wasteful"}]}, tier="derived", task_id=task,
        project_id=project)])
    hit = await read_surface.check_ruled_out(pool, project, "use sqlite for the journal")
    miss = await read_surface.check_ruled_out(pool, project, "add an SSE heartbeat")
    by_task = await read_surface.get_handoffs(pool, task)
    by_project = await read_surface.get_handoffs(pool, project)
    assert [m["approach"] for m in hit] == ["SQLite as the journal store"] and miss == []
    assert by_task == by_project and len(by_task) == 1


async def test_project_state_stays_under_its_bound_with_500_tasks(pool: AsyncConnectionPool, db: DB, tmp_path: Path) -> None:
    plan = "\n".join(f"- [ ] T-{i:03d} task number {i}" for i in range(1, 601))
    (tmp_path / "plan.md").write_text(plan)
    env = {**os.environ, "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn}
    out = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "project", "create", "--slug", "big", "--plan",
                          str(tmp_path / "plan.md")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    project = uuid.UUID(json.loads(out.stdout)["project_id"])
    statuses = ["success", "failed", "running", "crashed", "pending"]
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO tasks (role, project_id, plan_ref, status) VALUES ('worker', %s, %s, %s)",
                            [(project, f"T-{i:03d}", statuses[i % 5]) for i in range(1, 501)])
    state = await read_surface.get_project_state(pool, project)
    assert state is not None and len(json.dumps(state)) <= read_surface.STATE_BUDGET
    assert state["counts"] == {"done": 100, "in_flight": 200, "failed": 200, "blocked": 0, "not_started": 100}
    assert state["plan_tasks"] == 600 and state["truncated"] is True


async def test_reextract_runs_extraction_again_and_keeps_the_old_handoff(db: DB, tmp_path: Path) -> None:
    sc = scenario(structured(HANDOFF), {"text": "done"})
    with ScriptedModelServer(sc) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h:
            worker = await h.dispatch("make the parser faster", workdir=tmp_path / "work")
            await h.wait_final(worker)
            is_handoff = lambda e: e.event_type == "handoff"  # noqa: E731
            await until(lambda: _events_where(h, worker, is_handoff), "the first handoff", 60)
            env = {**os.environ, "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn}
            out = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "reextract", str(worker)], env=env,
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            second = uuid.UUID(json.loads(out.stdout)["extractor_task_id"])
            handoffs = await until(lambda: _events_where(h, worker, is_handoff, 2), "the second handoff", 60)
    first, again = handoffs
    assert again.payload["extractor_task_id"] == str(second) != first.payload["extractor_task_id"]
    assert first.seq < again.seq and first.payload["goal"] == again.payload["goal"] == HANDOFF["goal"]
