"""A review of a worker's diff sent back: line comments batched into one review become a follow-up worker that
starts at the reviewed commit, with the comments in its brief; its diff shows what changed since the review;
the thread keeps the review; merging the follow-up brings both. Real git, PostgreSQL, the CLI in its sandbox."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.e2e.test_projects import _bash, _git, _repo, _request
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until

HUNK = "@@ -1 +1,2 @@\n-x = 1\n+x = 2\n+y = 3"


async def _recorded(h: Harness, task_id: uuid.UUID) -> dict[str, Any]:
    return await h.wait_task(task_id, lambda r: r["changes_recorded_at"] is not None
                             and r["status"] not in ("pending", "running"), 120)


async def test_a_review_sent_back_continues_on_the_reviewed_commit_and_only_its_own_changes_are_its_diff(
    db: DB, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    repo = _repo(roots / "repo", {"app.py": "x = 1\n"})
    scenario = Scenario(rules=[
        # the follow-up: what it finds in its tree is the reviewed work (y = 3), which it changes as asked
        Rule(role="worker", match="Revise the work on branch", replies=[
            _bash("grep -q 'y = 3' app.py && sed -i 's/y = 3/y = 4/' app.py"), {"text": "y is 4 now"}]),
        Rule(role="worker", match="set x", replies=[_bash("printf 'x = 2\\ny = 3\\n' > app.py"),
                                                    {"text": "x is 2"}]),
    ])
    thread = tables.insert_thread(db.admin_dsn)
    turn = tables.insert_task(db.admin_dsn, role="orchestrator", brief="hi", status="success", session_id=thread)
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            made = await _request(http, "/api/projects", {"slug": "demo", "workdir": str(repo)})
            reviewed = await h.dispatch("set x", project_id=uuid.UUID(made["result"]["project_id"]),
                                        parent_task_id=turn)
            await _recorded(h, reviewed)
            before = (await http.get(f"/api/tasks/{reviewed}/diff")).json()
            empty = await http.post(f"/api/tasks/{reviewed}/review", json={"comments": []})
            unknown = await http.post(f"/api/tasks/{uuid.uuid4()}/review", json={"note": "?"})
            comment = {"file": "app.py", "line": 2, "text": "y should be 4", "hunk": HUNK}
            sent = await http.post(f"/api/tasks/{reviewed}/review", json={"comments": [comment], "note": "Close."})
            followup = await until(lambda: next(iter(tables.tasks(db.admin_dsn, "id",
                                                                  continues_task_id=reviewed)), None),
                                   "the follow-up worker", 60)
            done = await _recorded(h, followup[0])
            after = (await http.get(f"/api/tasks/{followup[0]}/diff")).json()
            history = (await http.get(f"/api/threads/{thread}/conversation")).json()["events"]
            merged = await _request(http, f"/api/tasks/{followup[0]}/merge", {})
    assert (empty.status_code, unknown.status_code) == (422, 404), (empty.text, unknown.text)
    assert sent.status_code == 202, sent.text
    brief = tables.task(db.admin_dsn, followup[0], "brief")[0]
    assert "app.py:2 — y should be 4" in brief and "+y = 3" in brief and "Close." in brief and "set x" in brief
    # it started at the reviewed commit, on a branch of its own, under the same turn
    assert done["status"] == "success" and done["base_commit"] == before["head_commit"]
    assert done["branch"] != before["branch"] and done["parent_task_id"] == turn
    assert "-y = 3" in after["diff"] and "+y = 4" in after["diff"] and "+x = 2" not in after["diff"]
    reviews = [e for e in history if e["event_type"] == "task.review"]
    assert len(reviews) == 1 and reviews[0]["payload"]["comments"] == [comment]
    assert reviews[0]["payload"]["followup_task_id"] == str(followup[0])
    assert merged["status"] == "done" and _git(repo, "show", "main:app.py") == "x = 2\ny = 4\n"
