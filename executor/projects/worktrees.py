"""Git for projects: one worktree, branch and private repository per worker, what it changed, merge and discard.

A worker's repository is its own (`store_of`): a bare repository beside its tree, whose object store borrows
the project's objects read-only (an alternate) and holds only what the worker writes, with the worker's
branch made at the project's current commit. Nothing a worker writes is in the project's repository until its
settlement brings the branch over with `git fetch` (each object hashed and checked on the way in); Merge
merges exactly the commit whose diff was recorded, after checking its objects still hash to their ids.

Every git call goes through `executor.projects.git` (a program fixed at start, nothing a repository's config
says runs), as an asyncio subprocess. Operations on one repository are serialised in this process: a fetch
or a merge racing another would otherwise fight over the repository's lock files.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from executor.projects.git import NO_DRIVERS, Git, GitError, Result, verify_objects
from executor.projects.store import ProjectStore, TaskWorktree
from shared import logs

__all__ = ["GitError", "Result", "TaskWorktree"]

log = logs.get(__name__)

# A diff larger than this is cut, with a visible marker saying how much was left out.
MAX_DIFF_CHARS = 200_000
MAX_COMMITS = 200
# the files a record lists at most, and what its file list and diffstat are read from at most
MAX_FILES = 5_000
LIST_BYTES = 2 * 1024 * 1024
BRANCH_PREFIX = "petal/"
# Used only when neither the repository nor the user configured an identity (a commit or a merge commit needs one).
FALLBACK_IDENTITY = ("petal-dispatch", "petal-dispatch@localhost")

_locks: dict[tuple[int, str], asyncio.Lock] = {}


def repo_lock(repo: Path) -> asyncio.Lock:
    key = (id(asyncio.get_running_loop()), str(repo))
    return _locks.setdefault(key, asyncio.Lock())


async def git(cwd: Path, *args: str, check: bool = True) -> Result:
    """One git command at `cwd` (for a sequence, `Git.at` once and call it)."""
    return await (await Git.at(cwd))(*args, check=check)


async def _identity(g: Git) -> list[str]:
    """`-c` options giving a commit an author: the repository's or the user's own, else petal-dispatch's."""
    values = g.with_user_config()
    name = (await values("config", "--get", "user.name", check=False)).out.strip()
    email = (await values("config", "--get", "user.email", check=False)).out.strip()
    return ["-c", f"user.name={name or FALLBACK_IDENTITY[0]}", "-c", f"user.email={email or FALLBACK_IDENTITY[1]}"]


def branch_for(task_id: uuid.UUID) -> str:
    return f"{BRANCH_PREFIX}{task_id.hex[:8]}"


def store_of(worktree: Path) -> Path:
    """A worker's private repository: its objects, its branch and its worktree's admin files, beside its tree."""
    return worktree.with_name(f"{worktree.name}.git")


async def toplevel(path: Path) -> Path | None:
    """The repository's top-level directory when `path` is inside a git work tree, else None."""
    res = await git(path, "rev-parse", "--show-toplevel", check=False)
    return Path(res.out.strip()).resolve() if res.rc == 0 and res.out.strip() else None


