"""A routine's run end to end (real PostgreSQL, the real claude CLI, the scripted model): a signed webhook
starts an autonomous run whose prompt carries the payload; its worker's gated command is denied; the run ends
`gated` with its history, and the notification names the denied call."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from executor.notify.notifier import NotifyConfig
from petal_dispatch.demo.scripted_model import ScriptedModelServer
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.scenarios import handoff, one_worker
from tests.served import ingress_server
from tests.wait import until

pytestmark = pytest.mark.e2e


async def _run(http: httpx.AsyncClient, routine: str) -> dict[str, Any] | None:
    runs = (await http.get(f"/api/routines/{routine}/runs")).json()["runs"]
    return runs[0] if runs and runs[0]["status"] not in ("queued", "running") else None


async def _routine_notes(h: Harness) -> list[tuple[str, str, str]] | None:
    cur = await (await h._conn()).execute("SELECT kind, title, body FROM notifications WHERE kind LIKE 'routine_%%'"
                                          " ORDER BY created_at")
    return [(r[0], r[1], r[2]) for r in await cur.fetchall()] or None


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
    [(kind, title, said)] = notes
    assert (kind, title) == ("routine_gated", "Routine pr review: gated")
    assert said.startswith("The gate denied: Bash: sudo true") and said.endswith(" USD)"), said
    # every CLI process of the run (turns, the worker, its extractor) under the routine's USD per run
    assert len(argvs) >= 3 and all(a[a.index("--max-budget-usd") + 1] == "0.5000" for a in argvs), argvs
    assert thread_turns  # the run's thread holds its turns (and the history links to them)
