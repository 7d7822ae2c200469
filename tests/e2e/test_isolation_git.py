"""Git the worker cannot steer (issue 47, item 3 and git's part of item 1): the executor's git is the system's
whatever PATH says; nothing a repository's config or `config.worktree` names runs; a worker's objects stay in
its own repository until its settlement fetches its branch (hashed on the way in); Merge merges exactly the
reviewed commit, refused when its branch moved or an object no longer hashes to its id. Each attack keeps its
negative control: the same move against the old way (PATH lookup, plain git, the shared object store) gets
through. Real git throughout; the last test runs sandboxed workers through the real executor and ingress."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from executor.projects import git, worktrees
from petal_dispatch.demo.scripted_model import Rule, Scenario, ScriptedModelServer
from shared import lifeline
from tests.harness import running_executor
from tests.pg import DB
from tests.served import ingress_server
from tests.wait import until

IDENTITY = ["-c", "user.name=Test", "-c", "user.email=test@example.invalid"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *IDENTITY, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    _git(path, "init", "--quiet", "-b", "main")
    for name, text in files.items():
        (path / name).write_text(text)
    _git(path, "add", "--all")
    _git(path, "commit", "--quiet", "-m", "start")
    return path


async def _recorded(repo: Path, wt: worktrees.Worktree) -> dict[str, Any]:
    """The settlement's record of a worker's changes (as executor/settle/changes.py takes it)."""
    async with worktrees.repo_lock(repo):
        return await worktrees.changes(repo, wt.path, uuid.uuid4(), wt.branch, wt.base_commit)


def _loose(objects: Path, oid: str) -> Path:
    return objects / oid[:2] / oid[2:]


def _rewrite(objects: Path, oid: str, text: str) -> None:
    """Another content under the same loose object path (what a worker that can write the store would do)."""
    data = text.encode()
    path = _loose(objects, oid)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.chmod(0o644)
    path.write_bytes(zlib.compress(b"blob %d\0" % len(data) + data))


def _unpack(objects: Path) -> None:
    """The store's packs exploded into loose objects (a fetch keeps what it receives as a pack)."""
    for pack in list((objects / "pack").glob("*.pack")):
        moved = objects.parent / pack.name
        pack.rename(moved)
        pack.with_suffix(".idx").unlink()
        with moved.open("rb") as f:
            subprocess.run(["git", "--git-dir", str(objects.parent), "unpack-objects", "-q"], stdin=f, check=True)
        moved.unlink()


# ---- the program ----------------------------------------------------------------------------------------

_PLANTED = "#!/bin/sh\necho ran >> {marker}\nexec /usr/bin/git \"$@\"\n"


async def test_a_git_planted_in_a_venv_or_any_writable_path_entry_is_never_run_by_the_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the service's checkout used as a workdir: a worker planted .venv/bin/git, and a git in another
    # directory on the executor's PATH it can write
    checkout_bin, writable_bin = tmp_path / "checkout" / ".venv" / "bin", tmp_path / "writable"
    markers = {checkout_bin: tmp_path / "venv-git-ran", writable_bin: tmp_path / "path-git-ran"}
    for directory, marker in markers.items():
        directory.mkdir(parents=True)
        (directory / "git").write_text(_PLANTED.format(marker=marker))
        (directory / "git").chmod(0o755)
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})  # the test's own git, before the plant is on PATH
    monkeypatch.setenv("PATH", f"{checkout_bin}:{writable_bin}:{os.environ['PATH']}")
    git.program.cache_clear()  # resolved afresh under the planted PATH
    try:
        program = git.program()
        wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
        (wt.path / "b.txt").write_text("b\n")
        recorded = await _recorded(repo, wt)
        merged = await worktrees.merge(repo, wt.branch, recorded["head_commit"], wt.base_commit, "merge")
        await worktrees.delete_branch(repo, wt.branch, wt.path)
        g = await git.Git.at(repo)
        # what every git child sees as PATH: system directories and git's own exec-path, nothing else
        child_path = (await g("-c", "alias.showpath=!printf %s \"$PATH\"", "showpath")).out
        exec_path = (await g("--exec-path")).out.strip()
    finally:
        monkeypatch.undo()
        git.program.cache_clear()
    assert Path(program).parent in {Path(d).resolve() for d in git.SYSTEM_DIRS}
    assert merged["fast_forward"] and _git(repo, "show", "main:b.txt") == "b"
    assert not any(m.exists() for m in markers.values())
    assert set(child_path.split(":")) <= {*git.SYSTEM_PATH.split(":"), exec_path}, child_path

    # the negative control: the old lookup (the executor's PATH, as it starts with its venv) runs the plant
    monkeypatch.setenv("PATH", f"{checkout_bin}:{writable_bin}:{os.environ['PATH']}")
    proc = await asyncio.create_subprocess_exec("git", "-C", str(repo), "status", env=lifeline.child_env(os.environ),
                                                stdout=asyncio.subprocess.DEVNULL)
    await proc.wait()
    assert markers[checkout_bin].exists()


