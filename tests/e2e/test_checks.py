"""Checks that feed back: a project's check command runs in the worker's sandbox on its worktree after it ends,
before its end is settled; a failure sends the work to one fix round (a follow-up on the checked commit, the
failure in its brief) and no handoff is made of the failed run; the fixed run's check passes and its handoff
carries the check as code saw it. Real git, PostgreSQL and the CLI in its sandbox."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx

from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests import tables
from tests.e2e.test_projects import _bash, _git, _repo, _request
from tests.e2e.test_reviews import _recorded
from tests.harness import Harness, running_executor
from tests.pg import DB
from tests.scenarios import extractor, handoff
from tests.served import ingress_server
from tests.wait import until

# the check: passes only on `value = 2`; it also tries to write into the project's own checkout, which it cannot
# reach from its sandbox (what it writes there stays in the sandbox's private view)
CHECK = ("touch \"$PROJECT_CHECKOUT/planted\" 2>/dev/null; "
         "grep -q 'value = 2' app.py && echo 'all good' || { echo 'expected value = 2'; exit 3; }")


async def _dispatched(http: httpx.AsyncClient, h: Harness, repo: Path, check: str, retries: int, brief: str,
                      turn: uuid.UUID) -> uuid.UUID:
    """A project on `repo` with its check, made through the API, and a worker of it dispatched under `turn`."""
    made = await _request(http, "/api/projects", {"slug": "demo", "workdir": str(repo), "check_command": check,
                                                  "check_retries": retries})
    return await h.dispatch(brief, project_id=uuid.UUID(made["result"]["project_id"]), parent_task_id=turn)


async def test_a_failed_check_gets_one_fix_round_on_the_checked_work_and_the_handoff_carries_the_passing_check(
    db: DB, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    repo = _repo(roots / "repo", {"app.py": "value = 0\n"})
    scenario = Scenario(rules=[
        # the fix round finds the checked work in its tree (value = 1) and fixes it
        Rule(role="worker", match="Fix the work on branch", replies=[
            _bash("grep -q 'value = 1' app.py && printf 'value = 2\\n' > app.py"), {"text": "fixed"}]),
        Rule(role="worker", match="set the value", replies=[_bash("printf 'value = 1\\n' > app.py"),
                                                            {"text": "set"}]),
        extractor(handoff("set the value", "value is 2")),
    ])
    thread = tables.insert_thread(db.admin_dsn)
    turn = tables.insert_task(db.admin_dsn, role="orchestrator", brief="hi", status="success", session_id=thread)
    check = CHECK.replace("$PROJECT_CHECKOUT", str(repo))
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,), extract=True) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            first = await _dispatched(http, h, repo, check, 1, "set the value", turn)
            await _recorded(h, first)
            fixed = await until(lambda: next(iter(tables.tasks(db.admin_dsn, "id", continues_task_id=first)), None),
                                "the fix round", 90)
            await _recorded(h, fixed[0])
            handoffs = await until(lambda: tables.payloads(db.admin_dsn, "handoff"), "the handoff", 90)
            red = (await http.get(f"/api/tasks/{first}/diff")).json()
            green = (await http.get(f"/api/tasks/{fixed[0]}/diff")).json()
    checks = tables.payloads(db.admin_dsn, "task.check")
    assert [c["passed"] for c in checks] == [False, True]
    assert checks[0]["exit_code"] == 3 and checks[0]["tail"][-1] == "expected value = 2"
    assert not (repo / "planted").exists()
    # the fix round: one, continuing the checked work under the same turn, the failure in its brief
    brief, round_, parent = tables.task(db.admin_dsn, fixed[0], "brief", "check_round", "parent_task_id")
    assert round_ == 1 and parent == turn and "expected value = 2" in brief and check in brief
    assert tables.count(db.admin_dsn, "tasks", role="worker") == 2  # no second round after a pass
    # one handoff, the fixed run's, with the check code ran; none of the failed run
    assert [(hd["check"]["passed"], hd["check"]["fix_rounds"]) for hd in handoffs] == [(True, 1)]
    assert red["check"]["passed"] is False and green["check"]["passed"] is True
    assert "+value = 2" in green["diff"] and "-value = 1" in green["diff"]
    assert _git(repo, "status", "--porcelain") == ""


async def test_what_the_check_writes_in_the_worktree_is_not_committed_as_the_worker_s_work(
    db: DB, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    repo = _repo(roots / "repo", {"app.py": "value = 0\n", "NOTES.md": "notes\n", "draft.md": "draft\n"})
    # the worker: changes app.py and draft.md, adds new.txt; the check: bytecode, a build file, a line appended to a
    # tracked file the worker left alone, and another to one the worker changed (that one is the worker's to keep)
    scenario = Scenario(rules=[
        Rule(role="worker", replies=[_bash("printf 'value = 1\\n' > app.py; echo more >> draft.md; "
                                           "echo new > new.txt"), {"text": "done"}])])
    check = ("mkdir -p __pycache__ build/out && echo pyc > __pycache__/app.pyc && echo o > build/out/a.txt && "
             "echo checked >> NOTES.md && echo checked >> draft.md && echo ok")
    thread = tables.insert_thread(db.admin_dsn)
    turn = tables.insert_task(db.admin_dsn, role="orchestrator", brief="hi", status="success", session_id=thread)
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            task = await _dispatched(http, h, repo, check, 0, "change things", turn)
            await _recorded(h, task)
            diff = (await http.get(f"/api/tasks/{task}/diff")).json()
    [checked] = tables.payloads(db.admin_dsn, "task.check")
    assert checked["passed"] is True
    assert sorted(checked["undone"]) == ["NOTES.md", "__pycache__/app.pyc", "build/out/a.txt"]
    branch = diff["branch"]
    committed = sorted(_git(repo, "diff", "--name-only", f"main...{branch}").split())
    assert committed == ["app.py", "draft.md", "new.txt"]  # the worker's own, and nothing the check wrote
    assert "__pycache__" not in diff["diff"] and "build/out" not in diff["diff"]
