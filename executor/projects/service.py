"""Projects: carries out `project_queue` rows — register a project on a git repository or change its push remote,
merge, discard or push a worker's branch. Every outcome is journaled; a refusal is the row's `failed` status with
the reason.

A project's workdir must be a directory under one of the configured roots once `..` and symlinks are
resolved, and a git repository's top level (or be initialised on request). Nothing is created otherwise.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

from executor.journal.writer import JournalWriter
from executor.projects import git, push, worktrees
from executor.projects.store import ProjectRequest, ProjectStore
from shared.protected import overlap
from executor.sandbox import gateway
from shared import consume, database, logs, read_surface, remotes
from shared.listener import Subscription
from shared.models import ACTIVE_STATUSES, NewEvent

log = logs.get(__name__)

POLL_S = 2.0
SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
MAX_PLAN_CHARS = 200_000
# a project's own sandbox allowlist entries (its package registries)
MAX_ALLOW = 100
MAX_CHECK_RETRIES = 5


class Refused(Exception):
    """A request that cannot be carried out as given; the message is the reason the user sees (`details`: what
    its record carries besides)."""

    def __init__(self, reason: str, details: dict[str, Any] | None = None):
        super().__init__(reason)
        self.details = details or {}


@dataclass(frozen=True)
class ProjectsConfig:
    # a project's workdir must lie under one of these (resolved); empty: the service user's home
    roots: tuple[Path, ...] = ()
    keep_worktrees: bool = False
    # what no worker may write (shared/protected.py): no project's repository contains it or lies inside it
    protected: tuple[tuple[str, Path], ...] = ()

    def resolved_roots(self) -> list[Path]:
        return [r.expanduser().resolve() for r in (self.roots or (Path.home(),))]


def check_workdir(raw: str, roots: list[Path], protected: tuple[tuple[str, Path], ...] = ()) -> Path:
    """The resolved workdir, or Refused with the reason (pure but for the filesystem lookups): under a root, a
    directory, and neither containing nor inside what no worker may write (`protected`)."""
    given = Path(raw)
    if not given.is_absolute():
        raise Refused(f"workdir must be an absolute path (got {raw!r})")
    if ".." in given.parts:
        raise Refused(f"workdir may not contain '..' (got {raw!r}); give the real path")
    resolved = given.resolve()
    if not any(resolved == root or root in resolved.parents for root in roots):
        raise Refused(f"workdir {resolved} is outside the allowed project roots "
                      f"({', '.join(str(r) for r in roots)}; set PETAL_PROJECT_ROOTS)")
    if not resolved.is_dir():
        raise Refused(f"workdir {resolved} does not exist or is not a directory")
    # the home itself too: a spawn with the home as its tree could write every dotfile a shell runs
    why = overlap(resolved, protected, home=Path.home().resolve())
    if why is not None:
        raise Refused(f"workdir {resolved} {why}: a worker writing there would change what the service runs or "
                      "trusts")
    return resolved


def read_plan(repo: Path, plan_path: str) -> str:
    """The plan file's text; it must lie inside the repository."""
    target = (repo / plan_path).resolve()
    if repo not in target.parents:
        raise Refused(f"plan_path {plan_path!r} is outside the repository")
    if not target.is_file():
        raise Refused(f"plan_path {plan_path!r} is not a file in the repository")
    text = target.read_text(encoding="utf-8", errors="replace")
    if len(text) > MAX_PLAN_CHARS:
        raise Refused(f"plan_path {plan_path!r} is larger than {MAX_PLAN_CHARS} characters")
    return text


