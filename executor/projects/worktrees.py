"""Git for projects: one worktree and branch per worker, what it changed, merge and discard.

Every git call is `git` with an explicit argv (never a shell), run as an asyncio subprocess so the event
loop never waits on it. Operations on one repository are serialised in this process: two workers' `git
worktree add` or a merge racing a worktree would otherwise fight over the repository's lock files.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from executor.sql import queries
from shared import errors, lifeline, logs
from shared.query import Queries, Transaction

log = logs.get(__name__)

# A diff larger than this is cut, with a visible marker saying how much was left out.
MAX_DIFF_CHARS = 200_000
MAX_COMMITS = 200
# A git command that takes longer than this is killed (a hung hook, a network filesystem).
GIT_TIMEOUT_S = 120.0
BRANCH_PREFIX = "petal/"
# Used only when the repository has no identity of its own (a commit or a merge commit needs one).
FALLBACK_IDENTITY = ("petal-dispatch", "petal-dispatch@localhost")

_locks: dict[tuple[int, str], asyncio.Lock] = {}
# For git run by the executor, outside any sandbox, in a tree a worker wrote: nothing in it may choose a command
# to run. A nested repository's own config (its fsmonitor) would run when status recursed into it, and hooks
# would run on commit. (The repository's config and hooks are read-only to the worker; these hold whatever
# they say.) Passed on to the git processes git itself starts (GIT_CONFIG_PARAMETERS).
UNTRUSTED_TREE = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "submodule.recurse=false",
                  "-c", "diff.ignoreSubmodules=all", "-c", "status.submoduleSummary=false",
                  "-c", "core.untrackedCache=false", "-c", "protocol.allow=never")


class GitError(errors.PetalError):
    """A git command failed; the message carries its stderr."""


@dataclass(frozen=True, slots=True)
class Result:
    rc: int
    out: str
    err: str


def repo_lock(repo: Path) -> asyncio.Lock:
    key = (id(asyncio.get_running_loop()), str(repo))
    return _locks.setdefault(key, asyncio.Lock())


def _env() -> dict[str, str]:
    """The environment git (and the repository's hooks) run with: never the harness's own settings or
    database credentials."""
    return {**lifeline.child_env(os.environ), "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


async def git(repo: Path, *args: str, check: bool = True) -> Result:
    env = _env()
    proc = await asyncio.create_subprocess_exec(
        "git", "-C", str(repo), *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), GIT_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise GitError(f"git {' '.join(args)} timed out after {GIT_TIMEOUT_S:.0f}s") from None
    res = Result(proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
    if check and res.rc != 0:
        raise GitError(f"git {' '.join(args)} failed: {res.err.strip() or res.out.strip()}")
    return res


async def _identity(repo: Path) -> list[str]:
    """`-c` options giving a commit an author when the repository and the user configured none."""
    name = (await git(repo, "config", "user.name", check=False)).out.strip()
    email = (await git(repo, "config", "user.email", check=False)).out.strip()
    if name and email:
        return []
    return ["-c", f"user.name={name or FALLBACK_IDENTITY[0]}", "-c", f"user.email={email or FALLBACK_IDENTITY[1]}"]


def branch_for(task_id: uuid.UUID) -> str:
    return f"{BRANCH_PREFIX}{task_id.hex[:8]}"


async def toplevel(path: Path) -> Path | None:
    """The repository's top-level directory when `path` is inside a git work tree, else None."""
    res = await git(path, "rev-parse", "--show-toplevel", check=False)
    return Path(res.out.strip()).resolve() if res.rc == 0 and res.out.strip() else None


async def head(repo: Path) -> tuple[str | None, str | None]:
    """(current branch or None when detached, HEAD commit or None when there is no commit yet)."""
    branch = await git(repo, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    commit = await git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
    return (branch.out.strip() or None if branch.rc == 0 else None,
            commit.out.strip() or None if commit.rc == 0 else None)


async def init(repo: Path) -> None:
    """A new repository with one empty commit, so worktrees can branch from it."""
    await git(repo, "init", "--quiet")
    await git(repo, *await _identity(repo), "commit", "--quiet", "--allow-empty", "-m", "petal-dispatch: start")


@dataclass(frozen=True, slots=True)
class Worktree:
    path: Path
    branch: str
    base_branch: str | None
    base_commit: str


async def create(repo: Path, task_id: uuid.UUID, root: Path, name: str) -> Worktree:
    """A worktree for one worker on a new branch made from the project's current branch.

    Raises:
        GitError: the repository has no commit, or git refused.
    """
    branch = branch_for(task_id)
    path = root / f"{name}-{task_id.hex[:8]}"
    async with repo_lock(repo):
        base_branch, base_commit = await head(repo)
        if base_commit is None:
            raise GitError(f"{repo} has no commit to branch from")
        root.mkdir(parents=True, exist_ok=True)
        await git(repo, "worktree", "add", "--quiet", "-b", branch, str(path), base_commit)
    return Worktree(path=path, branch=branch, base_branch=base_branch, base_commit=base_commit)


async def remove(repo: Path, path: Path) -> None:
    async with repo_lock(repo):
        if path.exists():
            await git(repo, "worktree", "remove", "--force", str(path))
        await git(repo, "worktree", "prune", check=False)


def _bounded(diff: str, limit: int) -> tuple[str, bool]:
    diff = diff.replace("\x00", "\\0")  # jsonb text holds no NUL
    if len(diff) <= limit:
        return diff, False
    return (f"{diff[:limit]}\n… diff cut here: {len(diff) - limit} of {len(diff)} characters left out "
            f"(see the branch for the whole change) …\n"), True


async def changes(repo: Path, worktree: Path | None, task_id: uuid.UUID, branch: str, base: str,
                  max_diff_chars: int = MAX_DIFF_CHARS) -> dict[str, Any]:
    """What the branch holds over `base`. Uncommitted work left in the worktree is committed to the branch
    first (removing the worktree would lose it, and only a commit can be merged)."""
    auto_commit = None
    if worktree is not None and worktree.is_dir():
        dirty = (await git(worktree, *UNTRUSTED_TREE, "status", "--porcelain", "--untracked-files=all")).out.strip()
        if dirty:
            # a commit lands where the worktree's HEAD points: only ever on the task's own branch
            head = (await git(worktree, *UNTRUSTED_TREE, "symbolic-ref", "--quiet", "HEAD", check=False)).out.strip()
            if head != f"refs/heads/{branch}":
                raise GitError(f"the worktree's HEAD is {head or 'detached'}, not {branch}: its uncommitted work "
                               "was not committed")
            await git(worktree, *UNTRUSTED_TREE, "add", "--all")
            await git(worktree, *UNTRUSTED_TREE, *await _identity(worktree), "commit", "--quiet", "--no-verify",
                      "-m", f"petal-dispatch: work left uncommitted by task {task_id}")
            auto_commit = (await git(worktree, *UNTRUSTED_TREE, "rev-parse", "HEAD")).out.strip()
    span = f"{base}..{branch}"
    log_out = (await git(repo, "log", f"--max-count={MAX_COMMITS}", "--format=%H%x1f%an%x1f%s", span)).out
    commits = [dict(zip(("sha", "author", "subject"), line.split("\x1f"), strict=False))
               for line in log_out.splitlines() if line]
    files = []
    for line in (await git(repo, "diff", "--numstat", "-z", "--no-renames", base, branch)).out.split("\x00"):
        if not line:
            continue
        added, deleted, path = line.split("\t", 2)
        files.append({"path": path, "added": None if added == "-" else int(added),
                      "deleted": None if deleted == "-" else int(deleted)})
    stat = (await git(repo, "diff", "--stat", base, branch)).out
    diff, cut = _bounded((await git(repo, "diff", "--no-renames", base, branch)).out, max_diff_chars)
    return {"branch": branch, "base_commit": base, "head_commit": (await git(repo, "rev-parse", branch)).out.strip(),
            "commits": commits, "auto_commit": auto_commit, "files": files, "diffstat": stat, "diff": diff,
            "diff_truncated": cut}


@dataclass(frozen=True, slots=True)
class TaskWorktree:
    """A task of a project with its worktree, branch and review as recorded (`get_task_worktree`)."""

    id: uuid.UUID
    project_id: uuid.UUID
    session_id: uuid.UUID | None
    status: str
    worktree: str | None
    branch: str | None
    base_branch: str | None
    base_commit: str | None
    changes_recorded_at: datetime | None
    review: str | None
    project_workdir: str | None

    @property
    def repo(self) -> Path:
        assert self.project_workdir is not None  # a task with a branch is one of a project on a repository
        return Path(self.project_workdir)

    @property
    def worktree_path(self) -> Path | None:
        return Path(self.worktree) if self.worktree else None


async def task_worktree(pool: AsyncConnectionPool, task_id: uuid.UUID) -> TaskWorktree | None:
    return await Queries(pool, queries).one("get_task_worktree", {"id": task_id}, into=TaskWorktree)


# ---- the user's decisions ---------------------------------------------------------------------------

async def _clean(repo: Path) -> str:
    return (await git(repo, "status", "--porcelain", "--untracked-files=normal")).out.strip()


class Merged(TypedDict):
    """What a merge did: the branch merged into, its commit before and after, and the merged tip."""

    into: str
    before: str | None
    after: str | None
    branch_tip: str
    fast_forward: bool
    # set by the review that removes the branch afterwards
    branch_deleted: NotRequired[bool]
    branch_delete_error: NotRequired[str]


async def merge(repo: Path, branch: str, message: str) -> Merged:
    """Merge `branch` into the main checkout's current branch: fast-forward when possible, else a merge
    commit. A conflict is aborted and the checkout verified clean before GitError is raised.

    Raises:
        GitError: the checkout is not clean, is detached, the branch is gone, or the merge conflicted.
    """
    async with repo_lock(repo):
        target, before = await head(repo)
        if target is None:
            raise GitError("the project's checkout is not on a branch (detached HEAD): nothing to merge into")
        dirty = await _clean(repo)
        if dirty:
            raise GitError(f"the project's checkout at {repo} has uncommitted changes; commit or stash them "
                           f"first:\n{dirty[:1000]}")
        if (await git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)).rc != 0:
            raise GitError(f"branch {branch} does not exist")
        tip = (await git(repo, "rev-parse", branch)).out.strip()
        res = await git(repo, *await _identity(repo), "merge", "--ff", "--no-edit", "-m", message, branch, check=False)
        if res.rc != 0:
            conflicted = (await git(repo, "diff", "--name-only", "--diff-filter=U", check=False)).out.split()
            await git(repo, "merge", "--abort", check=False)
            left = await _clean(repo)
            after = (await head(repo))[1]
            if left or after != before:
                # nothing may stay half-merged: put the checkout back exactly where it was
                await git(repo, "reset", "--hard", "--quiet", before or "HEAD", check=False)
            raise GitError(f"merging {branch} into {target} conflicted in {', '.join(conflicted) or 'some files'}; "
                           "the merge was aborted and the checkout left as it was")
        _, after = await head(repo)
        return Merged(into=target, before=before, after=after, branch_tip=tip, fast_forward=after == tip)


async def delete_branch(repo: Path, branch: str, worktree: Path | None) -> None:
    if worktree is not None and worktree.exists():
        await remove(repo, worktree)
    async with repo_lock(repo):
        await git(repo, "branch", "-D", branch)


async def artifacts(conn: AsyncConnection[Any], task_id: uuid.UUID) -> list[str]:
    """A worker's recorded changes as handoff artifacts (its branch, commits and files); [] when none."""
    row = await Transaction(conn, queries).one("get_latest_task_changes", {"id": task_id})
    c = row["payload"] if row else None
    if not c or "error" in c:
        return []
    return ([f"branch {c['branch']}"] + [f"commit {x['sha'][:12]} {x.get('subject', '')}" for x in c["commits"]]
            + [f"file {f['path']}" for f in c["files"]])
