"""Projects on real repositories: workdir checks, one git worktree and branch per worker, recorded changes,
merge / discard, the plan loop and usage (real git, real PostgreSQL, the real CLI and the scripted model)."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from executor.projects import git, worktrees
from executor.settle.settler import Settler, SettlerConfig
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from tests.harness import Harness, config_for, running_executor, running_supervisor, substrate_for
from tests import tables
from tests.pg import DB
from tests.scenarios import dispatch, extractor, handoff
from tests.served import ingress_server
from tests.wait import until

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)
IDENTITY = ["-c", "user.name=Test", "-c", "user.email=test@example.invalid"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *IDENTITY, *args], check=True, capture_output=True,
                          text=True).stdout


def _repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    _git(path, "init", "--quiet", "-b", "main")
    for name, text in files.items():
        (path / name).write_text(text)
    _git(path, "add", "--all")
    _git(path, "commit", "--quiet", "-m", "start")
    return path


def _commit(repo: Path, name: str, text: str, message: str) -> None:
    (repo / name).write_text(text)
    _git(repo, "add", name)
    _git(repo, "commit", "--quiet", "-m", message)


async def _outcome(http: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        row = (await http.get(f"/api/project-requests/{request_id}")).json()
        return row if row["status"] in ("done", "failed") else None

    return await until(done, f"project request {request_id}", 60)


async def _request(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    queued = await http.post(path, json=body)
    assert queued.status_code == 202, queued.text
    return await _outcome(http, queued.json()["id"])


def _bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command, "description": "write a file"}}}


# ---- git alone ------------------------------------------------------------------------------------------

async def test_a_branch_merges_fast_forward_else_with_a_merge_commit_and_a_conflict_leaves_the_checkout_clean(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path / "repo", {"shared.txt": "base\n"})
    made = [await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo") for _ in range(3)]
    for wt, (name, text) in zip(made, [("a.txt", "a\n"), ("b.txt", "b\n"), ("shared.txt", "theirs\n")], strict=True):
        (wt.path / name).write_text(text)
    recorded = [await worktrees.changes(repo, wt.path, uuid.uuid4(), wt.branch, wt.base_commit) for wt in made]
    assert [[f["path"] for f in r["files"]] for r in recorded] == [["a.txt"], ["b.txt"], ["shared.txt"]]
    assert all(r["auto_commit"] for r in recorded) and made[0].base_branch == "main"

    first, second = [await worktrees.merge(repo, wt.branch, r["head_commit"], wt.base_commit, f"merge {wt.branch}")
                     for wt, r in zip(made[:2], recorded[:2], strict=True)]
    assert first["fast_forward"] and not second["fast_forward"]
    assert _git(repo, "log", "-1", "--format=%P").count(" ") == 1  # b came in with a merge commit
    _commit(repo, "shared.txt", "ours\n", "change shared on main")
    before = _git(repo, "rev-parse", "HEAD")
    try:
        await worktrees.merge(repo, made[2].branch, recorded[2]["head_commit"], made[2].base_commit, "merge shared")
        raise AssertionError("the conflicting merge went through")
    except worktrees.GitError as exc:
        assert "conflicted in shared.txt" in str(exc)
    assert _git(repo, "status", "--porcelain") == "" and _git(repo, "rev-parse", "HEAD") == before
    assert not (repo / ".git" / "MERGE_HEAD").exists() and (repo / "shared.txt").read_text() == "ours\n"


def test_git_and_the_repositorys_hooks_never_see_the_harness_settings_or_database_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PETAL_AUTH_TOKEN", "secret")
    monkeypatch.setenv("PGPASSWORD", "secret")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:secret@h/db")
    env = git.base_env()
    assert not {"PETAL_AUTH_TOKEN", "PGPASSWORD", "DATABASE_URL"} & set(env) and env["GIT_TERMINAL_PROMPT"] == "0"


def test_a_large_diff_is_cut_with_a_visible_marker() -> None:
    diff, cut = worktrees._bounded("x" * 1000, 100)
    assert cut and diff.startswith("x" * 100) and "diff cut here: 900 of 1000 characters left out" in diff
    assert worktrees._bounded("small", 100) == ("small", False)


async def test_a_worker_that_ended_without_its_changes_recorded_has_them_recorded_once_by_its_settlement(
    db: DB, pool: AsyncConnectionPool, tmp_path: Path
) -> None:
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    task_id = uuid.uuid4()
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        project = tables.insert(conn, "projects", name="swept", workdir=str(repo))
        # crashed by an executor restart a while ago, before anyone recorded what it changed
        tables.insert_task(conn, id=task_id, project_id=project, brief="b", status="crashed",
                           ended_at=tables.from_now(minutes=-5))
    wt = await worktrees.create(repo, task_id, tmp_path / "wt", "swept")
    (wt.path / "b.txt").write_text("b\n")
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        tables.update(conn, "tasks", task_id, worktree=str(wt.path), branch=wt.branch, base_commit=wt.base_commit)
    settler = Settler(pool, SettlerConfig())
    settled = [await settler.settle_pending() for _ in range(2)]  # the second pass finds nothing to do
    with psycopg.connect(db.admin_dsn) as conn:
        changes = tables.payloads(conn, "task.changes")
        removed = tables.count_events(conn, "task.worktree_removed")
        recorded = tables.task(conn, task_id, "changes_recorded_at", "settled_at")
    assert settled == [1, 0]
    assert [[f["path"] for f in c["files"]] for c in changes] == [["b.txt"]] and removed == 1
    assert recorded[0] is not None and recorded[1] is not None
    assert not wt.path.exists() and _git(repo, "branch", "--list", wt.branch).strip()


async def test_an_end_settled_without_its_changes_has_them_recorded_by_the_settlers_poll_pass(
    db: DB, pool: AsyncConnectionPool, tmp_path: Path
) -> None:
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    task_id = uuid.uuid4()
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        project = tables.insert(conn, "projects", name="left", workdir=str(repo))
        # settled before the settler recorded changes (an older executor, or a settlement some other way)
        tables.insert_task(conn, id=task_id, project_id=project, brief="b", status="crashed", ended_at=tables.NOW,
                           settled_at=tables.NOW)
    wt = await worktrees.create(repo, task_id, tmp_path / "wt", "left")
    (wt.path / "c.txt").write_text("c\n")
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        tables.update(conn, "tasks", task_id, worktree=str(wt.path), branch=wt.branch, base_commit=wt.base_commit)
    settler = Settler(pool, SettlerConfig(keep_worktrees=True))
    unsettled = await settler.settle_pending()  # settled already: not the ends' pass's
    found = [await settler.record_leftover_changes() for _ in range(2)]
    with psycopg.connect(db.admin_dsn) as conn:
        changes = tables.payloads(conn, "task.changes")
    assert unsettled == 0 and found == [True, False]
    assert [[f["path"] for f in c["files"]] for c in changes] == [["c.txt"]]
    assert wt.path.exists()  # kept, as configured


async def test_a_project_worker_whose_cli_cannot_start_has_its_changes_recorded_by_its_settlement(
    db: DB, tmp_path: Path
) -> None:
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    project = tables.insert(db.admin_dsn, "projects", name="nocli", workdir=str(repo))
    with ScriptedModelServer(Scenario()) as model:
        sub = replace(substrate_for(model, tmp_path), claude_bin=str(tmp_path / "no-such-claude"))
        async with running_supervisor(db.executor_dsn, db.admin_dsn, sub, config_for(tmp_path)) as h:
            task_id = await h.dispatch("never runs", project_id=project)
            ended = await h.wait_task(task_id, lambda r: r["status"] != "pending" and r["status"] != "running")
            settled = await Settler(h.db.pool, SettlerConfig()).settle_pending()
            task = await h.task(task_id)
            events = [e.event_type for e in await h.events(task_id)]
    assert task["status"] == "failed" and "could not start" in task["status_reason"]
    assert ended["changes_recorded_at"] is None and settled == 1  # the settlement records them, once
    assert task["changes_recorded_at"] is not None and events.count("task.changes") == 1
    assert events.index("task.exited") < events.index("task.changes") < events.index("task.worktree_removed")
    assert task["worktree"] and not Path(task["worktree"]).exists()  # removed; the branch stays for review
    assert _git(repo, "branch", "--list", task["branch"]).strip()


# ---- projects from the API --------------------------------------------------------------------------------

async def test_a_workdir_outside_the_roots_missing_or_with_dotdot_is_refused_and_nothing_is_created(
    db: DB, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    inside = _repo(roots / "repo", {"a.txt": "a\n"})
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (roots / "link").symlink_to(outside)
    (inside / "sub").mkdir()
    (roots / "fresh").mkdir()
    with ScriptedModelServer(Scenario()) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)), \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            refused = {
                "outside": await _request(http, "/api/projects", {"slug": "out", "workdir": str(outside),
                                                                 "init": True}),
                "missing": await _request(http, "/api/projects", {"slug": "missing", "init": True,
                                                                 "workdir": str(roots / "nope")}),
                "dotdot": await _request(http, "/api/projects", {"slug": "dots", "init": True,
                                                                "workdir": f"{roots}/repo/../../elsewhere"}),
                "symlink": await _request(http, "/api/projects", {"slug": "link", "workdir": str(roots / "link"),
                                                                 "init": True}),
                "not_a_repo": await _request(http, "/api/projects", {"slug": "plain", "workdir": str(roots)}),
                "inside_a_repo": await _request(http, "/api/projects", {"slug": "sub", "workdir": str(inside / "sub"),
                                                                       "init": True}),
                "bad_plan": await _request(http, "/api/projects", {"slug": "noplan", "workdir": str(inside),
                                                                  "plan": "just prose, no tasks"}),
            }
            bad_slug = await http.post("/api/projects", json={"slug": "Bad Slug", "workdir": str(inside)})
            listed = (await http.get("/api/projects")).json()
            made = await _request(http, "/api/projects", {"slug": "ok", "workdir": str(inside),
                                                          "plan": "- [ ] T-001 first\n- [x] T-002 second"})
            fresh = await _request(http, "/api/projects", {"slug": "fresh", "workdir": str(roots / "fresh"),
                                                           "init": True})
            taken = await http.post("/api/projects", json={"slug": "ok", "workdir": str(roots / "fresh")})
    assert {k: v["status"] for k, v in refused.items()} == dict.fromkeys(refused, "failed")
    assert "outside the allowed project roots" in refused["outside"]["error"]
    assert "does not exist" in refused["missing"]["error"]
    assert "'..'" in refused["dotdot"]["error"]
    assert "outside the allowed project roots" in refused["symlink"]["error"]  # resolved before the check
    assert "not a git repository" in refused["not_a_repo"]["error"]
    assert "no task lines" in refused["bad_plan"]["error"]
    assert "inside the git repository" in refused["inside_a_repo"]["error"]
    assert fresh["status"] == "done" and fresh["result"]["initialised"] is True
    assert _git(roots / "fresh", "log", "--format=%s") == "petal-dispatch: start\n"
    assert taken.status_code == 409
    assert bad_slug.status_code == 422
    assert listed["projects"] == [] and len(listed["requests"]) == len(refused)
    assert not (outside / ".git").exists() and not (roots / "nope").exists() and not (roots / ".git").exists()
    assert made["status"] == "done" and made["result"]["branch"] == "main" and made["result"]["plan_tasks"] == 2
    with psycopg.connect(db.admin_dsn) as conn:
        names = [n for (n,) in tables.rows(conn, "projects", "name", order=("created_at",))]
        journal = [t for (t,) in tables.records(conn, "event_type", event_type=tables.Like("project.%"))]
    assert names == ["ok", "fresh"]
    assert journal == ["project.refused"] * len(refused) + ["project.created"] * 2


async def test_parallel_workers_get_their_own_worktrees_and_branches_and_each_is_merged_discarded_or_conflicts(
    db: DB, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    repo = _repo(roots / "repo", {"shared.txt": "base\n"})
    scenario = Scenario(rules=[
        Rule(role="worker", match="write alpha", replies=[_bash("sleep 2; printf 'alpha\\n' > alpha.txt"),
                                                          {"text": "wrote alpha.txt"}]),
        Rule(role="worker", match="write beta", replies=[_bash("sleep 2; printf 'beta\\n' > beta.txt"),
                                                         {"text": "wrote beta.txt"}]),
        Rule(role="worker", match="change shared", replies=[_bash("sleep 2; printf 'theirs\\n' > shared.txt"),
                                                            {"text": "changed shared.txt"}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            made = await _request(http, "/api/projects", {"slug": "demo", "workdir": str(repo)})
            project_id = uuid.UUID(made["result"]["project_id"])
            ids = [await h.dispatch(brief, project_id=project_id)
                   for brief in ("write alpha", "write beta", "change shared")]
            # changes are recorded just before the final status is written: wait for both
            tasks = [await h.wait_task(t, lambda r: r["changes_recorded_at"] is not None
                                       and r["status"] not in ("pending", "running"), 120) for t in ids]
            main_status = _git(repo, "status", "--porcelain", "--untracked-files=all")
            main_files = sorted(p.name for p in repo.iterdir())
            diffs = [(await http.get(f"/api/tasks/{t}/diff")).json() for t in ids]
            alpha, beta, shared = ids

            merged = await _request(http, f"/api/tasks/{alpha}/merge", {})
            discarded = await _request(http, f"/api/tasks/{beta}/discard", {})
            _commit(repo, "shared.txt", "ours\n", "the user changes shared.txt meanwhile")
            head_before = _git(repo, "rev-parse", "HEAD")
            conflict = await _request(http, f"/api/tasks/{shared}/merge", {})
            repo_after_conflict = (_git(repo, "status", "--porcelain"), _git(repo, "rev-parse", "HEAD"))
            (repo / "scratch.txt").write_text("the user's unfinished work")
            dirty = await _request(http, f"/api/tasks/{shared}/merge", {})
            again = await http.post(f"/api/tasks/{alpha}/merge", json={})
            events = await h.events()
    assert [t["status"] for t in tasks] == ["success"] * 3
    # at the same time, in three trees on three branches, none of them the project's checkout
    assert max(t["started_at"] for t in tasks) < min(t["ended_at"] for t in tasks)
    assert len({t["branch"] for t in tasks}) == 3 and all(t["branch"].startswith("petal/") for t in tasks)
    assert len({t["worktree"] for t in tasks}) == 3
    assert all(not Path(t["worktree"]).exists() and repo not in Path(t["worktree"]).parents for t in tasks)
    assert main_status == "" and main_files == [".git", "shared.txt"]  # no worker wrote the checkout
    assert [[f["path"] for f in d["files"]] for d in diffs] == [["alpha.txt"], ["beta.txt"], ["shared.txt"]]
    assert "+alpha" in diffs[0]["diff"] and "beta" not in diffs[0]["diff"] and diffs[0]["diff_truncated"] is False
    assert diffs[2]["base_branch"] == "main" and diffs[2]["commits"]

    assert merged["status"] == "done" and merged["result"]["fast_forward"] is True
    assert _git(repo, "show", "main:alpha.txt") == "alpha\n"
    assert discarded["status"] == "done"
    assert _git(repo, "branch", "--list", tasks[0]["branch"], tasks[1]["branch"]) == ""
    assert conflict["status"] == "failed" and "conflicted in shared.txt" in conflict["error"]
    assert repo_after_conflict == ("", head_before) and (repo / "shared.txt").read_text() == "ours\n"
    assert _git(repo, "branch", "--list", tasks[2]["branch"]).strip()  # still waiting for the user
    assert dirty["status"] == "failed" and "uncommitted changes" in dirty["error"]
    assert again.status_code == 409
    kinds = [e.event_type for e in events]
    assert kinds.count("task.worktree_created") == 3 and kinds.count("task.changes") == 3
    assert kinds.count("task.merged") == 1 and kinds.count("task.discarded") == 1
    assert kinds.count("task.merge_failed") == 2
    assert all(e.tier == "derived" for e in events if e.event_type == "task.changes")


# ---- the plan loop and usage --------------------------------------------------------------------------

def _done(ref: str) -> Rule:
    return extractor(handoff(f"do {ref}", f"{ref} done", next_step="the next plan task"),
                     match=f"## Plan task {ref}")


async def test_a_project_threads_orchestrator_runs_the_plan_task_by_task_and_usage_sums_the_runs(
    db: DB, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    repo = _repo(roots / "repo", {"PLAN.md": "# Plan\n- [ ] T-001 write one\n- [ ] T-002 write two\n"})
    scenario = Scenario(rules=[
        Rule(role="orchestrator", match_last="T-001 done", replies=[dispatch("write two.txt", plan_ref="T-002")]),
        Rule(role="orchestrator", match_last="T-002 done", replies=[{"text": "The plan is done."}]),
        Rule(role="orchestrator", replies=[dispatch("write one.txt", plan_ref="T-001"), {"text": "dispatched"}]),
        Rule(role="worker", match="T-001", replies=[_bash("printf 'one\\n' > one.txt"), {"text": "wrote one"}]),
        Rule(role="worker", match="T-002", replies=[_bash("printf 'two\\n' > two.txt"), {"text": "wrote two"}]),
        _done("T-001"), _done("T-002"),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, extract=True, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            made = await _request(http, "/api/projects", {"slug": "plan", "workdir": str(repo),
                                                          "plan_path": "PLAN.md"})
            project_id = made["result"]["project_id"]
            thread = await http.post("/api/threads", json={"title": "plan", "mode": "autonomous",
                                                           "project_id": project_id})
            assert thread.status_code == 202, thread.text
            thread_id = thread.json()["thread_id"]
            await http.post("/api/chat", json={"text": "run the plan", "thread_id": thread_id})

            async def finished() -> list[Any] | None:
                found = [e for e in await h.events() if e.event_type == "stream.result"
                         and e.payload.get("result") == "The plan is done."]
                return found or None

            await until(finished, "the orchestrator's last turn", 300)
            await until(lambda: _settled(h), "every task to end", 60)
            project = (await http.get(f"/api/projects/{project_id}")).json()
            checkout = (_git(repo, "status", "--porcelain", "--untracked-files=all"),
                        sorted(p.name for p in repo.iterdir()))
            unknown = await http.post("/api/threads", json={"mode": "autonomous", "project_id": str(uuid.uuid4())})
            usage = {by: (await http.get("/api/usage", params={"by": by})).json()
                     for by in ("task", "thread", "project", "day")}
            scoped = (await http.get("/api/usage", params={"by": "task", "thread_id": thread_id})).json()
            rows = tables.tasks(db.admin_dsn, "role", "brief", "project_id", "session_id")
            events = await h.events()
    turns = [r for r in rows if r[0] == "orchestrator"]
    workers = [r for r in rows if r[0] == "worker"]
    assert "[project plan · project_id" in turns[0][1]
    assert "Not started: T-001 write one; T-002 write two" in turns[0][1]
    assert all(str(r[2]) == project_id for r in turns + workers)  # the dispatches named no project
    assert [w[1].split("\n")[0] for w in workers] == ["write one.txt", "write two.txt"]
    assert "## Plan task T-001: write one" in workers[0][1] and "## Plan task T-002: write two" in workers[1][1]
    plan = {p["ref"]: p for p in project["plan_tasks"]}
    assert [plan[r]["latest"]["status"] for r in ("T-001", "T-002")] == ["success", "success"]
    assert [plan[r]["handoffs"][0]["current_state"] for r in ("T-001", "T-002")] == ["T-001 done", "T-002 done"]
    # what each worker changed reaches its handoff's artifacts, from the recorded changes
    assert "file one.txt" in plan["T-001"]["handoffs"][0]["artifacts"]
    assert "file two.txt" in plan["T-002"]["handoffs"][0]["artifacts"]
    assert sorted(project["state"]["done"]) == ["T-001", "T-002"]
    assert sorted(b["plan_ref"] for b in project["branches_waiting"]) == ["T-001", "T-002"]
    assert unknown.status_code == 404
    assert checkout == ("", [".git", "PLAN.md"])  # the workers' files are on their branches only

    results = [e for e in events if e.event_type == "stream.result"]
    expected = {"runs": len(results),
                "input_tokens": sum(e.payload["usage"]["input_tokens"] for e in results),
                "output_tokens": sum(e.payload["usage"]["output_tokens"] for e in results),
                "cost_usd": sum(e.payload.get("total_cost_usd", 0) for e in results)}
    for by, answer in usage.items():
        got = {k: answer["total"][k] for k in expected}
        assert got["cost_usd"] == pytest.approx(expected["cost_usd"]), by
        assert {**got, "cost_usd": expected["cost_usd"]} == expected, by
    assert len(usage["thread"]["rows"]) == 1 and usage["thread"]["rows"][0]["key"] == thread_id
    assert len(usage["project"]["rows"]) == 1 and usage["project"]["rows"][0]["key"] == project_id
    per_task = {r["key"]: r for r in usage["task"]["rows"]}
    for e in results:
        assert per_task[str(e.task_id)]["output_tokens"] == e.payload["usage"]["output_tokens"]
    assert scoped["total"]["runs"] == len(results)
    assert project["usage"]["runs"] == len(results)


async def _settled(h: Harness) -> bool:
    conn = await h._conn()
    row = await (await conn.execute("SELECT count(*) FROM tasks WHERE status IN ('pending', 'running')")).fetchone()
    return row is not None and row[0] == 0


# ---- the page ---------------------------------------------------------------------------------------------

@pytest.mark.timeout(240)
async def test_the_task_view_shows_a_workers_files_and_diff_at_phone_width_and_merges_it(
    db: DB, tmp_path: Path
) -> None:
    from playwright.async_api import expect

    from tests.web.test_web_client import browser, no_script_ran, page_at, shot

    roots = tmp_path / "roots"
    repo = _repo(roots / "repo", {"README.md": "hello\n"})
    xss = '<img src=x onerror="window.__xss=1">'
    scenario = Scenario(rules=[Rule(role="worker", replies=[
        _bash(f"printf '%s\\n' '{xss}' > alpha.txt; printf 'x%.0s' $(seq 300) > long.txt"),
        {"text": "wrote alpha.txt"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http, browser() as b:
            made = await _request(http, "/api/projects", {"slug": "page", "workdir": str(repo)})
            task_id = await h.dispatch("write alpha", project_id=uuid.UUID(made["result"]["project_id"]))
            await h.wait_task(task_id, lambda r: r["changes_recorded_at"] is not None, 120)
            thread = (await http.post("/api/threads", json={"title": "on page", "project_id": made["result"]["project_id"]})).json()

            async def made_thread() -> bool:
                threads = (await http.get("/api/threads")).json()["threads"]
                return any(t["id"] == thread["thread_id"] and not t["pending"] for t in threads)

            await until(made_thread, "the thread", 30)
            async with page_at(b, url, {"width": 360, "height": 740}) as page:
                page.on("dialog", lambda d: asyncio.ensure_future(d.accept()))
                await page.evaluate("id => localStorage.setItem('petal.thread', id)", thread["thread_id"])
                await page.goto(f"{url}/#context")
                await page.reload()
                context = page.locator("#context-body")
                await expect(context).to_contain_text("Project page", timeout=20_000)
                await expect(page.locator("#thread-title")).to_have_text("on page · page")
                await expect(context.get_by_role("link", name=f"petal/{task_id.hex[:8]}")).to_be_visible()
                await shot(page, "project-360")
                await page.goto(f"{url}/#task/{task_id}")
                files = page.locator("#task-detail .files")
                await expect(files).to_contain_text("alpha.txt", timeout=20_000)
                await expect(page.locator("#task-detail .diff .add").first).to_be_visible()
                await expect(page.locator("#task-detail .diff")).to_contain_text(xss)
                wide = await page.evaluate("document.scrollingElement.scrollWidth")
                await shot(page, "task-diff-360")
                await page.get_by_role("button", name="Merge into main").click()
                await expect(page.locator("#review-result")).to_have_text("merge done", timeout=30_000)
                await expect(page.locator("#task-detail .changes h3 .chip")).to_have_text("merged")
                await expect(page.get_by_role("button", name="Discard")).to_have_count(0)
                await no_script_ran(page)
    assert wide <= 360  # the diff scrolls inside its box; the page does not
    assert _git(repo, "show", "main:alpha.txt").strip() == xss