@dataclass
class Projects:
    pool: AsyncConnectionPool
    writer: JournalWriter
    config: ProjectsConfig = field(default_factory=ProjectsConfig)
    # the executor's sandbox (its Isolation) a push runs in; None: the operator's PETAL_SANDBOX=off
    sandboxes: push.Sandboxes | None = None
    store: ProjectStore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.store = ProjectStore.over(self.pool)
        git.program()  # resolved at the executor's start (GitError: none fit), never through its PATH later

    async def run(self, sub: Subscription) -> None:
        available = database.availability(self.pool)
        await available.retry(self.store.requeue_claimed, "projects")
        await consume.consume("projects", sub, {"project_queue": [self.apply]}, POLL_S, available)

    async def apply(self) -> int:
        """Carry out one batch of queued requests; how many there were."""
        rows = await self.store.claim_requests()
        actions = {"create": self._create, "update": self._update, "merge": self._merge, "push": self._push}
        for row in rows:
            status, error, result = "done", None, None
            try:
                result = await actions.get(row.action, self._discard)(row)
            except (Refused, worktrees.GitError, OSError) as exc:
                status, error = "failed", str(exc)
                await self._refusal(row, error, exc.details if isinstance(exc, Refused) else {})
            except Exception as exc:  # noqa: BLE001 - a request is never left claimed: it fails visibly
                log.exception("project_request_failed", request_id=str(row.id))
                status, error = "failed", f"internal error: {exc!r}"[:500]
                await self._refusal(row, error, {})
            await self.store.finish_request(row.id, status, error, result)
        return len(rows)

    async def _refusal(self, row: ProjectRequest, reason: str, details: dict[str, Any]) -> None:
        if row.action in ("create", "update"):
            await self.writer.write([NewEvent("project.refused", {"request_id": str(row.id), "reason": reason,
                                                                  "args": row.args})])
        else:
            task = await self.store.task_worktree(row.task_id) if row.task_id else None
            kind = "task.push_failed" if row.action == "push" else "task.merge_failed"
            await self.writer.write([NewEvent(kind, {
                "request_id": str(row.id), "action": row.action, "reason": reason, **details},
                task_id=task.id if task else None, project_id=task.project_id if task else None)])

    # ---- create --------------------------------------------------------------------------------------

    async def _create(self, row: ProjectRequest) -> dict[str, Any]:
        args = row.args or {}
        slug = str(args.get("slug") or "")
        if not SLUG.match(slug):
            raise Refused(f"slug {slug!r} must be 1-63 of a-z 0-9 . _ - (starting with a letter or digit)")
        allow = sandbox_allow(args.get("sandbox_allow"))  # checked before anything is made
        repo = check_workdir(str(args.get("workdir") or ""), self.config.resolved_roots(), self.config.protected)
        top = await worktrees.toplevel(repo)
        initialised = False
        if top is None:
            if not args.get("init"):
                raise Refused(f"{repo} is not a git repository (ask for init to create one)")
            await worktrees.init(repo)
            initialised = True
        elif top != repo:
            raise Refused(f"{repo} is inside the git repository {top}; use its top level as the workdir")
        elif (await worktrees.head(repo))[1] is None:
            raise Refused(f"{repo} has no commit yet: workers branch from a commit")
        plan, plan_path = args.get("plan"), args.get("plan_path")
        if plan_path:
            plan = read_plan(repo, str(plan_path))
        if plan and not read_surface.plan_tasks(plan):
            raise Refused("the plan has no task lines (`- [ ] T-001 title`)")
        if await self.store.workdir_taken(str(repo)):
            raise Refused(f"{repo} is already a project")
        remote = self._checked_remote(args.get("push_remote"), repo)
        check = str(args["check_command"]).strip() if args.get("check_command") else None
        retries = args.get("check_retries", 1)
        if not isinstance(retries, int) or not 0 <= retries <= MAX_CHECK_RETRIES:
            raise Refused(f"check_retries must be 0-{MAX_CHECK_RETRIES} (got {retries!r})")
        made = await self.store.insert_project(slug, workdir=str(repo), plan=plan, plan_path=plan_path,
                                               sandbox_allow=allow, check_command=check or None,
                                               check_retries=retries, push_remote=remote)
        if made is None:
            raise Refused(f"slug {slug!r} is taken")
        project_id = made
        branch, commit = await worktrees.head(repo)
        payload = {"slug": slug, "workdir": str(repo), "branch": branch, "commit": commit, "initialised": initialised,
                   "plan_tasks": len(read_surface.plan_tasks(plan)), "plan_path": plan_path, "sandbox_allow": allow,
                   "check_command": check or None, "check_retries": retries, "push_remote": remote}
        await self.writer.write([NewEvent("project.created", payload, project_id=project_id)])
        log.info("project_created", slug=slug, workdir=str(repo))
        return {"project_id": str(project_id), **payload}

    def _checked_remote(self, raw: Any, repo: Path) -> str | None:
        """A push remote as given (None: none), checked as the ingress did and, for a path, on disk."""
        if raw is None:
            return None
        try:
            remote = remotes.parse(str(raw))
            push.check_target(remote, repo, self.config.protected)
        except ValueError as exc:
            raise Refused(str(exc)) from None
        return remote.url

    async def _update(self, row: ProjectRequest) -> dict[str, Any]:
        """A project's push remote set or cleared."""
        args = row.args or {}
        found = await self.store.remote(uuid.UUID(str(args.get("project_id"))))
        if found is None or found.workdir is None:
            raise Refused(f"no project {args.get('project_id')} on a repository")
        remote = self._checked_remote(args.get("push_remote"), Path(found.workdir))
        await self.store.set_push_remote(found.id, remote)
        payload = {"request_id": str(row.id), "push_remote": remote, "before": {"push_remote": found.push_remote}}
        await self.writer.write([NewEvent("project.updated", payload, project_id=found.id)])
        return {"project_id": str(found.id), **payload}

    # ---- merge / discard / push ----------------------------------------------------------------------

    async def _reviewable(self, row: ProjectRequest) -> tuple[worktrees.TaskWorktree, str]:
        """The task whose branch a merge or discard acts on, and that branch."""
        task = await self.store.task_worktree(row.task_id) if row.task_id else None
        if task is None or task.branch is None:
            raise Refused(f"task {row.task_id} has no branch of a project")
        if task.status in ACTIVE_STATUSES:
            raise Refused(f"task {task.id} is still {task.status}")
        if task.review is not None:
            raise Refused(f"the branch of task {task.id} was already {task.review}")
        if task.changes_recorded_at is None:
            raise Refused(f"task {task.id}'s changes are not recorded yet; try again in a moment")
        return task, task.branch

    async def _merge(self, row: ProjectRequest) -> dict[str, Any]:
        task, branch = await self._reviewable(row)
        # exactly the commit whose diff the user saw: recorded with it by the settlement
        c = await self.store.latest_changes(task.id)
        if not c or "error" in c or not c.get("head_commit"):
            why = f" ({c['error']})" if c and "error" in c else ""
            raise Refused(f"task {task.id}'s changes could not be recorded{why}: there is no reviewed commit to "
                          "merge")
        merged = await worktrees.merge(task.repo, branch, c["head_commit"], c.get("base_commit"),
                                       f"Merge {branch} (task {task.id})")
        # merged is merged: record it even if tidying up the branch fails
        await self.store.set_review(task.id, "merged")
        try:  # the branch is in the project's branch now: it and any kept worktree go
            await worktrees.delete_branch(task.repo, branch, task.worktree_path)
            merged["branch_deleted"] = True
        except worktrees.GitError as exc:
            merged["branch_deleted"] = False
            merged["branch_delete_error"] = str(exc)
        payload = {"request_id": str(row.id), "branch": branch, **merged}
        await self.writer.write([NewEvent("task.merged", payload, task_id=task.id, project_id=task.project_id)])
        return payload

    async def _push(self, row: ProjectRequest) -> dict[str, Any]:
        """Exactly the reviewed commit to refs/heads/<branch> on the remote the user set, merged or not."""
        task = await self.store.task_worktree(row.task_id) if row.task_id else None
        if task is None or task.branch is None:
            raise Refused(f"task {row.task_id} has no branch of a project")
        if task.status in ACTIVE_STATUSES:
            raise Refused(f"task {task.id} is still {task.status}")
        if task.review == "discarded":
            raise Refused(f"the branch of task {task.id} was discarded: there is nothing to push")
        c = await self.store.latest_changes(task.id) if task.changes_recorded_at is not None else None
        if not c or "error" in c or not c.get("head_commit"):
            raise Refused(f"task {task.id} has no reviewed commit to push (its changes are not recorded"
                          f"{': ' + c['error'] if c and 'error' in c else ''})")
        project = await self.store.remote(task.project_id)
        if project is None or project.push_remote is None:
            raise Refused(f"the project of task {task.id} has no push remote: set one first")
        try:
            remote = remotes.parse(project.push_remote)
            target = push.check_target(remote, task.repo, self.config.protected)
        except ValueError as exc:
            raise Refused(str(exc)) from None
        said = {"remote": remote.url, "branch": task.branch, "commit": c["head_commit"]}
        done = await push.push(self.sandboxes, await push.objects_of(task.repo), remote, target, c["head_commit"],
                               task.branch)
        if not done.ok:
            last = done.tail[-1] if done.tail else f"exit {done.exit_code}"
            raise Refused(f"git push to {remote.url} failed: {last}", {**said, **done.payload()})
        payload = {"request_id": str(row.id), **said, **done.payload()}
        await self.writer.write([NewEvent("task.pushed", payload, task_id=task.id, project_id=task.project_id)])
        return payload

    async def _discard(self, row: ProjectRequest) -> dict[str, Any]:
        task, branch = await self._reviewable(row)
        await worktrees.delete_branch(task.repo, branch, task.worktree_path)
        await self.store.set_review(task.id, "discarded")
        payload = {"request_id": str(row.id), "branch": branch}
        await self.writer.write([NewEvent("task.discarded", payload, task_id=task.id, project_id=task.project_id)])
        return payload


