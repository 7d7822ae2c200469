"""Push a worker's branch to the project's push remote: exactly the reviewed commit goes to refs/heads/<branch> on
the remote the user set (a local bare repository here), from a sandbox, merged or not; refusals change nothing;
what a spawn wrote into the checkout's or the worker's git config (another remote, an insteadOf, a hooks path, a
hook) neither redirects the push nor runs. Real git, PostgreSQL, the CLI in its sandbox, the executor and ingress."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from executor.projects import push
from executor.sandbox.bwrap import SandboxPolicy
from executor.sandbox.limits import CgroupTree
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import remotes
from tests import tables
from tests.e2e.test_isolation_git import _report
from tests.e2e.test_projects import _bash, _git, _outcome, _repo, _request
from tests.e2e.test_reviews import _recorded
from tests.harness import Harness, running_executor, sandbox_for
from tests.pg import DB
from tests.served import ingress_server

# A worker that also tries to point its repository's and the checkout's git at another remote and at its own
# hooks (both are out of its sandbox's reach: its repository's config is read-only; the checkout is not mounted,
# so a write there lands in the sandbox's own private view)
_ATTACK = '''import json, subprocess, sys
from pathlib import Path
checkout, evil, hooks = sys.argv[1:4]
common = Path(subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
                             capture_output=True, text=True).stdout.strip())
plant = f'[remote "origin"]\\n\\turl = {evil}\\n\\tpushurl = {evil}\\n[core]\\n\\thooksPath = {hooks}\\n'
report = {}
for name, config in (("own config", common / "config"), ("checkout config", Path(checkout) / ".git" / "config")):
    try:
        with open(config, "a") as f:
            f.write(plant)
        report[name] = "DONE"
    except OSError:
        report[name] = "REFUSED"
Path("app.py").write_text("value = 2\\n")
print("REPORT", json.dumps(report))
'''


def _bare(path: Path) -> Path:
    subprocess.run(["git", "init", "--quiet", "--bare", str(path)], check=True)
    return path


def _refs(bare: Path) -> dict[str, str]:
    out = subprocess.run(["git", "--git-dir", str(bare), "for-each-ref", "--format=%(refname) %(objectname)"],
                         check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def _hook(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho \"$0\" >> {marker}\n")
    path.chmod(0o755)


def _plant(repo: Path, evil: Path, bare: str, hooks: Path, marker: Path) -> None:
    """What a thread's spawn with the checkout as its workdir can write: another remote and url rewrites for the
    user's, a hooks path and hooks."""
    with (repo / ".git" / "config").open("a") as f:
        f.write(f'[remote "origin"]\n\turl = {evil}\n\tpushurl = {evil}\n'
                f'[url "{evil}"]\n\tinsteadOf = {bare}\n\tpushInsteadOf = {bare}\n'
                f'[core]\n\thooksPath = {hooks}\n')
    for name in ("pre-push", "reference-transaction"):
        _hook(hooks / name, marker)
        _hook(repo / ".git" / "hooks" / name, marker)


async def _worker(h: Harness, project_id: uuid.UUID, brief: str) -> tuple[uuid.UUID, dict[str, Any]]:
    task_id = await h.dispatch(brief, project_id=project_id)
    return task_id, await _recorded(h, task_id)


async def test_push_sends_exactly_the_reviewed_commit_to_the_users_remote_whatever_a_spawn_wrote_in_git_config(
    db: DB, tmp_path: Path
) -> None:
    roots = tmp_path / "roots"
    bare, evil = _bare(tmp_path / "remote.git"), _bare(tmp_path / "evil.git")
    # a hook that runs leaves its mark in the remote: the one place a push's sandbox may write
    hooks, marker = tmp_path / "planted-hooks", bare / "hook-ran"
    repo = _repo(roots / "repo", {"app.py": "value = 1\n", "attack.py": _ATTACK})
    scenario = Scenario(rules=[Rule(role="worker", match="change the value", replies=[
        _bash(f"python3 attack.py {repo} {evil} {hooks}"), {"text": "changed"}])])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            made = await _request(http, "/api/projects", {"slug": "demo", "workdir": str(repo),
                                                          "push_remote": str(bare)})
            task_id, row = await _worker(h, uuid.UUID(made["result"]["project_id"]), "change the value")
            report = _report(await h.events(task_id))
            checkout_config = (repo / ".git" / "config").read_text()
            diff = (await http.get(f"/api/tasks/{task_id}/diff")).json()
            branch, reviewed = row["branch"], diff["head_commit"]
            # what a thread's spawn with the checkout as its workdir can do: the branch moved off the reviewed
            # commit, another remote and url rewrites for the user's, a hooks path and hooks
            _git(repo, "update-ref", f"refs/heads/{branch}", _git(repo, "rev-parse", "main").strip())
            _plant(repo, evil, str(bare), hooks, marker)
            for name in ("pre-receive", "update", "post-receive", "post-update"):
                _hook(bare / "hooks" / name, marker)
            pushed = await _request(http, f"/api/tasks/{task_id}/push", {})
            card = (await http.get(f"/api/tasks/{task_id}/diff")).json()
    assert row["status"] == "success" and "+value = 2" in diff["diff"]
    assert report["own config"] == "REFUSED" and str(evil) not in checkout_config, (report, checkout_config)
    assert pushed["status"] == "done", pushed
    assert pushed["result"]["sandboxed"] is True and pushed["result"]["commit"] == reviewed
    # the user's remote has the branch at exactly the reviewed commit; the planted remote nothing; no hook ran
    assert _refs(bare) == {f"refs/heads/{branch}": reviewed}
    assert _refs(evil) == {} and not marker.exists(), marker.read_text()
    records = tables.payloads(db.admin_dsn, "task.pushed")
    assert [(r["remote"], r["branch"], r["commit"]) for r in records] == [(str(bare), branch, reviewed)]
    assert card["push_remote"] == str(bare) and card["push"]["pushed"] is True
    assert card["push"]["commit"] == reviewed
    # negative control: a push the plain way, from the checkout to the user's remote, goes where the plant says
    # and runs the planted hooks
    _git(repo, "push", "--quiet", str(bare), f"{reviewed}:refs/heads/control")
    assert "refs/heads/control" in _refs(evil) and "refs/heads/control" not in _refs(bare) and marker.exists()