# ---- config.worktree and the repository's config ---------------------------------------------------------

async def test_filters_and_fsmonitor_in_config_worktree_do_not_run_at_settlements_add(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    admin = Path(_git(wt.path, "rev-parse", "--absolute-git-dir"))
    made = admin / "config.worktree"
    # there before the worker starts: empty and read-only (the sandbox keeps a file that exists read-only)
    assert made.read_text() == "" and made.stat().st_mode & 0o777 == 0o444

    # extensions.worktreeConfig as `git sparse-checkout init` sets it, and a config.worktree a worker wrote
    # (both read-only in its sandbox: the executor must ignore them even so); drivers named with a dot and
    # an `=` besides a plain one
    made.chmod(0o644)
    _git(wt.path, "sparse-checkout", "init")
    assert _git(worktrees.store_of(wt.path), "config", "extensions.worktreeConfig") == "true"
    ran = {name: tmp_path / f"{name}-ran" for name in ("x", "dotted", "fsmonitor", "process")}
    with made.open("a") as f:
        f.write(f'[filter "x"]\n\tclean = "touch {ran["x"]}; cat"\n\tsmudge = cat\n\trequired = true\n'
                f'[filter "dot.ted=1"]\n\tclean = "touch {ran["dotted"]}; cat"\n'
                f'[filter "p"]\n\tprocess = "touch {ran["process"]}"\n'
                f'[core]\n\tfsmonitor = "touch {ran["fsmonitor"]}; false"\n')
    (wt.path / ".gitattributes").write_text("*.txt filter=x\n*.md filter=dot.ted=1\n*.py filter=p\n")
    for name in ("left.txt", "notes.md", "tool.py"):
        (wt.path / name).write_text(f"{name} as the worker left it\n")
    assert _git(wt.path, "config", "--get", "filter.x.clean")  # git reads the planted config

    recorded = await _recorded(repo, wt)
    assert recorded["auto_commit"] and {f["path"] for f in recorded["files"]} == {
        ".gitattributes", "left.txt", "notes.md", "tool.py"}
    assert "+left.txt as the worker left it" in recorded["diff"]
    assert not any(m.exists() for m in ran.values())

    # the negative control: the plain `git add --all` (and status) the executor ran before, in the same tree
    (wt.path / "more.txt").write_text("more\n")
    (wt.path / "more.md").write_text("more\n")
    added = subprocess.run(["git", "-C", str(wt.path), "add", "--all"], capture_output=True, text=True, check=False)
    status = subprocess.run(["git", "-C", str(wt.path), "status"], capture_output=True, text=True, check=False)
    # what git said, when a marker is missing (once under load: a failing `add` would look like a filter not run)
    said = (added.returncode, added.stderr[-2000:], status.returncode, status.stderr[-2000:])
    assert ran["x"].exists() and ran["dotted"].exists() and ran["fsmonitor"].exists(), said


async def test_hooks_and_drivers_in_the_projects_own_config_do_not_run_at_merge(tmp_path: Path) -> None:
    """The project's checkout may be a thread's workdir: its config is no more trusted than a worktree's."""
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n", ".gitattributes": "*.txt merge=mine filter=lfsish\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    (wt.path / "b.txt").write_text("b\n")
    recorded = await _recorded(repo, wt)
    ran = tmp_path / "ran"
    for key, value in (("core.hooksPath", str(tmp_path / "hooks")), ("filter.lfsish.smudge", f"touch {ran}; cat"),
                       ("filter.lfsish.clean", f"touch {ran}; cat"), ("merge.mine.driver", f"touch {ran}; true"),
                       ("commit.gpgSign", "true"), ("gpg.program", f"{tmp_path / 'hooks' / 'post-merge'}")):
        _git(repo, "config", key, value)
    (tmp_path / "hooks").mkdir()
    for hook in ("post-merge", "pre-merge-commit", "reference-transaction"):
        (tmp_path / "hooks" / hook).write_text(f"#!/bin/sh\ntouch {ran}\n")
        (tmp_path / "hooks" / hook).chmod(0o755)
    merged = await worktrees.merge(repo, wt.branch, recorded["head_commit"], wt.base_commit, "merge")
    assert merged["fast_forward"] and (repo / "b.txt").read_text() == "b\n"
    assert not ran.exists()
    # the negative control: plain git in that checkout runs them
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "HEAD~1"], capture_output=True, check=False)
    assert ran.exists()