def sandbox_allow(raw: Any) -> list[str]:
    """A project's additions to its workers' sandbox allowlist, checked (Refused naming the bad entry)."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(e, str) for e in raw) or len(raw) > MAX_ALLOW:
        raise Refused(f"sandbox_allow must be a list of at most {MAX_ALLOW} host or host:port strings")
    entries = [e.strip() for e in raw if e.strip()]
    for entry in entries:
        try:
            gateway.Allow.parse(entry)
        except ValueError:
            raise Refused(f"sandbox_allow: {entry!r} is not a host, host:port or *.domain") from None
    return entries


async def insert_project(pool: AsyncConnectionPool, slug: str, *, workdir: str | None, plan: str | None,
                         plan_path: str | None = None, sandbox_allow: list[str] | None = None) -> uuid.UUID | None:
    """Register a project as given (the checks are the caller's); its id, or None when the slug is taken."""
    return await ProjectStore.over(pool).insert_project(slug, workdir=workdir, plan=plan, plan_path=plan_path,
                                                        sandbox_allow=sandbox_allow or [])


# ---- the supervisor's side ----------------------------------------------------------------------------

async def prepare_worktree(pool: AsyncConnectionPool, writer: JournalWriter, task_id: uuid.UUID,
                           root: Path) -> Path | None:
    """Before a task spawns: its own worktree when it is a worker of a project (else None, run as before).

    Raises:
        worktrees.GitError: the worktree could not be made (the task must not run in the main checkout).
    """
    store = ProjectStore.over(pool)
    source = await store.worktree_source(task_id)
    if source is None:
        return None
    if source.continues_task_id is not None and source.start_commit is None:
        raise worktrees.GitError(f"task {source.continues_task_id} has no recorded commit to continue from")
    start = (source.start_commit, source.start_base_branch) if source.start_commit else None
    wt = await worktrees.create(Path(source.workdir), task_id, root, source.name, start)
    await store.set_task_worktree(task_id, wt.path, wt.branch, wt.base_branch, wt.base_commit)
    await writer.put(NewEvent("task.worktree_created", {
        "path": str(wt.path), "branch": wt.branch, "base_branch": wt.base_branch, "base_commit": wt.base_commit},
        task_id=task_id, project_id=source.project_id))
    return wt.path


# A project thread's turn carries this much about its project, at most (it is a prompt, not a report).
TURN_CONTEXT_CHARS = 3_000


async def turn_context(pool: AsyncConnectionPool, project: dict[str, Any]) -> str:
    """What an orchestrator turn of a project thread is told about its project: slug, workdir and a
    bounded summary of the plan's state (get_project_state, and the titles of the tasks not started)."""
    state = await read_surface.get_project_state(pool, project["id"]) or {}
    titles = {ref: title for ref, title, _ in read_surface.plan_tasks(project.get("plan"))}
    counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in (state.get("counts") or {}).items())
    lines = [f"[project {project['name']} · project_id {project['id']} · workdir {project['workdir']}]",
             f"Plan: {state.get('plan_tasks', 0)} tasks ({counts or 'no runs yet'})."]
    for bucket in ("done", "in_flight", "failed", "blocked"):
        if state.get(bucket):
            lines.append(f"{bucket.replace('_', ' ').capitalize()}: {', '.join(state[bucket])}")
    waiting = [f"{ref} {titles.get(ref, '')}".strip() for ref in state.get("not_started", [])]
    if waiting:
        lines.append("Not started: " + "; ".join(waiting))
    lines.append("Dispatch a plan task with mcp__harness__dispatch_worker(brief=..., plan_ref=\"T-…\"): the "
                 "project is this thread's by default; each worker gets its own git worktree and branch, "
                 "and the user reviews and merges its changes.")
    text = "\n".join(lines)
    if len(text) > TURN_CONTEXT_CHARS:
        text = text[:TURN_CONTEXT_CHARS] + " … (cut; see get_project_state)"
    return text


async def plan_task_title(pool: AsyncConnectionPool, project_id: uuid.UUID, plan_ref: str) -> str | None:
    """The plan task's title, for a worker's brief; None when the project has no plan to check against.

    Raises:
        Refused: the project has a plan and `plan_ref` is not one of its tasks.
    """
    tasks = read_surface.plan_tasks(await ProjectStore.over(pool).plan(project_id))
    if not tasks:
        return None
    for ref, title, _ in tasks:
        if ref == plan_ref:
            return title
    raise Refused(f"plan_ref {plan_ref!r} is not a task of the project's plan "
                  f"({', '.join(ref for ref, _, _ in tasks[:20])})")
