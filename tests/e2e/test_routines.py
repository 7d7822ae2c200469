"""A routine's run end to end (real PostgreSQL, the real claude CLI, the scripted model): a signed webhook
starts an autonomous run whose prompt carries the payload; its worker's gated command is denied; the run ends
`gated` with its history, and the notification names the denied call."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from executor.notify.notifier import NotifyConfig
from executor.routines import RoutinesConfig
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import journal
from shared.models import NewEvent
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.scenarios import dispatch, extractor, handoff, one_worker
from tests.served import ingress_server
from tests.wait import until

pytestmark = pytest.mark.e2e


async def _run(http: httpx.AsyncClient, routine: str) -> dict[str, Any] | None:
    runs = (await http.get(f"/api/routines/{routine}/runs")).json()["runs"]
    return runs[0] if runs and runs[0]["status"] not in ("queued", "running") else None


async def _routine_notes(h: Harness) -> list[tuple[str, str, str]] | None:
    cur = await (await h._conn()).execute("SELECT kind, title, body FROM notifications ORDER BY created_at")
    rows = [(r[0], r[1], r[2]) for r in await cur.fetchall()]
    return rows if any(kind.startswith("routine_") for kind, _, _ in rows) else None


@pytest.mark.timeout(240)
async def test_a_webhook_run_in_an_autonomous_routine_whose_worker_is_gated_ends_gated_and_the_note_names_it(
    db: DB, tmp_path: Path
) -> None:
    scenario = one_worker("tidy up", {"tool_use": {"name": "Bash", "input": {"command": "sudo true"}}},
                          {"text": "done"}, result=handoff("tidy up", "done what was allowed", status="gated"))
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True,
                                    notify_config=NotifyConfig(data_dir=tmp_path / "var", rate_limit_s=0)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
            made = await http.post("/api/routines", json={
                "name": "pr review", "webhook": True, "budget": {"usd_per_run": 0.5},
                "prompt": "Review pull request {{ event.number }}: {{ event.pull_request.title }}"})
            assert made.status_code == 202, made.text
            routine, secret = made.json()["id"], made.json()["webhook_secret"]
            body = json.dumps({"number": 42, "pull_request": {"title": "Tidy the parser"}}).encode()
            signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
            hooked = await http.post(f"/api/hooks/{routine}", content=body, headers={
                "content-type": "application/json", "x-github-delivery": "72d3162e", "x-hub-signature-256": signature})
            assert hooked.status_code == 202, hooked.text
            run = await until(lambda: _run(http, routine), "the run's end", timeout=180)
            notes = await until(lambda: _routine_notes(h), "the routine's notification", timeout=30)
            prompts = [r.body for r in model.requests if r.role == "orchestrator"]
            argvs = [e.payload["argv"] for e in await h.events() if e.event_type == "task.spawned"]
            thread_turns = (await http.get("/api/tasks", params={"thread_id": run["thread_id"]})).json()["tasks"]
    assert run["status"] == "gated" and run["trigger"] == "webhook"
    assert run["prompt"] == "Review pull request 42: Tidy the parser"
    assert [d["summary"] for d in run["gate_denials"]] == ["Bash: sudo true"]
    assert run["duration_s"] > 0 and run["task_id"] and run["cost_usd"] is not None
    assert any("Review pull request 42: Tidy the parser" in json.dumps(p) for p in prompts)
    # the run's end once, not each of its turns' ends as well (what needs the user still comes: the escalation)
    assert "turn_finished" not in [kind for kind, _, _ in notes], notes
    [(kind, title, said)] = [n for n in notes if n[0].startswith("routine_")]
    assert (kind, title) == ("routine_gated", "Routine pr review: gated")
    assert said.startswith("The gate denied: Bash: sudo true") and said.endswith(" USD)"), said
    # every CLI process of the run (turns, the worker, its extractor) under what is left of its USD per run
    budgets = [float(a[a.index("--max-budget-usd") + 1]) for a in argvs]
    assert len(budgets) >= 3 and budgets[0] == 0.5 and all(0.49 < b <= 0.5 for b in budgets), budgets
    assert thread_turns  # the run's thread holds its turns (and the history links to them)


@dataclass
class FakeClock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now


@pytest.mark.timeout(180)
async def test_an_exhausted_quota_window_holds_a_routines_run_while_chat_still_runs_and_the_run_goes_at_reset(
    db: DB, tmp_path: Path
) -> None:
    clock = FakeClock(datetime.now(UTC))
    resets = clock.now + timedelta(hours=2)
    with ScriptedModelServer(Scenario.single({"text": "on it"})) as model:
        async with running_executor(db, model, tmp_path, routines=RoutinesConfig(clock=clock)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
            # the window as the CLI reports it under a subscription's login (the scripted model's API-key login
            # gets no such line from the CLI: docs/claude-cli.md), journaled as a run's stream line
            await journal.append(h.db.pool, [NewEvent("stream.rate_limit_event", {
                "type": "rate_limit_event", "rate_limit_info": {
                    "status": "rejected", "rateLimitType": "five_hour", "resetsAt": int(resets.timestamp())}})])
            made = (await http.post("/api/routines", json={"name": "sweep", "prompt": "sweep the logs"})).json()
            await until(lambda: _exhausted(http), "the window recorded")
            await http.post(f"/api/routines/{made['id']}/run", json={})
            waiting = await until(lambda: _waiting(http, made["id"]), "the run waiting for quota")
            # interactive work still goes: the user decides
            thread = (await http.post("/api/threads", json={"mode": "interactive"})).json()["thread_id"]
            await http.post("/api/chat", json={"text": "hello", "thread_id": thread})
            await until(lambda: _turn_done(h, thread), "the chat's turn", timeout=90)
            still = (await http.get(f"/api/routines/{made['id']}/runs")).json()["runs"][0]
            clock.now = resets + timedelta(seconds=1)
            ran = await until(lambda: _run(http, made["id"]), "the run after the reset", timeout=90)
    assert waiting["reason"].startswith(f"waiting for quota until {resets.astimezone(UTC):%H:%M} UTC")
    assert still["status"] == "queued" and still["task_id"] is None
    assert ran["status"] == "succeeded" and ran["reason"] is None


async def _exhausted(http: httpx.AsyncClient) -> bool:
    return any(w["exhausted"] for w in (await http.get("/api/quota")).json()["windows"])


async def _waiting(http: httpx.AsyncClient, routine: str) -> dict[str, Any] | None:
    runs = (await http.get(f"/api/routines/{routine}/runs")).json()["runs"]
    return runs[0] if runs and (runs[0]["reason"] or "").startswith("waiting for quota") else None


async def _turn_done(h: Harness, thread: str) -> bool:
    cur = await (await h._conn()).execute("SELECT status FROM tasks WHERE session_id = %s", [thread])
    return [r[0] for r in await cur.fetchall()] == ["success"]


@pytest.mark.timeout(240)
async def test_a_runs_processes_share_its_usd_per_run_and_one_that_would_start_with_it_spent_is_skipped(
    db: DB, tmp_path: Path
) -> None:
    # priced by the CLI (docs/claude-cli.md): 10 000 output tokens 0.20 USD, 14 750 about 0.295
    scenario = Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "noted"}]),
        Rule(role="orchestrator", replies=[{**dispatch("count the files"), "usage": {"output_tokens": 10_000}},
                                           {"text": "dispatched"}]),
        Rule(role="worker", replies=[{"text": "three files", "usage": {"output_tokens": 14_750}}]),
        extractor(handoff("count the files", "three files")),
    ])
    with ScriptedModelServer(scenario) as model:
        # budget asks off (PETAL_BUDGET_ASK_S=0): an unattended run ends at its cap (tests/e2e/test_budgets.py asks)
        async with running_executor(db, model, tmp_path, extract=True, budget_ask_s=None) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
            made = await http.post("/api/routines", json={"name": "count", "prompt": "count the files",
                                                          "budget": {"usd_per_run": 0.5}})
            assert made.status_code == 202, made.text
            routine = made.json()["id"]
            assert (await http.post(f"/api/routines/{routine}/run", json={})).status_code == 202
            run = await until(lambda: _run(http, routine), "the run's end", timeout=180)
            events = await h.events()
    roles = {e.task_id: e.payload["role"] for e in events if e.event_type == "task.spawned"}
    budgets = {roles[e.task_id]: e.payload["argv"][e.payload["argv"].index("--max-budget-usd") + 1]
               for e in events if e.event_type == "task.spawned"}
    costs = [float(e.payload["total_cost_usd"]) for e in events if e.event_type == "stream.result"]
    unspawned = [e.payload["reason"] for e in events if e.event_type == "task.exited" and not e.payload.get("spawned", True)]
    # the first turn had the whole 0.50; the worker what the turn left if it had ended, else the whole
    assert budgets["orchestrator"] == "0.5000"
    assert budgets["worker"] in ("0.5000", f"{0.5 - costs[0]:.4f}"), (budgets, costs)
    # the turn and the worker spent 0.495: the extractor would start with less than a cent, and is not started
    assert len(costs) == 2 and 0.49 < sum(costs) < 0.5, costs
    assert "extractor" not in budgets
    assert unspawned and unspawned[0] == f"budget: the run spent {sum(costs):.2f} of its 0.50 USD", unspawned
    assert (run["status"], run["reason"]) == ("failed", unspawned[0])
    assert run["cost_usd"] == pytest.approx(sum(costs))
