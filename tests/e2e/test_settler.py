"""Durable settlement: a task's end is acted on by the settler from the store, exactly once, also when the
executor dies between the end and its settlement, when a settlement step raises, and when the task never
started (real PostgreSQL; the real CLI and executor process where a run is involved)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg_pool import AsyncConnectionPool
from structlog.testing import capture_logs

from executor.settle import policy
from executor.settle.settler import Settler, SettlerConfig
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import migrate
from tests.harness import config_for, running_executor, running_supervisor, substrate_for
from tests.pg import DB
from tests.resilience import settled
from tests.fault.test_executor_process import _executor_env, _spawn_executor
from tests.wait import until
from tests.scenarios import one_worker
from tests import tables
from tests.served import ingress_server

SETTLEMENT_MIGRATION = 13  # migrations/0013_settlement.sql
HANDOFF = {"goal": "count the files", "current_state": "three files counted", "next_step": "none",
           "ruled_out": [], "status": "success", "artifacts": []}


def _thread_with_turn(admin_dsn: str) -> tuple[uuid.UUID, uuid.UUID]:
    """An autonomous thread and one ended (already settled) orchestrator turn of it."""
    return tables.thread_with_turn(admin_dsn, "autonomous")


async def test_an_executor_killed_after_a_workers_end_commits_settles_it_exactly_once_after_restart(
    db: DB, tmp_path: Path
) -> None:
    scenario = one_worker("count the files", {"stall": {"seconds": 3, "text": "three files"}}, result=HANDOFF)
    log = tmp_path / "executor.log"
    with ScriptedModelServer(scenario) as model:
        env = _executor_env(db, model, tmp_path)
        async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            executor = _spawn_executor(env, log)
            try:
                thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
                sent = await http.post("/api/chat", json={"text": "count them", "thread_id": thread})
                assert sent.status_code == 202

                async def running_worker() -> uuid.UUID | None:
                    return next((t for (t,) in tables.tasks(db.admin_dsn, "id", role="worker", status="running")), None)
                worker = await until(running_worker, "the worker to run")
                # Hold settlement off: FOR KEY SHARE lets the supervisor's updates through but not the
                # settler's FOR UPDATE SKIP LOCKED claim. The executor then dies before it can settle.
                async with await psycopg.AsyncConnection.connect(db.admin_dsn) as holder:
                    await holder.execute("SELECT 1 FROM tasks WHERE id = %s FOR KEY SHARE", [worker])

                    async def ended() -> str | None:
                        status = tables.status(db.admin_dsn, worker)
                        return status if status not in ("pending", "running") else None
                    status = await until(ended, "the worker's end to commit")
                    await asyncio.sleep(1.5)  # the settler had its chances (task_changed and a poll) and passed
                    unsettled = tables.task(db.admin_dsn, worker, "settled_at")[0] is None
                    extractors_before = tables.count_tasks(db.admin_dsn, parent_task_id=worker)
                    executor.send_signal(signal.SIGKILL)
                    await asyncio.to_thread(executor.wait, 30)
                    await holder.rollback()
                executor = _spawn_executor(env, log)

                async def report_turn() -> int | None:
                    return tables.count_tasks(db.admin_dsn, role="orchestrator", status="success",
                                              brief=tables.Like(f"[harness] Worker {worker}%"))
                await until(report_turn, "the orchestrator to hear of the worker", timeout=120)
                await settled(db.admin_dsn)
            finally:
                executor.send_signal(signal.SIGTERM)
                await asyncio.to_thread(executor.wait, 60)
    assert status == "success" and unsettled is True and extractors_before == 0, log.read_text()[-3000:]
    with psycopg.connect(db.admin_dsn) as conn:
        extractors = tables.tasks(conn, "status", parent_task_id=worker)
        decisions = tables.policy_actions(conn, worker)
        handoffs = tables.count_events(conn, "handoff", worker)
        told = tables.count(conn, "chat_queue", origin="harness", text=tables.Like(f"[harness] Worker {worker}%"))
        unsettled_left = tables.count_tasks(conn, settled_at=None)
    assert extractors == [("success",)] and handoffs == 1
    assert decisions == ["report"] and told == 1
    assert unsettled_left == 0


async def test_a_settlement_step_that_raises_leaves_the_end_unsettled_logged_and_retried(
    pool: AsyncConnectionPool, db: DB
) -> None:
    thread, turn = _thread_with_turn(db.admin_dsn)
    worker = uuid.uuid4()
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        tables.insert_task(conn, id=worker, parent_task_id=turn, brief="do it", status="success",
                           status_reason="completed", ended_at=tables.NOW)
        # a real failure inside the step: telling the thread (its chat_queue insert) raises
        conn.execute("CREATE FUNCTION refuse_insert() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$ BEGIN RAISE EXCEPTION 'chat_queue is refusing rows'; END $$")
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON chat_queue FOR EACH ROW EXECUTE FUNCTION refuse_insert()")
    settler = Settler(pool, SettlerConfig(retry_base_s=0.3, retry_cap_s=1.0))
    with capture_logs() as logged:
        first = await settler.settle_pending()
    failed = [e for e in logged if e["event"] == "settlement_failed"]
    left_unsettled = tables.task(db.admin_dsn, worker, "settled_at")[0] is None
    decisions_after_failure = tables.count_events(db.admin_dsn, "policy.decision")

    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TRIGGER refuse ON chat_queue")
    retried = await until(settler.settle_pending, "the retry after its delay", 15)
    again = await settler.settle_pending()  # the next pass finds nothing left to do
    with psycopg.connect(db.admin_dsn) as conn:
        decisions = tables.policy_actions(conn)
        told = tables.rows(conn, "chat_queue", "text", thread_id=thread, origin="harness")
    assert first == 0 and left_unsettled is True and decisions_after_failure == 0
    assert retried == 1 and again == 0
    assert [(e["task_id"], e["step"], e["failures"]) for e in failed] == [(str(worker), "policy", 1)]
    assert decisions == ["report"] and len(told) == 1 and str(worker) in told[0][0]


def _ended_worker(admin_dsn: str, turn: uuid.UUID, status: str = "success") -> uuid.UUID:
    """A worker the thread's turn dispatched, ended with nothing to extract: its end calls for the policy."""
    return tables.insert_task(admin_dsn, parent_task_id=turn, brief="do it", status=status, status_reason="completed",
                              ended_at=tables.NOW)


