"""Budgets that ask: a routine run whose next process would start with its USD cap spent pauses — its process
ended, none held, the run not ended — and asks the user to raise the cap or stop; a raise runs the stopped task
with a grant from the new cap and the run spends within it; a stop, or no answer by an unattended run's
deadline, ends the run with the reason. Real PostgreSQL, the real CLI (which prices the scripted usage), the
ingress."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from executor.settle import budgets
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.e2e.test_routines import _run
from tests.harness import running_executor
from tests.pg import DB
from tests.scenarios import dispatch, extractor, handoff
from tests.served import ingress_server
from tests.wait import until

pytestmark = pytest.mark.e2e

CAP = 0.5


def _scenario() -> Scenario:
    # priced by the CLI (docs/claude-cli.md): the turn 0.20 USD, the worker about 0.295: the extractor would
    # start with less than a cent of the run's 0.50
    return Scenario(rules=[
        Rule(role="orchestrator", match_last="[harness]", replies=[{"text": "noted"}]),
        Rule(role="orchestrator", replies=[{**dispatch("count the files"), "usage": {"output_tokens": 10_000}},
                                           {"text": "dispatched"}]),
        Rule(role="worker", replies=[{"text": "three files", "usage": {"output_tokens": 14_750}}]),
        extractor(handoff("count the files", "three files")),
    ])


async def _start(http: httpx.AsyncClient) -> str:
    made = await http.post("/api/routines", json={"name": "count", "prompt": "count the files",
                                                  "budget": {"usd_per_run": CAP}})
    assert made.status_code == 202, made.text
    routine = str(made.json()["id"])
    assert (await http.post(f"/api/routines/{routine}/run", json={})).status_code == 202
    return routine


async def _budget_card(http: httpx.AsyncClient) -> dict[str, Any] | None:
    asks = (await http.get("/api/asks", params={"status": "pending"})).json()["asks"]
    return next((a for a in asks if a["questions"][0]["header"] == budgets.HEADER), None)


async def _answer(http: httpx.AsyncClient, card: dict[str, Any], label: str) -> None:
    question = card["questions"][0]
    answered = await http.post(f"/api/asks/{card['id']}/answer", json={"answers": {question["question"]: label}})
    assert answered.status_code == 200, answered.text


def _grants(events: list[Any]) -> dict[str, list[float]]:
    roles: dict[str, list[float]] = {}
    for e in events:
        if e.event_type == "task.spawned":
            argv = e.payload["argv"]
            roles.setdefault(e.payload["role"], []).append(float(argv[argv.index("--max-budget-usd") + 1]))
    return roles


async def _paused(db: DB, http: httpx.AsyncClient, routine: str) -> dict[str, Any]:
    """The run paused on its ask: the card, no process running, the run still running."""
    card = await until(lambda: _budget_card(http), "the budget ask", 120)
    assert tables.count_running(db.admin_dsn) == 0
    runs = (await http.get(f"/api/routines/{routine}/runs")).json()["runs"]
    assert runs[0]["status"] == "running"
    return card


async def test_a_run_at_its_cap_asks_and_a_raise_runs_the_stopped_task_within_the_new_cap(
    db: DB, tmp_path: Path
) -> None:
    with ScriptedModelServer(_scenario()) as model:
        async with running_executor(db, model, tmp_path, extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
            routine = await _start(http)
            card = await _paused(db, http, routine)
            options = [o["label"] for o in card["questions"][0]["options"]]
            assert options == [budgets.raise_label(CAP), budgets.STOP]
            assert re.search(r"has spent \$0\.\d\d of its \$0\.50 cap: its next extractor could not start",
                             card["questions"][0]["question"])
            await _answer(http, card, budgets.raise_label(CAP))
            run = await until(lambda: _run(http, routine), "the run's end", 180)
            events = await h.events()
    [asked] = [e.payload for e in events if e.event_type == "budget.asked"]
    [resolved] = [e.payload for e in events if e.event_type == "budget.resolved"]
    assert (asked["status"], asked["cap_usd"], asked["raise_usd"]) == ("skipped", CAP, CAP)
    assert asked["wait_s"] == 900.0  # unattended: it has a deadline
    assert (resolved["decision"], resolved["usd_raised"], resolved["cap_usd"]) == ("raised", CAP, 2 * CAP)
    grants = _grants(events)
    costs = [float(e.payload["total_cost_usd"]) for e in events if e.event_type == "stream.result"]
    # the extractor that could not start runs again, granted what the raised cap leaves; the run succeeds
    # within the new cap
    [extractor_grant] = grants["extractor"]
    spent_before = sum(costs[:2])
    assert extractor_grant == pytest.approx(min(CAP, 2 * CAP - spent_before), abs=1e-4)
    assert (run["status"], run["reason"]) == ("succeeded", None)
    assert run["cost_usd"] == pytest.approx(sum(costs)) and sum(costs) <= 2 * CAP
    assert len(tables.payloads(db.admin_dsn, "handoff")) == 1


async def test_stop_here_ends_the_run_with_the_reason(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(_scenario()) as model:
        async with running_executor(db, model, tmp_path, extract=True), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
            routine = await _start(http)
            await _answer(http, await _paused(db, http, routine), budgets.STOP)
            run = await until(lambda: _run(http, routine), "the run's end", 60)
    assert run["status"] == "failed"
    assert re.fullmatch(r"budget: the run spent 0\.\d\d of its 0\.50 USD \(the user answered 'Stop here'\)",
                        run["reason"])
    assert "extractor" not in [p["role"] for p in tables.payloads(db.admin_dsn, "task.spawned")]


async def test_an_unattended_run_nobody_answers_ends_at_its_deadline_as_it_would_have(db: DB, tmp_path: Path) -> None:
    with ScriptedModelServer(_scenario()) as model:
        async with running_executor(db, model, tmp_path, extract=True, budget_ask_s=1.0), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
            routine = await _start(http)
            run = await until(lambda: _run(http, routine), "the run's end", 180)
            card = (await http.get("/api/asks", params={"limit": 50})).json()["asks"]
    [ask] = [a for a in card if a["questions"][0]["header"] == budgets.HEADER]
    assert ask["status"] == "cancelled" and ask["response"] == budgets.NO_ANSWER
    assert run["status"] == "failed"
    assert re.fullmatch(r"budget: the run spent 0\.\d\d of its 0\.50 USD \(no answer by the deadline\)", run["reason"])
    [resolved] = tables.payloads(db.admin_dsn, "budget.resolved")
    assert resolved["decision"] == "expired"