async def test_push_refusals_change_nothing_and_a_merged_branch_still_pushes(db: DB, tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    bare = _bare(tmp_path / "remote.git")
    repo = _repo(roots / "repo", {"app.py": "value = 1\n"})
    scenario = Scenario(rules=[
        Rule(role="worker", match="first change", replies=[_bash("printf 'value = 2\\n' > app.py"), {"text": "ok"}]),
        Rule(role="worker", match="second change", replies=[_bash("printf 'other = 3\\n' > b.py"), {"text": "ok"}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            made = await _request(http, "/api/projects", {"slug": "demo", "workdir": str(repo)})
            project_id = uuid.UUID(made["result"]["project_id"])
            first, _ = await _worker(h, project_id, "first change")
            no_remote = await http.post(f"/api/tasks/{first}/push", json={})
            behind = await _direct_push(http, db, first)  # past the ingress: the executor refuses too
            # a remote the ingress refuses (422), and ones the executor refuses on disk: nothing changes
            bad = [await http.patch(f"/api/projects/{project_id}", json={"push_remote": r})
                   for r in ("git@example.org:me/repo.git", "https://me:token@example.org/repo.git", "repo.git")]
            missing = await _patch(http, project_id, str(tmp_path / "nowhere.git"))
            inside = await _patch(http, project_id, str(repo / ".git"))
            unchanged = (await http.get(f"/api/projects/{project_id}")).json()["push_remote"]
            updated = await _patch(http, project_id, str(bare))
            merged = await _request(http, f"/api/tasks/{first}/merge", {})
            after_merge = await _request(http, f"/api/tasks/{first}/push", {})
            second, _ = await _worker(h, project_id, "second change")
            discarded = await _request(http, f"/api/tasks/{second}/discard", {})
            gone = await http.post(f"/api/tasks/{second}/push", json={})
            gone_direct = await _direct_push(http, db, second)
            running = tables.insert_task(db.admin_dsn, brief="still at it", project_id=project_id, status="running",
                                        branch="petal/00000000")
            live = await http.post(f"/api/tasks/{running}/push", json={})
            live_direct = await _direct_push(http, db, running)
            diff = (await http.get(f"/api/tasks/{first}/diff")).json()
    assert no_remote.status_code == 409 and "no push remote" in no_remote.json()["detail"]
    assert behind["status"] == "failed" and "no push remote" in behind["error"]
    assert [r.status_code for r in bad] == [422, 422, 422], [r.text for r in bad]
    assert missing["status"] == "failed" and "does not exist" in missing["error"]
    assert inside["status"] == "failed" and "the project's repository" in inside["error"]
    assert unchanged is None
    assert updated["status"] == "done" and updated["result"]["push_remote"] == str(bare)
    # merged (its branch deleted in the checkout): the reviewed commit still goes to the branch on the remote
    assert merged["status"] == "done" and after_merge["status"] == "done", after_merge
    assert _refs(bare) == {f"refs/heads/{diff['branch']}": diff["head_commit"]}
    assert discarded["status"] == "done" and gone.status_code == 409 and "discarded" in gone.json()["detail"]
    assert gone_direct["status"] == "failed" and "discarded" in gone_direct["error"]
    assert live.status_code == 409 and "still running" in live.json()["detail"]
    assert live_direct["status"] == "failed" and "still running" in live_direct["error"]
    failures = tables.payloads(db.admin_dsn, "task.push_failed")
    assert len(failures) == 3 and all(f["action"] == "push" and f["reason"] for f in failures)
    assert len(tables.payloads(db.admin_dsn, "task.pushed")) == 1
    assert [u["push_remote"] for u in tables.payloads(db.admin_dsn, "project.updated")] == [str(bare)]


async def _patch(http: httpx.AsyncClient, project_id: uuid.UUID, remote: str) -> dict[str, Any]:
    queued = await http.patch(f"/api/projects/{project_id}", json={"push_remote": remote})
    assert queued.status_code == 202, queued.text
    return await _outcome(http, queued.json()["id"])


async def _direct_push(http: httpx.AsyncClient, db: DB, task_id: uuid.UUID) -> dict[str, Any]:
    """A push row queued past the ingress's checks: the executor's own refusal."""
    request_id = tables.insert(db.admin_dsn, "project_queue", action="push", task_id=task_id, args={})
    return await _outcome(http, str(request_id))


# ---- git alone: the push with the sandbox off, and to a network remote through the gateway ---------------

@dataclass(frozen=True)
class _Sandboxes:
    policy: SandboxPolicy
    cgroups: CgroupTree | None = None
    rlimits: tuple[int | None, int | None] = (None, None)


async def test_with_the_sandbox_off_the_push_is_hardened_the_same_way(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"app.py": "value = 1\n"})
    commit = _git(repo, "rev-parse", "HEAD").strip()
    bare, evil = _bare(tmp_path / "remote.git"), _bare(tmp_path / "evil.git")
    marker = bare / "hook-ran"
    _plant(repo, evil, str(bare), tmp_path / "hooks", marker)
    for name in ("pre-receive", "update", "post-receive"):
        _hook(bare / "hooks" / name, marker)
    remote = remotes.parse(str(bare))
    done = await push.push(None, await push.objects_of(repo), remote, push.check_target(remote, repo), commit,
                           "petal/0badc0de")
    assert done.ok and not done.sandboxed, done
    assert _refs(bare) == {"refs/heads/petal/0badc0de": commit} and _refs(evil) == {} and not marker.exists()


class _GitHTTP(BaseHTTPRequestHandler):
    """Smart HTTP over `git http-backend` (CGI) for the repositories under the server's `root`; `redirect`: every
    request answered 302 to that base instead."""

    def do_GET(self) -> None:  # http.server's names
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def log_message(self, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        server: Any = self.server
        server.seen.append(self.path)
        if server.redirect:
            self.send_response(302)
            self.send_header("Location", server.redirect + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path, _, query = self.path.partition("?")
        env = {"PATH": "/usr/bin:/bin", "GIT_PROJECT_ROOT": str(server.root), "GIT_HTTP_EXPORT_ALL": "1",
               "REMOTE_USER": "test", "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
               "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
               "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""), "GIT_CONFIG_NOSYSTEM": "1",
               "HOME": str(server.root)}
        out = subprocess.run(["git", "-c", "http.receivepack=true", "http-backend"], input=body, env=env,
                             capture_output=True, check=False).stdout
        sep = b"\r\n\r\n" if b"\r\n\r\n" in out else b"\n\n"
        head, _, payload = out.partition(sep)
        status, headers = 200, []
        for line in head.decode().splitlines():
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.split()[0])
            elif key:
                headers.append((key, value.strip()))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@contextmanager
def _git_server(root: Path, redirect: str | None = None) -> Iterator[tuple[str, list[str]]]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), _GitHTTP)
    server.root, server.redirect, server.seen = root, redirect, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.seen
    finally:
        server.shutdown()
        server.server_close()


async def test_a_network_remote_is_reached_through_the_gateway_and_nothing_else_is(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"app.py": "value = 1\n"})
    commit = _git(repo, "rev-parse", "HEAD").strip()
    served, other = tmp_path / "served", tmp_path / "other"
    bare, decoy = _bare(served / "remote.git"), _bare(other / "remote.git")
    sandboxes = _Sandboxes(sandbox_for(tmp_path))
    objects = await push.objects_of(repo)
    with _git_server(served) as (url, seen), _git_server(other) as (other_url, other_seen), \
            _git_server(other, redirect=other_url) as (redirecting, _):
        remote = remotes.parse(f"{url}/remote.git")
        done = await push.push(sandboxes, objects, remote, None, commit, "petal/0badc0de")
        # a remote that sends the push elsewhere (a redirect): the gateway lets through only the remote's host:port
        away = await push.push(sandboxes, objects, remotes.parse(f"{redirecting}/remote.git"), None, commit,
                               "petal/0badc0de")
    assert done.ok and done.sandboxed, done
    assert _refs(bare) == {"refs/heads/petal/0badc0de": commit} and any("git-receive-pack" in p for p in seen)
    assert not away.ok and other_seen == [] and _refs(decoy) == {}, away
    assert "not on the sandbox's allowlist" in "\n".join(away.tail)