def _follow_ups(admin_dsn: str, worker: uuid.UUID) -> dict[str, int]:
    """What acting on the worker's end (and on its escalation) wrote, counted."""
    with psycopg.connect(admin_dsn) as conn:
        return {
            "decisions": tables.count_events(conn, "policy.decision", worker),
            "told": tables.count(conn, "chat_queue", origin="harness", text=tables.Like(f"[harness] Worker {worker}%")),
            "escalations": tables.count(conn, "escalations", task_id=worker),
            "resolved": tables.count_events(conn, "escalation.resolved", worker),
        }


async def test_settling_an_end_twice_acts_once_and_the_settled_marker_is_what_stops_the_second_pass(
    pool: AsyncConnectionPool, db: DB
) -> None:
    _, turn = _thread_with_turn(db.admin_dsn)
    worker = _ended_worker(db.admin_dsn, turn)
    settler = Settler(pool, SettlerConfig())
    first = await settler.settle_pending()
    second = await settler.settle_pending()  # the same pass on the same ended worker
    after_two = _follow_ups(db.admin_dsn, worker)
    # the negative control: with its marker cleared, the very same pass acts on the same end again, so the
    # second pass did nothing because of the marker, not because the pass cannot act on this end
    tables.update(db.admin_dsn, "tasks", worker, settled_at=None)
    unmarked = await settler.settle_pending()
    after_unmarked = _follow_ups(db.admin_dsn, worker)
    assert (first, second) == (1, 0)
    assert after_two["decisions"] == 1 and after_two["told"] == 1
    assert unmarked == 1 and after_unmarked["decisions"] == 2 and after_unmarked["told"] == 2


async def test_two_settlers_passing_over_the_same_end_at_once_settle_it_once(
    pool: AsyncConnectionPool, db: DB
) -> None:
    _, turn = _thread_with_turn(db.admin_dsn)
    worker = _ended_worker(db.admin_dsn, turn)
    # two settlers as two executors of a fleet run them: the claim's SKIP LOCKED lets one act
    settled = await asyncio.gather(*(Settler(pool, SettlerConfig()).settle_pending() for _ in range(2)))
    assert sorted(settled) == [0, 1] and _follow_ups(db.admin_dsn, worker)["decisions"] == 1


async def test_an_answered_escalation_is_carried_out_by_the_settler_once_however_often_its_pass_runs(
    pool: AsyncConnectionPool, db: DB
) -> None:
    thread, turn = _thread_with_turn(db.admin_dsn)
    worker = _ended_worker(db.admin_dsn, turn, status="gated")  # the policy escalates a gated end
    settler = Settler(pool, SettlerConfig())
    await settler.settle_pending()
    unanswered = await settler.apply_escalations()  # nothing is owed before the user answers
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        ((question,),) = tables.rows(conn, "escalations", "question_id", task_id=worker)
        tables.answer(conn, question, {"q": policy.ESCALATION_SKIP}, answered_by="user")
    acted = [await settler.apply_escalations() for _ in range(2)]
    done = _follow_ups(db.admin_dsn, worker)
    assert unanswered == 0 and acted == [1, 0]
    assert done["escalations"] == 1 and done["resolved"] == 1
    assert done["told"] == 1  # the orchestrator hears the user's Skip once
    assert tables.rows(db.admin_dsn, "escalations", "decision", task_id=worker) == [("skip",)]


