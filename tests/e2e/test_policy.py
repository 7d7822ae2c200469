"""The not-clean-return policy, escalations, interactive approvals and concurrent threads, end to end
(real PostgreSQL, the real claude CLI, the scripted model playing orchestrator, workers and extractor)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool

from executor.settle import policy, threads
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.harness import Harness, running_executor
from tests import tables
from tests.pg import DB
from tests.wait import until
from tests.scenarios import STALL_FOREVER, dispatch, extractor, handoff, one_worker
from tests.served import ingress_server

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)

ROOT = Path(__file__).resolve().parents[2]


async def _rows(h: Harness, sql: str, *params: Any) -> list[dict[str, Any]]:
    conn = await h._conn()
    cur = await conn.execute(sql, params)
    names = [c.name for c in cur.description or []]
    return [dict(zip(names, r)) for r in await cur.fetchall()]


async def _workers(h: Harness) -> list[dict[str, Any]]:
    return await _rows(h, "SELECT id, status, attempt, retry_of, pid, brief, started_at, ended_at, not_before "
                          "FROM tasks WHERE role = 'worker' ORDER BY created_at")


async def _thread(http: httpx.AsyncClient, mode: str) -> str:
    made = await http.post("/api/threads", json={"title": mode, "mode": mode})
    assert made.status_code == 202, made.text
    return made.json()["thread_id"]  # type: ignore[no-any-return]  # JSON from the API


async def _pending_ask(http: httpx.AsyncClient) -> dict[str, Any] | None:
    asks = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
    return asks[0] if asks else None


async def _answer(http: httpx.AsyncClient, ask: dict[str, Any], label: str) -> None:
    text = ask["questions"][0]["question"]
    answered = await http.post(f"/api/asks/{ask['id']}/answer", json={"answers": {text: label}})
    assert answered.status_code == 200, answered.text


def _result(state: str) -> dict[str, Any]:
    return handoff("the step", state, next_step="see the status")


def _handoff(state: str) -> Rule:
    return extractor(_result(state))


# ---- the table ----------------------------------------------------------------------------------------

def test_the_docs_document_the_policy_tables_as_the_code_declares_them() -> None:
    page = (ROOT / "docs" / "threads.md").read_text()
    section = page.split("\n## Not-clean-return policy\n", 1)[1].split("\n## ", 1)[0]
    workers, turns = section.split("\n### Orchestrator turns\n", 1)

    def rows(text: str) -> dict[str, tuple[str, int]]:
        return {m.group(1): (m.group(2), int(m.group(3))) for m in
                re.finditer(r"^\| `(\w+)` \| `(\w+)` \| (\d+) \|", text, re.MULTILINE)}
    assert rows(workers) == {status: (rule.action, rule.budget) for status, rule in policy.POLICY.items()}
    assert rows(turns) == {status: (rule.action, rule.budget) for status, rule in policy.TURN_POLICY.items()}


def test_gate_categories_are_named_from_what_a_denied_call_tried() -> None:
    def gate(command: str) -> str:
        return policy.gate_of({"tool_name": "Bash", "tool_input": {"command": command}})

    assert gate("sudo apt update") == "privilege escalation"
    assert gate("pip install requests") == "new dependency"
    assert gate("git push origin main") == "git beyond the branch"
    assert gate("rm -rf build") == "destructive data op"
    assert gate("cat ~/.ssh/id_rsa") == "secrets"
    assert gate("echo hi > /etc/motd") == "outside the project tree"
    assert gate("touch ./notes.txt") == "tool not allowed"
    decisions = policy.gate_decisions([{"tool_name": "Bash", "tool_input": {"command": "pip install x"}}])
    assert decisions[0]["gate"] == "new dependency" and decisions[0]["chosen"].startswith("stay in scope")


# ---- end to end ------------------------------------------------------------------------------------------

async def test_a_crashed_worker_is_retried_once_then_escalated_and_skip_is_carried_out(db: DB, tmp_path: Path) -> None:
    scenario = one_worker("do the fragile step", STALL_FOREVER, noted="understood", result=_result("it was killed"))
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _thread(http, "autonomous")
            await http.post("/api/chat", json={"text": "do the fragile thing", "thread_id": thread})
            for attempt in (1, 2):
                async def running(n: int = attempt) -> dict[str, Any] | None:
                    ws = await _workers(h)
                    return ws[n - 1] if len(ws) >= n and ws[n - 1]["status"] == "running" and ws[n - 1]["pid"] \
                        else None
                worker = await until(running, f"worker attempt {attempt} to run")
                # mid-run: killed once it has asked the model (which never answers it)
                def reached(n: int = attempt) -> bool:
                    return sum(r.role == "worker" for r in model.requests) >= n
                await until(reached, f"worker attempt {attempt} to reach the model")
                os.kill(worker["pid"], signal.SIGKILL)
            ask = await until(lambda: _pending_ask(http), "the escalation question")
            workers_at_ask = await _workers(h)
            await _answer(http, ask, policy.ESCALATION_SKIP)
            events = await until(lambda: _events_with(h, "escalation.resolved"), "the escalation to be acted on")
            turn = await until(lambda: _turn_containing(h, "the user answered"), "the orchestrator to hear of it")
            await asyncio.sleep(1)  # a window in which no third worker may start (skipped)
            workers = await _workers(h)
    decisions = [e.payload for e in events if e.event_type == "policy.decision"]
    assert [(d["status"], d["action"], d["attempt"]) for d in decisions] == [
        ("crashed", "retry_same", 1), ("crashed", "escalate", 2)]
    assert [w["status"] for w in workers_at_ask] == ["crashed", "crashed"]
    assert workers_at_ask[1]["retry_of"] == workers_at_ask[0]["id"] and workers_at_ask[1]["attempt"] == 2
    # retry_same: the same brief, told that an earlier attempt was interrupted
    assert workers_at_ask[1]["brief"].startswith(
        workers_at_ask[0]["brief"] + "\n\n## An earlier attempt was interrupted")
    question = ask["questions"][0]
    assert [o["label"] for o in question["options"]] == ["Retry", "Skip", "Stop the plan"]
    assert "crashed again" in question["question"] and ask["task_id"] == str(workers_at_ask[1]["id"])
    # the escalation's record names the question the panel shows (the ask service's one record)
    [asked] = [e.payload for e in events if e.event_type == "question.asked"]
    assert (asked["question_id"], asked["tool_use_id"], asked["asked_by"]) == (ask["id"], ask["tool_use_id"], "harness")
    resolved = [e.payload for e in events if e.event_type == "escalation.resolved"]
    assert [(r["decision"], r["answer"]) for r in resolved] == [("skip", "Skip")]
    assert "Skip" in turn["brief"]
    assert len(workers) == 2  # skipped: nothing more was started


async def _events_with(h: Harness, event_type: str) -> list[Any] | None:
    events = await h.events()
    return events if any(e.event_type == event_type for e in events) else None


async def _turn_containing(h: Harness, text: str) -> dict[str, Any] | None:
    rows = await _rows(h, "SELECT id, brief, status FROM tasks WHERE role = 'orchestrator' AND brief LIKE %s",
                       f"%{text}%")
    return rows[0] if rows else None


async def test_a_rate_limited_worker_is_retried_after_the_back_off(db: DB, tmp_path: Path) -> None:
    scenario = one_worker("fetch the numbers", {"text": "fetched them"}, noted="thanks",
                          first_run=[{"error": {"status": 429, "retry_after": 0}}], result=_result("fetched"))
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True, backoff_base_s=2.0) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _thread(http, "autonomous")
            await http.post("/api/chat", json={"text": "get the numbers", "thread_id": thread})
            await until(lambda: _turn_containing(h, "[harness] Worker"), "the clean retry's report")
            workers = await _workers(h)
            events = await h.events()
    decisions = [e.payload for e in events if e.event_type == "policy.decision"]
    assert [(d["status"], d["action"]) for d in decisions] == [("rate_limited", "back_off"), ("success", "report")]
    assert decisions[0]["delay_s"] == 2.0
    assert [w["status"] for w in workers] == ["rate_limited", "success"]
    first, retry = workers
    assert retry["retry_of"] == first["id"]
    # not started before its back-off ran out (both times come from the database's clock)
    assert retry["not_before"] is not None and retry["started_at"] >= retry["not_before"]
    assert (retry["not_before"] - first["ended_at"]).total_seconds() >= 2.0 - 0.5


async def test_a_gated_worker_records_its_denials_and_stop_the_plan_stops_the_thread(db: DB, tmp_path: Path) -> None:
    bash = {"tool_use": {"name": "Bash", "input": {"command": "pip install requests"}}}
    scenario = Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "stopping"}]),
        Rule(role="orchestrator", replies=[dispatch("set up the client", allowed_tools=["Read"]),
                                           dispatch("and document it"), {"text": "dispatched"}]),
        Rule(role="worker", match="set up the client", replies=[bash, {"text": "I could not install it"}]),
        Rule(role="worker", match="document it", replies=[STALL_FOREVER]),
        _handoff("blocked on a dependency"),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _thread(http, "autonomous")
            await http.post("/api/chat", json={"text": "set things up", "thread_id": thread})
            ask = await until(lambda: _pending_ask(http), "the escalation question")
            await _answer(http, ask, policy.ESCALATION_STOP)
            await until(lambda: _turn_containing(h, "chose to stop the plan"), "the orchestrator to hear of it")

            async def all_ended() -> list[dict[str, Any]] | None:
                ws = await _workers(h)
                return ws if ws and all(w["status"] not in ("pending", "running") for w in ws) else None
            workers = await until(all_ended, "every worker to end")
            events = await h.events()
    assert [w["status"] for w in workers] == ["gated", "cancelled"]
    handoff = next(e.payload for e in events if e.event_type == "handoff" and e.task_id == workers[0]["id"])
    assert handoff["status"] == "gated"
    assert [g["gate"] for g in handoff["gate_decisions"]] == ["new dependency"]
    assert "pip install requests" in handoff["gate_decisions"][0]["decision_point"]
    gated = next(e.payload for e in events if e.event_type == "policy.decision" and e.task_id == workers[0]["id"])
    assert gated["action"] == "escalate"
    resolved = next(e.payload for e in events if e.event_type == "escalation.resolved")
    assert resolved["decision"] == "stop_plan" and resolved["stop_requested"] == [str(workers[1]["id"])]


def _tool_results(events: list[Any]) -> list[dict[str, Any]]:
    return [b for e in events if e.event_type == "stream.user" for b in e.payload["message"]["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"]


@pytest.mark.timeout(300)
async def test_an_interactive_dispatch_returns_at_once_and_the_worker_waits_for_approval_across_a_restart(
    db: DB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no poll to fall back on: the answers' own wake-ups must carry the approvals out
    monkeypatch.setattr(threads, "POLL_S", 600.0)
    scenario = Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness] The user approved", replies=[{"text": "good, it runs"}]),
        Rule(role="orchestrator", match_last="[harness] The user did not approve", replies=[{"text": "dropped"}]),
        Rule(role="orchestrator", match_last="[harness] Worker", replies=[{"text": "all done"}]),
        Rule(role="orchestrator", match="wipe things", replies=[dispatch("wipe the disk"), {"text": "asked"}]),
        Rule(role="orchestrator", replies=[dispatch("clear the cache <script>alert(1)</script>"),
                                           {"text": "waiting for the user's approval"}]),
        Rule(role="worker", replies=[{"text": "cleared"}]),
        _handoff("cleared"),
    ])

    async def approval_for(http: httpx.AsyncClient, brief: str) -> dict[str, Any] | None:
        asks = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
        return next((a for a in asks if a["questions"][0]["options"][0]["preview"].startswith(brief)), None)

    async def turn_ended(h: Harness, thread: str, text: str) -> dict[str, Any] | None:
        rows = await _rows(h, "SELECT id, status FROM tasks WHERE session_id = %s AND brief LIKE %s "
                              "AND status NOT IN ('pending', 'running')", thread, f"%{text}%")
        return rows[0] if rows else None

    with ScriptedModelServer(scenario) as model:
        async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            async with running_executor(db, model, tmp_path, extract=True) as h:
                keep = await _thread(http, "interactive")
                drop = await _thread(http, "interactive")
                await http.post("/api/chat", json={"text": "tidy up", "thread_id": keep})
                await http.post("/api/chat", json={"text": "wipe things", "thread_id": drop})
                approve = await until(lambda: approval_for(http, "clear the cache"), "the first approval")
                reject = await until(lambda: approval_for(http, "wipe the disk"), "the second approval")
                # the dispatching turns ended without waiting for anybody
                first_turn = await until(lambda: turn_ended(h, keep, "tidy up"), "the dispatching turn")
                await until(lambda: turn_ended(h, drop, "wipe things"), "the other dispatching turn")
                await asyncio.sleep(1.0)  # a window in which neither worker may start (no approval yet)
                waiting = await _workers(h)
                waiting_rows = tables.dict_rows(db.admin_dsn, "tasks", "brief", "status", "activity", role="worker")
                turn_events = await h.events(first_turn["id"])
            # answered while no executor runs: carried out at the next start
            await _answer(http, approve, "Approve")
            async with running_executor(db, model, tmp_path, extract=True) as h:
                await _answer(http, reject, "Reject")
                await until(lambda: _turn_containing(h, "[harness] The user approved"), "the approval to be told")
                await until(lambda: _turn_containing(h, "[harness] The user did not approve"), "the rejection")
                await until(lambda: _turn_containing(h, "[harness] Worker"), "the approved worker's report")
                workers = await _workers(h)
                events = await h.events()
    result = _tool_results(turn_events)[0]
    assert not result.get("is_error") and "awaiting_approval" in json.dumps(result["content"])
    assert first_turn["status"] == "success"
    assert [(w["status"], w["activity"]) for w in waiting_rows] == [("pending", "awaiting_approval")] * 2
    assert all(w["started_at"] is None for w in waiting)
    option = approve["questions"][0]["options"][0]
    assert option["label"] == "Approve" and option["preview"].startswith("clear the cache <script>")
    by_brief = {w["brief"]: w for w in workers}
    assert by_brief["clear the cache <script>alert(1)</script>"]["status"] == "success"
    rejected = by_brief["wipe the disk"]
    assert rejected["status"] == "cancelled" and rejected["started_at"] is None
    spawned = {e.task_id for e in events if e.event_type == "task.spawned"}
    assert rejected["id"] not in spawned
    resolved = {e.task_id: e.payload["decision"] for e in events if e.event_type == "approval.resolved"}
    assert sorted(resolved.values()) == ["approved", "rejected"] and resolved[rejected["id"]] == "rejected"
    refused = [e.payload for e in events if e.event_type == "task.dispatch_refused"]
    assert [(r["reason"], r["answer"]) for r in refused] == [("not approved by the user", "Reject")]
    told = [e.payload["text"] for e in events if e.event_type == "thread.harness_message"]
    assert any(t.startswith("[harness] The user approved") for t in told)
    assert any(t.startswith("[harness] The user did not approve") and "wipe the disk" in t for t in told)


@pytest.mark.timeout(240)
async def test_two_threads_take_turns_at_the_same_time_without_mixing_messages(db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"stall": {"seconds": 3, "text": "answered"}}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            a, b = await _thread(http, "autonomous"), await _thread(http, "autonomous")
            await http.post("/api/chat", json={"text": "message for A", "thread_id": a})
            await http.post("/api/chat", json={"text": "message for B", "thread_id": b})

            async def both_done() -> list[dict[str, Any]] | None:
                turns = await _rows(h, "SELECT session_id::text AS thread, brief, status, started_at, ended_at "
                                       "FROM tasks WHERE role = 'orchestrator' ORDER BY created_at")
                return turns if len(turns) == 2 and all(t["status"] == "success" for t in turns) else None
            turns = await until(both_done, "both turns")
    by_thread = {t["thread"]: t for t in turns}
    assert by_thread[a]["brief"] == "message for A" and by_thread[b]["brief"] == "message for B"
    ta, tb = by_thread[a], by_thread[b]
    assert ta["started_at"] < tb["ended_at"] and tb["started_at"] < ta["ended_at"]  # they overlapped
    for request in model.requests:
        sent = json.dumps(request.body.get("messages"))
        assert not ("message for A" in sent and "message for B" in sent)


async def test_an_escalation_answered_while_the_executor_is_down_is_acted_on_when_it_returns(
    db: DB, tmp_path: Path
) -> None:
    bash = {"tool_use": {"name": "Bash", "input": {"command": "sudo systemctl restart nginx"}}}
    scenario = one_worker("restart the proxy", {"text": "restarted it another way"}, said="sent", noted="ok",
                          first_run=[bash, {"text": "not allowed"}], result=_result("done"),
                          dispatch_input={"allowed_tools": ["Read"]})
    with ScriptedModelServer(scenario) as model:
        async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            async with running_executor(db, model, tmp_path, extract=True) as h:
                thread = await _thread(http, "autonomous")
                await http.post("/api/chat", json={"text": "fix the proxy", "thread_id": thread})
                ask = await until(lambda: _pending_ask(http), "the escalation question")
            await _answer(http, ask, policy.ESCALATION_RETRY)  # no executor is running now
            async with running_executor(db, model, tmp_path, extract=True) as h:
                await until(lambda: _turn_containing(h, "[harness] Worker"), "the retried worker's report")
                workers = await _workers(h)
                events = await h.events()
    resolved = [e.payload for e in events if e.event_type == "escalation.resolved"]
    assert [r["decision"] for r in resolved] == ["retry"]
    assert [w["status"] for w in workers] == ["gated", "success"] and workers[1]["retry_of"] == workers[0]["id"]
    gated = next(e.payload for e in events if e.event_type == "handoff" and e.task_id == workers[0]["id"])
    assert gated["gate_decisions"][0]["gate"] == "privilege escalation"


async def test_an_extraction_failure_offers_re_extract_which_runs_only_the_extractor_again(
    db: DB, tmp_path: Path
) -> None:
    scenario = one_worker("write the release notes", {"text": "wrote the release notes"},
                          result=_result("the notes are written"),
                          before=[Rule(role="extractor", sessions=1,  # the first run fails
                                       replies=[{"text": "prose instead of a handoff"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = await _thread(http, "autonomous")
            await http.post("/api/chat", json={"text": "write the notes", "thread_id": thread})
            ask = await until(lambda: _pending_ask(http), "the extraction_failed escalation")
            failed = await _workers(h)
            await _answer(http, ask, policy.ESCALATION_REEXTRACT)
            turn = await until(lambda: _turn_containing(h, "[harness] Worker"), "the orchestrator to get the handoff")
            workers = await _workers(h)
            extractors = tables.dict_rows(db.admin_dsn, "tasks", "status", "parent_task_id", role="extractor")
            events = await h.events()
    (worker,) = workers  # the worker did not run again
    assert [w["status"] for w in failed] == ["extraction_failed"]
    question = ask["questions"][0]
    assert [o["label"] for o in question["options"]] == ["Re-extract", "Retry worker", "Skip", "Stop the plan"]
    assert len(extractors) == 2 and all(x["parent_task_id"] == worker["id"] for x in extractors)
    assert [e.task_id for e in events if e.event_type == "task.spawned" and e.task_id == worker["id"]] == [worker["id"]]
    resolved = [e.payload for e in events if e.event_type == "escalation.resolved"]
    assert [r["decision"] for r in resolved] == ["reextract"]
    handoff = next(e.payload for e in events if e.event_type == "handoff")
    assert handoff["status"] == "success" and handoff["current_state"] == "the notes are written"
    assert worker["status"] == "success"  # its own end counts again once a handoff passed the gate
    decisions = [e.payload["action"] for e in events if e.event_type == "policy.decision"]
    assert decisions == ["escalate", "report"]
    assert f"[harness] Worker {worker['id']} finished" in turn["brief"]


async def test_a_worker_awaiting_approval_is_never_claimed_and_stopping_it_closes_its_approval(
    pool: AsyncConnectionPool, db: DB, tmp_path: Path
) -> None:
    import psycopg

    from executor.settle import approvals
    from executor.sql import queries

    thread, turn = tables.thread_with_turn(db.admin_dsn)
    worker = await approvals.request(pool, brief="rebuild the index", thread_id=thread, asker_task_id=turn,
                                     project_id=None, plan_ref=None, allowed_tools=None, workdir=tmp_path)
    async with pool.connection() as conn:
        # an executor with a live lease, so only the approval can keep the worker from being claimed
        epoch = (await (await conn.execute(queries["join_fleet"], {
            "name": "solo", "labels": [], "capacity": 4, "lease_s": 60, "version": "test", "sandbox": "bwrap",
            "workdir": str(tmp_path)})).fetchone())[0]  # type: ignore[index]
        claim = {"n": 10, "n_unattended": 10, "name": "solo", "epoch": epoch, "labels": [], "shared_config": True}
        claimed = await (await conn.execute(queries["claim_pending_tasks"], claim)).fetchall()
        await conn.execute(queries["cancel_pending_task"], {"id": worker, "reason": "stop_requested"})  # Stop
    acted = await approvals.apply_answered(pool)
    with psycopg.connect(db.admin_dsn) as conn:
        question = conn.execute("SELECT q.status, a.status, a.decision FROM approvals a JOIN questions q "
                                "ON q.id = a.question_id WHERE a.task_id = %s", [worker]).fetchone()
        told = tables.count(conn, "chat_queue")
    assert claimed == [] and acted == 1
    assert question == ("cancelled", "resolved", "task_ended") and told == 0