async def _head(g: Git) -> tuple[str | None, str | None]:
    branch = await g("symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    commit = await g("rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
    return (branch.out.strip() or None if branch.rc == 0 else None,
            commit.out.strip() or None if commit.rc == 0 else None)


async def head(repo: Path) -> tuple[str | None, str | None]:
    """(current branch or None when detached, HEAD commit or None when there is no commit yet)."""
    return await _head(await Git.at(repo))


async def init(repo: Path) -> None:
    """A new repository with one empty commit, so worktrees can branch from it."""
    await git(repo, "init", "--quiet")
    g = await Git.at(repo)
    await g(*await _identity(g), "commit", "--quiet", "--allow-empty", "-m", "petal-dispatch: start")


@dataclass(frozen=True, slots=True)
class Worktree:
    path: Path
    branch: str
    base_branch: str | None
    base_commit: str


async def create(repo: Path, task_id: uuid.UUID, root: Path, name: str,
                 start: tuple[str, str | None] | None = None) -> Worktree:
    """A worktree for one worker on a new branch made from the project's current commit (or from `start`, a
    commit in the project's repository and the branch it is for: a reviewed worker's, which a follow-up
    continues), in a repository of the worker's own (`store_of`) whose object store borrows the project's
    read-only.

    Raises:
        GitError: the repository has no commit (or not `start`'s), the worktree exists already, or git refused.
    """
    branch = branch_for(task_id)
    path = root / f"{name}-{task_id.hex[:8]}"
    store = store_of(path)
    async with repo_lock(repo):
        project = await Git.at(repo)
        base_branch, base_commit = await _head(project)
        if start is not None:
            found = await project("rev-parse", "--verify", "--quiet", f"{start[0]}^{{commit}}", check=False)
            if found.rc != 0:
                raise GitError(f"{repo} has no commit {start[0][:12]} to continue from")
            base_commit, base_branch = found.out.strip(), start[1] or base_branch
        if base_commit is None:
            raise GitError(f"{repo} has no commit to branch from")
        objects = (await project("rev-parse", "--path-format=absolute", "--git-path", "objects")).out.strip()
        fmt = (await project("rev-parse", "--show-object-format")).out.strip()
    if path.exists() or store.exists():
        raise GitError(f"{path} or {store} exists already")
    root.mkdir(parents=True, exist_ok=True)
    # no template: no sample hooks, nothing but what git needs
    await git(root, "init", "--quiet", "--bare", "--template=", f"--object-format={fmt}", str(store))
    (store / "objects" / "info").mkdir(parents=True, exist_ok=True)
    (store / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    (store / "logs").mkdir(exist_ok=True)  # the worker's reflogs (the sandbox makes it writable when it exists)
    own = await Git.at(store)
    await own("update-ref", f"refs/heads/{branch}", base_commit)
    await own("worktree", "add", "--quiet", str(path), branch)
    # empty and read-only before the worker starts: git reads it under extensions.worktreeConfig, and the
    # sandbox keeps a file that exists read-only (a worker could not create it with a filter or an fsmonitor)
    admin = Path((await git(path, "rev-parse", "--absolute-git-dir")).out.strip())
    (admin / "config.worktree").write_text("")
    (admin / "config.worktree").chmod(0o444)
    return Worktree(path=path, branch=branch, base_branch=base_branch, base_commit=base_commit)


def _rmtree(path: Path) -> None:
    """Remove a tree a worker wrote, also where it made a directory read-only or unreadable (mode 000: the walk
    cannot open it, and the failing call handed here is os.open, which takes flags)."""
    def writable_again(func: Any, failed: str, _exc: Any) -> None:
        parent = os.path.dirname(failed)
        os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, stat.S_IRWXU)
            shutil.rmtree(failed, onerror=writable_again)
        else:
            func(failed)

    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, onerror=writable_again)


async def remove(repo: Path, path: Path) -> None:
    """A worker's tree and its private repository go (the branch is in the project's repository by then)."""
    store = store_of(path)
    if store.is_dir():
        await asyncio.to_thread(_rmtree, path)
        await asyncio.to_thread(_rmtree, store)
        return
    async with repo_lock(repo):  # a worktree of the project's repository, made before private repositories
        g = await Git.at(repo)
        if path.exists():
            await g("worktree", "remove", "--force", str(path))
        await g("worktree", "prune", check=False)


def _bounded(diff: str, limit: int, read_cut: bool = False) -> tuple[str, bool]:
    diff = diff.replace("\x00", "\\0")  # jsonb text holds no NUL
    if len(diff) <= limit and not read_cut:
        return diff, False
    left = f"more than {max(len(diff) - limit, 0)}" if read_cut else f"{len(diff) - limit} of {len(diff)}"
    return (f"{diff[:limit]}\n… diff cut here: {left} characters left out "
            f"(see the branch for the whole change) …\n"), True


def scrub_store(store: Path) -> None:
    """Before the executor's own git touches a worker's private repository (its spawn has ended): no symbolic
    link anywhere in it, and none of the files git writes by following a path (the commit message, reflogs).

    The worker could write parts of the store (objects, its worktree's directory, logs, its branch's refs): a link
    planted at `worktrees/<n>/COMMIT_EDITMSG` or `logs/HEAD` would have the executor's commit truncate or append to
    any file its user may write (the login, the database). Links are refused, the reflogs and message removed.

    Raises:
        GitError: a symbolic link in the store (named).
    """
    if store.is_symlink():
        raise GitError(f"the worker's repository {store} is a symbolic link: not touched")
    for top, dirs, files in os.walk(store, followlinks=False):
        for name in (*dirs, *files):
            if os.path.islink(os.path.join(top, name)):
                raise GitError(f"a symbolic link in the worker's repository ({os.path.join(top, name)}): its "
                               "branch was not brought back")
    for gitdir in (store, *(p for p in (store / "worktrees").glob("*") if p.is_dir())):
        shutil.rmtree(gitdir / "logs", ignore_errors=True)
        (gitdir / "COMMIT_EDITMSG").unlink(missing_ok=True)