# ---- the object store -----------------------------------------------------------------------------------

async def test_a_rewritten_loose_object_of_a_reviewed_branch_does_not_reach_the_checkout_on_merge(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    first = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "first")
    second = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "second")
    (first.path / "feature.txt").write_text("reviewed line\n")
    recorded = await _recorded(repo, first)
    assert "+reviewed line" in recorded["diff"]
    blob = _git(repo, "rev-parse", f"{recorded['head_commit']}:feature.txt")
    project_objects = Path(_git(repo, "rev-parse", "--path-format=absolute", "--git-path", "objects"))
    _git(repo, "cat-file", "-e", blob)  # fetched in at the settlement

    # each worker's store is its own: the first's object is not in the second's, and what either writes
    # under that path stays there
    own = [worktrees.store_of(wt.path) / "objects" for wt in (first, second)]
    assert _loose(own[0], blob).exists() and not _loose(own[1], blob).exists()
    for objects in own:
        _rewrite(objects, blob, "injected line\n")
    merged = await worktrees.merge(repo, first.branch, recorded["head_commit"], first.base_commit, "merge first")
    assert merged["objects_checked"] >= 3 and (repo / "feature.txt").read_text() == "reviewed line\n"

    # the negative control, the shared-store layout: the store the worker reached was the project's. The same
    # rewrite there is caught by Merge's hash check; plain git merges it into the checkout
    third = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "third")
    (third.path / "other.txt").write_text("second reviewed line\n")
    recorded = await _recorded(repo, third)
    blob = _git(repo, "rev-parse", f"{recorded['head_commit']}:other.txt")
    _unpack(project_objects)  # as a worker's own commit left them in the shared store: loose
    _rewrite(project_objects, blob, "injected line\n")
    before = _git(repo, "rev-parse", "HEAD")
    with pytest.raises(worktrees.GitError, match=f"object {blob} \\(blob\\) no longer hashes to its id"):
        await worktrees.merge(repo, third.branch, recorded["head_commit"], third.base_commit, "merge third")
    assert _git(repo, "rev-parse", "HEAD") == before and not (repo / "other.txt").exists()
    _git(repo, "merge", "--ff", "--no-edit", recorded["head_commit"])
    assert (repo / "other.txt").read_text() == "injected line\n"


