"""`petal-dispatch journal` and `status`: the journal legible in a terminal, the open work at a glance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from executor.projects import service as projects
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.harness import config_for, running_supervisor, substrate_for
from tests.pg import DB
from tests.scenarios import STALL_FOREVER


def _cli(db: DB, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PETAL_EXECUTOR_DSN": db.executor_dsn, "PETAL_INGRESS_DSN": db.ingress_dsn, **extra}
    return subprocess.run([sys.executable, "-m", "petal_dispatch.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60)


STALL_S = 5.0  # the watchdog's silence window: wide enough for two `status` commands under load


async def test_status_shows_a_running_and_a_stalled_task_and_the_journal_reads_as_sentences(
    db: DB, tmp_path: Path
) -> None:
    scenario = Scenario(rules=[
        Rule(
            role="worker", match="quick", replies=[
                {"tool_use": {"name": "Bash", "input": {"command": "echo hello-journal"}}},
                {"text": "Finished: printed hello-journal."}]),
        Rule(
            role="worker", replies=[STALL_FOREVER]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_supervisor(db.executor_dsn, db.admin_dsn, substrate_for(model, tmp_path),
                                      config_for(tmp_path, stall_timeout_s=STALL_S, stop_grace_s=2)) as h:
            quick = await h.dispatch("quick job")
            await h.wait_final(quick)
            slow = await h.dispatch("slow job")
            # silent from its first line on (a CLI slow to start under load would otherwise stall, then resume)
            await h.wait_event(slow, "stream.system.init")
            await h.wait_task(slow, lambda r: r["activity"] == "stalled", 60)
            running_too = await h.dispatch("another slow job")
            await h.wait_event(running_too, "stream.system.init")
            # read within STALL_S of its first line: it is running, not stalled yet
            status = _cli(db, "status", "--json")
            text_status = _cli(db, "status")
            journal = _cli(db, "journal", "--task", str(quick))
    assert status.returncode == 0, status.stderr
    state = json.loads(status.stdout)
    activity = {t["id"]: t["activity"] for t in state["tasks"]}
    assert activity[str(slow)] == "stalled" and activity[str(running_too)] == "running"
    assert str(quick) not in activity
    assert "STALLED" in text_status.stdout
    lines = journal.stdout.splitlines()
    assert any("spawned worker" in ln for ln in lines)
    assert any("→ Bash(" in ln and "hello-journal" in ln for ln in lines)
    assert any("tool result: ← hello-journal" in ln for ln in lines)
    assert any("exited SUCCESS" in ln for ln in lines)
    assert all(len(ln) < 240 for ln in lines)


def test_project_create_registers_a_project_once_with_its_plan_path(db: DB, tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    workdir = roots / "shop"
    workdir.mkdir(parents=True)
    plan = workdir / "plan.md"
    plan.write_text("- [ ] T-001 first\n- [x] T-002 second\n", encoding="utf-8")
    first = _cli(db, "project", "create", "--slug", "cli-made", "--plan", str(plan), "--workdir", str(workdir),
                 PETAL_PROJECT_ROOTS=str(roots))
    again = _cli(db, "project", "create", "--slug", "cli-made")
    assert first.returncode == 0, first.stderr
    made = json.loads(first.stdout)
    assert made["slug"] == "cli-made" and made["plan_tasks"] == 2 and made["plan_path"] == "plan.md"
    assert again.returncode == 2 and "a project 'cli-made' exists already" in again.stderr
    stored = tables.rows(db.admin_dsn, "projects", "workdir", "plan_path", name="cli-made")
    assert stored == [(str(workdir.resolve()), "plan.md")]
    status = _cli(db, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert set(json.loads(status.stdout)) == {"tasks", "queue", "asks", "last_events", "executors"}


def test_project_create_refuses_a_workdir_outside_the_roots_with_the_apis_own_message(
    db: DB, tmp_path: Path
) -> None:
    roots, outside = tmp_path / "roots", tmp_path / "elsewhere"
    roots.mkdir()
    outside.mkdir()
    (roots / "link").symlink_to(outside)
    cases = {"outside": str(outside), "symlink": str(roots / "link"), "dotdot": f"{roots}/../elsewhere",
             "missing": str(roots / "nope")}
    refused = {name: _cli(db, "project", "create", "--slug", f"cli-{name}", "--workdir", workdir,
                          PETAL_PROJECT_ROOTS=str(roots)) for name, workdir in cases.items()}
    for name, workdir in cases.items():
        with pytest.raises(projects.Refused) as api:  # the very check the executor runs for POST /api/projects
            projects.check_workdir(workdir, [roots.resolve()])
        assert refused[name].returncode == 2, refused[name].stdout
        assert refused[name].stderr.strip() == f"petal-dispatch: {api.value}"
    assert "outside the allowed project roots" in refused["outside"].stderr
    assert "set PETAL_PROJECT_ROOTS" in refused["symlink"].stderr
    assert tables.count(db.admin_dsn, "projects") == 0