async def _commit_left_work(worktree: Path, task_id: uuid.UUID, branch: str) -> str | None:
    """Uncommitted work left in the worktree, committed to the task's branch (removing the worktree would
    lose it, and only a commit can be merged); the commit, or None when there was none."""
    wt = await Git.at(worktree)
    if not (await wt("status", "--porcelain", "--untracked-files=all", limit=4096)).out.strip():  # anything at all
        return None
    # a commit lands where the worktree's HEAD points: only ever on the task's own branch
    head_ref = (await wt("symbolic-ref", "--quiet", "HEAD", check=False)).out.strip()
    if head_ref != f"refs/heads/{branch}":
        raise GitError(f"the worktree's HEAD is {head_ref or 'detached'}, not {branch}: its uncommitted work "
                       "was not committed")
    await wt("add", "--all")
    await wt(*await _identity(wt), "commit", "--quiet", "--no-verify",
             "-m", f"petal-dispatch: work left uncommitted by task {task_id}")
    return (await wt("rev-parse", "HEAD")).out.strip()


async def _fetch(project: Git, store: Path, branch: str) -> str:
    """The worker's branch brought into the project's repository from its private one; its commit.

    The fetch receives a pack that git indexes itself: each object's id is its content's hash, the pack must
    connect to what the project has, and transfer.fsckObjects checks every object is well formed."""
    tip = (await git(store, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}",
                     check=False)).out.strip()
    if not tip:
        raise GitError(f"the worker's branch {branch} is gone from {store}")
    ref = f"refs/heads/{branch}"
    await project("-c", "protocol.file.allow=always", "fetch", "--quiet", "--no-tags", "--no-write-fetch-head",
                  "--no-recurse-submodules", str(store), f"+{ref}:{ref}")
    got = (await project("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")).out.strip()
    if got != tip:  # a url.<base>.insteadOf in the project's config would fetch from somewhere else
        raise GitError(f"fetched {branch} is {got}, not the worker's {tip}")
    return tip


async def changes(repo: Path, worktree: Path | None, task_id: uuid.UUID, branch: str, base: str,
                  max_diff_chars: int = MAX_DIFF_CHARS) -> dict[str, Any]:
    """What the branch holds over `base`, once brought into the project's repository from the worker's own
    (uncommitted work left in the worktree committed to it first). The caller holds `repo_lock(repo)`."""
    auto_commit = None
    store = store_of(worktree) if worktree is not None else None
    if store is not None and store.is_dir():
        await asyncio.to_thread(scrub_store, store)  # a walk of what the worker made: off the event loop
    if worktree is not None and worktree.is_dir():
        auto_commit = await _commit_left_work(worktree, task_id, branch)
    project = await Git.at(repo)
    if store is not None and store.is_dir():
        tip = await _fetch(project, store, branch)
    else:  # a worktree of the project's repository, made before private repositories: the branch is there
        tip = (await project("rev-parse", "--verify", f"refs/heads/{branch}^{{commit}}")).out.strip()
    span = f"{base}..{tip}"
    log_out = (await project("log", *NO_DRIVERS, f"--max-count={MAX_COMMITS}", "--format=%H%x1f%an%x1f%s",
                             span)).out
    commits = [dict(zip(("sha", "author", "subject"), line.split("\x1f"), strict=False))
               for line in log_out.splitlines() if line]
    # the file list and the diffstat read as far as the record keeps: a worker's tree can hold any number of files
    numstat = await project("diff", *NO_DRIVERS, "--numstat", "-z", "--no-renames", base, tip, limit=LIST_BYTES)
    entries = [e for e in numstat.out.split("\x00")[:-1 if numstat.cut else None] if e]  # (a cut one's last is partial)
    files = []
    for line in entries[:MAX_FILES]:
        added, deleted, path = line.split("\t", 2)
        files.append({"path": path, "added": None if added == "-" else int(added),
                      "deleted": None if deleted == "-" else int(deleted)})
    stat = await project("diff", *NO_DRIVERS, "--stat", base, tip, limit=LIST_BYTES)
    stat_out = stat.out + ("\n… the rest cut here (see the branch)\n" if stat.cut else "")
    # read no further than the record keeps (a character is at most 4 bytes): a commit can hold gigabytes
    whole = await project("diff", *NO_DRIVERS, "--no-renames", base, tip, limit=4 * max_diff_chars + 4)
    diff, cut = _bounded(whole.out, max_diff_chars, whole.cut)
    # head_commit is the commit this diff is of: Merge merges it and nothing else
    return {"branch": branch, "base_commit": base, "head_commit": tip, "commits": commits,
            "auto_commit": auto_commit, "files": files, "files_truncated": numstat.cut or len(entries) > MAX_FILES,
            "diffstat": stat_out, "diff": diff, "diff_truncated": cut}