async def test_merge_is_refused_when_the_branch_moved_after_its_diff_was_recorded(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo", {"a.txt": "a\n"})
    wt = await worktrees.create(repo, uuid.uuid4(), tmp_path / "wt", "demo")
    (wt.path / "b.txt").write_text("reviewed\n")
    recorded = await _recorded(repo, wt)
    # the branch gets a commit nobody reviewed
    _git(repo, "update-ref", f"refs/heads/{wt.branch}", _git(repo, "commit-tree", "-p", recorded["head_commit"],
                                                             "-m", "unreviewed", f"{wt.base_commit}^{{tree}}"))
    before = _git(repo, "rev-parse", "HEAD")
    with pytest.raises(worktrees.GitError, match=f"branch {wt.branch} moved since its changes were recorded"):
        await worktrees.merge(repo, wt.branch, recorded["head_commit"], wt.base_commit, "merge")
    assert _git(repo, "rev-parse", "HEAD") == before and not (repo / "b.txt").exists()
    # back where it was reviewed, it merges: exactly that commit
    _git(repo, "update-ref", f"refs/heads/{wt.branch}", recorded["head_commit"])
    merged = await worktrees.merge(repo, wt.branch, recorded["head_commit"], wt.base_commit, "merge")
    assert merged["after"] == recorded["head_commit"] and (repo / "b.txt").read_text() == "reviewed\n"


# ---- sandboxed workers through the real executor --------------------------------------------------------

# A worker writes and commits its feature, and says whether the objects it wrote are in the project's store.
_FEATURE = '''import hashlib, json, pathlib, subprocess
run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, text=True).stdout.strip()
pathlib.Path("feature.txt").write_text("reviewed line\\n")
run("git", "add", "feature.txt")
run("git", "-c", "user.name=W", "-c", "user.email=w@example.invalid", "commit", "-qm", "the feature")
common = pathlib.Path(run("git", "rev-parse", "--path-format=absolute", "--git-common-dir"))
shared = [pathlib.Path(p) for p in (common / "objects" / "info" / "alternates").read_text().split()]
blob = run("git", "rev-parse", "HEAD:feature.txt")
print("REPORT", json.dumps({"own": (common / "objects" / blob[:2] / blob[2:]).exists(),
                            "shared": [(s / blob[:2] / blob[2:]).exists() for s in shared]}))
'''
# A second worker rewrites the first one's object wherever it can reach it, and plants a config.worktree.
_REWRITE = '''import hashlib, json, os, pathlib, subprocess, sys, zlib
run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, text=True).stdout.strip()
text = b"reviewed line\\n"
blob = hashlib.sha1(b"blob %d\\0" % len(text) + text).hexdigest()
evil = b"injected line\\n"
common = pathlib.Path(run("git", "rev-parse", "--path-format=absolute", "--git-common-dir"))
gitdir = pathlib.Path(run("git", "rev-parse", "--absolute-git-dir"))
shared = [pathlib.Path(p) for p in (common / "objects" / "info" / "alternates").read_text().split()]
report = {}
def attempt(what, fn):
    try:
        fn()
        report[what] = "DONE"
    except OSError as exc:
        report[what] = "REFUSED " + type(exc).__name__
def rewrite(objects):
    path = objects / blob[:2] / blob[2:]
    path.parent.mkdir(exist_ok=True)
    if path.exists():
        os.chmod(path, 0o644)
    path.write_bytes(zlib.compress(b"blob %d\\0" % len(evil) + evil))
attempt("project store", lambda: rewrite(shared[0]))
attempt("own store", lambda: rewrite(common / "objects"))
attempt("config.worktree", lambda: (gitdir / "config.worktree").write_text('[filter "x"]\\n\\tclean = touch ' + sys.argv[1] + '\\n'))
attempt("alternates", lambda: (common / "objects" / "info" / "alternates").write_text(str(common) + "\\n"))
print("REPORT", json.dumps(report))
'''


def _bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command, "description": "run it"}}}