async def test_a_worker_whose_directory_vanished_never_starts_and_the_policy_escalates_it_in_the_chat(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "understood, skipping it"}]),
        Rule(role="orchestrator", replies=[{"text": "hello"}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
            await http.post("/api/chat", json={"text": "hi", "thread_id": thread})

            async def ended_turn() -> uuid.UUID | None:
                return next((t for (t,) in tables.tasks(db.admin_dsn, "id", session_id=thread, status="success")), None)
            turn = await until(ended_turn, "the first turn")
            # dispatch checks the directory; it can vanish before the worker is claimed (a queued retry, a
            # back-off): the row as dispatch leaves it, pointing at a directory that is gone
            worker = uuid.uuid4()
            # asynchronously: the executor runs on this event loop, and its settler may still hold the turn's
            # row (the insert's foreign key waits for it), so a blocking insert would wait for itself
            await asyncio.to_thread(tables.insert_task, db.admin_dsn, id=worker, parent_task_id=turn, brief="build it",
                                    workdir=str(tmp_path / "gone"))

            async def escalation() -> dict[str, Any] | None:
                asks = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
                return next((a for a in asks if a["task_id"] == str(worker)), None)
            ask = await until(escalation, "the escalation")
            chat = (await http.get(f"/api/threads/{thread}/conversation")).json()["events"]
            text = ask["questions"][0]["question"]
            await http.post(f"/api/asks/{ask['id']}/answer", json={"answers": {text: policy.ESCALATION_SKIP}})

            async def told() -> int | None:
                return tables.count_tasks(db.admin_dsn, session_id=thread,
                                          brief=tables.Like(f"%Worker {worker} ended skipped%"))
            await until(told, "the orchestrator to hear of it")
            row = await h.task(worker)
    assert row["status"] == "skipped" and "does not exist" in row["status_reason"] and row["settled_at"]
    mine = [e for e in chat if e["task_id"] == str(worker)]
    kinds = [e["event_type"] for e in mine]
    assert "task.exited" in kinds and "policy.decision" in kinds and "question.asked" in kinds
    exited = next(e["payload"] for e in mine if e["event_type"] == "task.exited")
    decision = next(e["payload"] for e in mine if e["event_type"] == "policy.decision")
    assert exited["spawned"] is False and exited["status"] == "skipped"
    assert decision["action"] == "escalate" and "never started" in decision["why"]


async def test_a_worker_whose_cli_cannot_be_started_escalates_instead_of_being_retried(
    db: DB, tmp_path: Path
) -> None:
    with ScriptedModelServer(Scenario.single({"text": "unused"})) as model:
        sub = replace(substrate_for(model, tmp_path), claude_bin=str(tmp_path / "no-such-claude"))
        thread, turn = _thread_with_turn(db.admin_dsn)
        async with running_supervisor(db.executor_dsn, db.admin_dsn, sub, config_for(tmp_path)) as h:
            worker = await h.dispatch("build it", parent_task_id=turn)
            await h.wait_final(worker)
            settled_now = await Settler(h.db.pool, SettlerConfig()).settle_pending()
            row = await h.task(worker)
    with psycopg.connect(db.admin_dsn) as conn:
        decisions = tables.policy_actions(conn, worker)
        retries = tables.count_tasks(conn, retry_of=worker)
    assert row["status"] == "failed" and row["status_reason"].startswith("could not start")
    assert settled_now == 1 and decisions == ["escalate"] and retries == 0
    assert tables.count(db.admin_dsn, "escalations", task_id=worker) == 1


def test_the_migration_marks_ends_from_before_it_settled_so_none_is_acted_on_twice(
    empty_db: DB, tmp_path: Path
) -> None:
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    for m in migrate.discover():
        if m.version < SETTLEMENT_MIGRATION:
            shutil.copy(m.path, before / m.path.name)
    migrate.migrate(empty_db.admin_dsn, before)
    with psycopg.connect(empty_db.admin_dsn, autocommit=True) as conn:
        ended = tables.insert_task(conn, status="success", ended_at=tables.NOW)
        running = tables.insert_task(conn, status="running")
    shutil.copytree(migrate.migrations_dir(), after)
    migrate.migrate(empty_db.admin_dsn, after)
    with psycopg.connect(empty_db.admin_dsn) as conn:
        settled_at = {t: s is not None for t, s in tables.tasks(conn, "id", "settled_at")}
    assert settled_at == {ended: True, running: False}  # the running one ends later and is settled then