async def task_worktree(pool: AsyncConnectionPool, task_id: uuid.UUID) -> TaskWorktree | None:
    return await ProjectStore.over(pool).task_worktree(task_id)


# ---- the user's decisions ---------------------------------------------------------------------------

async def _clean(g: Git) -> str:
    return (await g("status", "--porcelain", "--untracked-files=normal")).out.strip()


async def _overwrites_nothing(g: Git, repo: Path, head: str, commit: str) -> None:
    """Refuse a merge that would write a file the checkout has untracked: git overwrites an ignored one without a
    word (and what counts as ignored is in `.git/info/exclude`, which a spawn in the checkout can write)."""
    added = (await g("diff", *NO_DRIVERS, "--name-only", "--no-renames", "--diff-filter=A", "-z", head,
                     commit)).out.split("\0")
    there = [p for p in added if p and os.path.lexists(repo / p)]
    if there:
        raise GitError(f"merging would overwrite {', '.join(there[:5])}{' …' if len(there) > 5 else ''} in {repo}, "
                       "not tracked there (an ignored file?): move it away first")


class Merged(TypedDict):
    """What a merge did: the branch merged into, its commit before and after, and the merged tip."""

    into: str
    before: str | None
    after: str | None
    branch_tip: str
    fast_forward: bool
    # how many objects of the merged commits were hashed and found intact first
    objects_checked: int
    # set by the review that removes the branch afterwards
    branch_deleted: NotRequired[bool]
    branch_delete_error: NotRequired[str]


async def merge(repo: Path, branch: str, commit: str, base: str | None, message: str) -> Merged:
    """Merge `commit` — the one whose diff over `base` was recorded, `branch`'s tip then — into the main
    checkout's current branch: fast-forward when possible, else a merge commit. Refused when the branch moved
    since, or when an object it brings no longer hashes to its id. A conflict is aborted and the checkout
    verified clean before GitError is raised.

    Raises:
        GitError: the checkout is not clean or is detached, the branch is gone or moved, an object changed,
            or the merge conflicted.
    """
    async with repo_lock(repo):
        g = await Git.checkout(repo)
        target, before = await _head(g)
        if target is None:
            raise GitError("the project's checkout is not on a branch (detached HEAD): nothing to merge into")
        dirty = await _clean(g)
        if dirty:
            raise GitError(f"the project's checkout at {repo} has uncommitted changes; commit or stash them "
                           f"first:\n{dirty[:1000]}")
        found = await g("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}", check=False)
        if found.rc != 0:
            raise GitError(f"branch {branch} does not exist")
        tip = found.out.strip()
        if tip != commit:
            raise GitError(f"branch {branch} moved since its changes were recorded (recorded {commit[:12]}, now "
                           f"{tip[:12]}): only the reviewed commit is merged; discard it, or merge it by hand")
        checked = await verify_objects(g, commit, base)
        await _overwrites_nothing(g, repo, before or "HEAD", commit)
        res = await g(*await _identity(g), "merge", "--ff", "--no-edit", "-m", message, commit, check=False)
        if res.rc != 0:
            conflicted = (await g("diff", "--name-only", "--diff-filter=U", check=False)).out.split()
            await g("merge", "--abort", check=False)
            left = await _clean(g)
            after = (await _head(g))[1]
            if left or after != before:
                # nothing may stay half-merged: put the checkout back exactly where it was
                await g("reset", "--hard", "--quiet", before or "HEAD", check=False)
            raise GitError(f"merging {branch} into {target} conflicted in {', '.join(conflicted) or 'some files'}; "
                           "the merge was aborted and the checkout left as it was")
        _, after = await _head(g)
        return Merged(into=target, before=before, after=after, branch_tip=tip, fast_forward=after == tip,
                      objects_checked=checked)


async def delete_branch(repo: Path, branch: str, worktree: Path | None) -> None:
    """The worker's tree and private repository, and its branch in the project's repository (where its
    settlement brought it), go."""
    if worktree is not None and (worktree.exists() or store_of(worktree).exists()):
        await remove(repo, worktree)
    async with repo_lock(repo):
        g = await Git.at(repo)
        if (await g("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)).rc == 0:
            await g("branch", "-D", branch)


async def artifacts(conn: AsyncConnection[Any], task_id: uuid.UUID) -> list[str]:
    """A worker's recorded changes as handoff artifacts (its branch, commits and files); [] when none."""
    c = await ProjectStore.on(conn).latest_changes(task_id)
    if not c or "error" in c:
        return []
    return ([f"branch {c['branch']}"] + [f"commit {x['sha'][:12]} {x.get('subject', '')}" for x in c["commits"]]
            + [f"file {f['path']}" for f in c["files"]])