def _report(events: list[Any]) -> dict[str, Any]:
    """The JSON a worker's script printed after `REPORT ` in a tool result."""
    for e in events:
        content = (e.payload.get("message") or {}).get("content") if e.event_type == "stream.user" else None
        for block in content if isinstance(content, list) else []:
            inner = block.get("content") if isinstance(block, dict) else None
            text = inner if isinstance(inner, str) else "".join(
                b.get("text", "") for b in inner or [] if isinstance(b, dict))
            for line in text.splitlines():
                if line.startswith("REPORT "):
                    found: dict[str, Any] = json.loads(line.removeprefix("REPORT "))
                    return found
    raise AssertionError("no report in the worker's tool results")


async def _request(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    queued = await http.post(path, json=body)
    assert queued.status_code == 202, queued.text

    async def ended() -> dict[str, Any] | None:
        row = (await http.get(f"/api/project-requests/{queued.json()['id']}")).json()
        return row if row["status"] in ("done", "failed") else None

    return await until(ended, f"project request {path}", 60)


async def test_sandboxed_workers_write_only_their_own_store_and_merge_takes_the_reviewed_commit(
    db: DB, tmp_path: Path,
) -> None:
    roots = tmp_path / "roots"
    repo = _repo(roots / "repo", {"feature.py": _FEATURE, "rewrite.py": _REWRITE})
    planted = tmp_path / "config-worktree-filter-ran"
    scenario = Scenario(rules=[
        Rule(role="worker", match="write the feature", replies=[_bash("python3 feature.py"), {"text": "done"}]),
        Rule(role="worker", match="rewrite it", replies=[_bash(f"python3 rewrite.py {planted}; echo x > y.txt"),
                                                         {"text": "done"}]),
    ])
    with ScriptedModelServer(scenario) as model:
        async with running_executor(db, model, tmp_path, project_roots=(roots,)) as h, \
                ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
            made = await _request(http, "/api/projects", {"slug": "demo", "workdir": str(repo)})
            project_id = uuid.UUID(made["result"]["project_id"])

            async def settled(brief: str) -> tuple[uuid.UUID, dict[str, Any]]:
                task_id = await h.dispatch(brief, project_id=project_id)
                row = await h.wait_task(task_id, lambda r: r["changes_recorded_at"] is not None
                                        and r["status"] not in ("pending", "running"), 120)
                return task_id, row

            first, first_row = await settled("write the feature")
            first_report = _report(await h.events(first))
            diff = (await http.get(f"/api/tasks/{first}/diff")).json()
            second, second_row = await settled("rewrite it")
            second_report = _report(await h.events(second))
            branch = first_row["branch"]
            # the user's branch moves after the review: Merge is refused with the reason, the checkout untouched
            _git(repo, "update-ref", f"refs/heads/{branch}", _git(repo, "rev-parse", "main"))
            moved = await _request(http, f"/api/tasks/{first}/merge", {})
            _git(repo, "update-ref", f"refs/heads/{branch}", diff["head_commit"])
            merged = await _request(http, f"/api/tasks/{first}/merge", {})
    assert first_row["status"] == "success" and second_row["status"] == "success"
    # the worker's objects were its own until its settlement fetched them
    assert first_report == {"own": True, "shared": [False]}
    assert "+reviewed line" in diff["diff"] and diff["head_commit"]
    assert second_report == {"project store": "REFUSED OSError", "own store": "DONE",
                             "config.worktree": "REFUSED OSError", "alternates": "REFUSED OSError"}, second_report
    assert moved["status"] == "failed" and "moved since its changes were recorded" in moved["error"]
    assert merged["status"] == "done" and merged["result"]["branch_tip"] == diff["head_commit"]
    assert (repo / "feature.txt").read_text() == "reviewed line\n" and not planted.exists()
    assert not Path(first_row["worktree"]).exists() and not worktrees.store_of(Path(first_row["worktree"])).exists()
