"""Failed orchestrator turns: visible in the chat, re-run per the turns' policy, escalated, retried by the user
(real PostgreSQL, the real claude CLI against the scripted model, the ingress over HTTP)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from executor.settle import policy
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.wait import until
from tests.served import ingress_server

MESSAGE = "summarise the open issues"


async def _kill_turn(h: Harness, model: ScriptedModelServer, n: int) -> None:
    """SIGKILL the n-th turn (1-based) once the model has its request: a crash without a result line."""
    async def running() -> dict[str, Any] | None:
        turns = await h.turns()
        turn = turns[n - 1] if len(turns) >= n else None
        return turn if turn and turn["status"] == "running" and turn["pid"] else None
    turn = await until(running, f"turn {n} to run")
    await until(lambda: sum(r.role == "orchestrator" for r in model.requests) >= n, f"turn {n} to reach the model")
    await h.wait_event(turn["id"], "stream.system.init")  # mid-run: its first lines journaled
    os.kill(turn["pid"], signal.SIGKILL)


async def _conversation(http: httpx.AsyncClient, thread: str) -> list[dict[str, Any]]:
    read = await http.get(f"/api/threads/{thread}/conversation")
    assert read.status_code == 200, read.text
    return read.json()["events"]  # type: ignore[no-any-return]  # JSON from the API


@pytest.mark.timeout(300)
async def test_a_crashed_turn_shows_an_error_record_runs_again_once_then_escalates_and_the_users_retry_runs_it(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"stall": {"seconds": None}}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
            await http.post("/api/chat", json={"text": MESSAGE, "thread_id": thread})
            await _kill_turn(h, model, 1)  # the policy runs it again with the same message ...
            await _kill_turn(h, model, 2)  # ... once: the second crash is the user's call

            async def escalation() -> dict[str, Any] | None:
                asks = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
                return asks[0] if asks else None
            ask = await until(escalation, "the turn's escalation")
            after_two = await h.turns()
            chat = await _conversation(http, thread)

            # the user presses Retry on the record in the chat; this time the model answers
            model.scenario.rules[:] = [Rule(role="orchestrator", replies=[{"text": "three issues are open"}])]
            retried = await http.post(f"/api/threads/{thread}/retry", json={"task_id": str(after_two[1]["id"])})

            async def third_done() -> list[dict[str, Any]] | None:
                turns = await h.turns()
                return turns if len(turns) == 3 and turns[2]["status"] == "success" else None
            turns = await until(third_done, "the retried turn")
            again = await http.post(f"/api/threads/{thread}/retry", json={"task_id": str(after_two[1]["id"])})
            on_success = await http.post(f"/api/threads/{thread}/retry", json={"task_id": str(turns[2]["id"])})
            chat_after = await _conversation(http, thread)
            asks_after = (await http.get("/api/asks")).json()["asks"]
    first, second = after_two
    # the same message, run again: a crash re-runs once, the second crash waits for the user
    assert [(t["status"], t["attempt"]) for t in after_two] == [("crashed", 1), ("crashed", 2)]
    assert second["retry_of"] == first["id"] and second["brief"] == first["brief"] == MESSAGE
    sent = [json.dumps(r.body.get("messages")) for r in model.requests if r.role == "orchestrator"]
    assert len(sent) >= 3 and all(MESSAGE in s for s in sent)
    # the conversation read shows each failure with status, reason and what was done
    failed = [e for e in chat if e["event_type"] == "turn.failed"]
    assert [(e["payload"]["status"], e["payload"]["action"]) for e in failed] == [
        ("crashed", policy.RETRY_SAME), ("crashed", policy.ESCALATE)]
    assert all(e["payload"]["reason"] and e["payload"]["messages"] == MESSAGE for e in failed)
    assert failed[0]["payload"]["rerun_task_id"] == str(second["id"]) and failed[0]["retried_by"] == str(second["id"])
    assert "retry" not in failed[0]["payload"]  # the harness re-ran it itself
    assert failed[1]["payload"]["retry"]["path"] == f"/api/threads/{thread}/retry"
    assert failed[1]["retried_by"] is None and failed[1]["payload"]["question_id"] == ask["id"]
    # the message the failed turns consumed is still in the chat
    assert [e["payload"]["text"] for e in chat if e["event_type"] == "task.user_message"] == [MESSAGE]
    assert [o["label"] for o in ask["questions"][0]["options"]] == ["Retry", "Skip"]
    # Retry from the chat: the same message once more, and the escalation is answered by it
    assert retried.status_code == 202, retried.text
    assert turns[2]["brief"] == MESSAGE and turns[2]["retry_of"] == second["id"] and turns[2]["attempt"] == 3
    assert again.status_code == 409 and on_success.status_code == 409
    assert next(e for e in chat_after if e["event_type"] == "turn.failed" and e["task_id"] == str(second["id"])
                )["retried_by"] == str(turns[2]["id"])
    resolved = [e["payload"] for e in chat_after if e["event_type"] == "escalation.resolved"]
    assert [(r["decision"], r["retry_task_id"]) for r in resolved] == [("retry", str(turns[2]["id"]))]
    assert next(a for a in asks_after if a["id"] == ask["id"])["status"] == "cancelled"
    assert [t["status"] for t in turns] == ["crashed", "crashed", "success"]


async def test_a_retry_of_an_unknown_or_unfailed_turn_is_refused_and_queues_nothing(db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"text": "fine"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
            await http.post("/api/chat", json={"text": "hello", "thread_id": thread})

            async def done() -> list[dict[str, Any]] | None:
                turns = await h.turns()
                return turns if turns and turns[0]["status"] == "success" else None
            (turn,) = await until(done, "the turn")
            nothing_failed = await http.post(f"/api/threads/{thread}/retry", json={})
            succeeded = await http.post(f"/api/threads/{thread}/retry", json={"task_id": str(turn["id"])})
            elsewhere = await http.post(f"/api/threads/{turn['id']}/retry", json={"task_id": str(turn["id"])})
            bad = await http.post(f"/api/threads/{thread}/retry", json={"task_id": "nope"})
            queued = tables.count(db.admin_dsn, "thread_control_queue", action="retry")
    assert nothing_failed.status_code == 404 and succeeded.status_code == 409 and elsewhere.status_code == 404
    assert bad.status_code == 422 and queued == 0


@pytest.mark.timeout(300)
async def test_retry_answered_in_a_failed_turns_escalation_runs_its_messages_once_the_thread_is_free(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"stall": {"seconds": None}}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
            await http.post("/api/chat", json={"text": MESSAGE, "thread_id": thread})
            await _kill_turn(h, model, 1)
            await _kill_turn(h, model, 2)

            async def escalation() -> dict[str, Any] | None:
                asks = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
                return asks[0] if asks else None
            ask = await until(escalation, "the turn's escalation")
            model.scenario.rules[:] = [Rule(role="orchestrator", replies=[{"text": "done this time"}])]
            text = ask["questions"][0]["question"]
            answered = await http.post(f"/api/asks/{ask['id']}/answer", json={"answers": {text: policy.ESCALATION_RETRY}})

            async def third_done() -> list[dict[str, Any]] | None:
                turns = await h.turns()
                return turns if len(turns) == 3 and turns[2]["status"] == "success" else None
            turns = await until(third_done, "the retried turn")
            chat = await _conversation(http, thread)
    assert answered.status_code == 200, answered.text
    assert [(t["brief"], t["attempt"]) for t in turns] == [(MESSAGE, 1), (MESSAGE, 2), (MESSAGE, 3)]
    resolved = [e["payload"] for e in chat if e["event_type"] == "escalation.resolved"]
    assert [(r["decision"], r["answer"]) for r in resolved] == [("retry", "Retry")]
    assert [e["retried_by"] for e in chat if e["event_type"] == "turn.failed"] == [str(turns[1]["id"]),
                                                                                   str(turns[2]["id"])]


async def test_a_rate_limited_turn_runs_its_messages_again_after_the_back_off(db: DB, tmp_path: Path) -> None:
    scenario = Scenario(rules=[Rule(role="orchestrator", replies=[{"error": {"status": 429, "retry_after": 0}}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, backoff_base_s=2.0) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            thread = (await http.post("/api/threads", json={"mode": "autonomous"})).json()["thread_id"]
            await http.post("/api/chat", json={"text": MESSAGE, "thread_id": thread})

            async def limited() -> list[dict[str, Any]] | None:
                turns = await h.turns()
                return turns if turns and turns[0]["status"] == "rate_limited" else None
            await until(limited, "the rate-limited turn")
            model.scenario.rules[:] = [Rule(role="orchestrator", replies=[{"text": "here is the summary"}])]

            async def second_done() -> list[dict[str, Any]] | None:
                turns = await h.turns()
                return turns if len(turns) == 2 and turns[1]["status"] == "success" else None
            await until(second_done, "the backed-off re-run")
            rows = tables.tasks(db.admin_dsn, "ended_at", "not_before", "started_at", "brief", role="orchestrator")
            chat = await _conversation(http, thread)
    (first_end, _, _, first_brief), (_, not_before, started, brief) = rows
    assert brief == first_brief == MESSAGE
    assert (not_before - first_end).total_seconds() >= 2.0 - 0.5 and started >= not_before
    (failed,) = [e["payload"] for e in chat if e["event_type"] == "turn.failed"]
    assert (failed["status"], failed["action"], failed["delay_s"]) == ("rate_limited", policy.BACK_OFF, 2.0)
