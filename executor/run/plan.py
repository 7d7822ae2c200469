"""What a claimed task's spawn will be (`spawn.way.Plan`: its command's spec, where it runs, in which CLI config),
or why it is not spawned: its worktree, its conversation, its budget and the files the user sent, made ready."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from executor.journal.writer import JournalWriter
from executor.projects import service as projects
from executor.projects import worktrees
from executor.run import substrate, user_input
from executor.run.spawn.way import Plan
from executor.run.task_rows import ClaimedTask
from executor.run.task_store import TaskStore

# a routine run's process is not started with less than this left of the run's USD (it could not finish a call)
MIN_GRANT_USD = 0.01


class Unspawned(NamedTuple):
    """Why a task gets no process: its final status and reason."""

    status: str
    reason: str


class Conversation(NamedTuple):
    resume: bool
    substrate: substrate.SubstrateConfig
    cli_session: str | None = None
    fork_from: str | None = None
    workdir: Path | None = None


class Planner:
    def __init__(self, store: TaskStore, writer: JournalWriter, own: substrate.SubstrateConfig,
                 default_workdir: Path, worktree_root: Path):
        self.store = store
        self.writer = writer
        self.own = own  # the executor's own CLI config
        self.default_workdir = default_workdir
        self.worktree_root = worktree_root

    async def plan(self, task: ClaimedTask) -> Plan | Unspawned:
        """The task's spawn, or why it is not spawned. What it needs is asked for at once, not one round trip
        after another: each is on the way to the process's first line."""
        isolated, profile, conv = await asyncio.gather(
            self._worktree(task), self.store.role_profile(task.role), self._conversation(task))
        if isinstance(isolated, str):
            return Unspawned("failed", isolated)
        workdir = isolated or conv.workdir or Path(task.workdir or self.default_workdir)
        if not workdir.is_dir():
            return Unspawned("skipped", f"working directory {workdir} does not exist")
        # A task of a conversation that goes on (a thread's turn) reuses its session; any other task is
        # a conversation of its own.
        session_id = task.session_id or uuid.uuid4()
        budget = await self._budget(task)
        if isinstance(budget, Unspawned):
            return budget
        content = await self._attachments(task, isolated)
        if isinstance(content, str):
            return Unspawned("failed", content)
        spec = substrate.SpawnSpec(
            role=task.role,
            prompt=task.brief,
            content=content,
            session_uuid=conv.cli_session or str(session_id),
            resume=conv.resume,
            fork_from=conv.fork_from,
            allowed_tools=tuple(task.allowed_tools if task.allowed_tools is not None else profile.allowed_tools),
            system_prompt=profile.system_prompt,
            json_schema=task.json_schema,
            extra_args=budget,
        )
        return Plan(spec, workdir, session_id, conv.substrate, profile.use_mcp)

    async def _budget(self, task: ClaimedTask) -> tuple[str, ...] | Unspawned:
        """A routine run's `--max-budget-usd`: what is left of the run's USD, not a full run's each."""
        if not task.max_budget_usd:
            return ()
        grant = await self.store.grant_budget(task.id)
        usd = task.max_budget_usd if grant is None else grant["granted"]
        if grant is not None and usd < MIN_GRANT_USD:
            return Unspawned("skipped", f"budget: the run spent {grant['spent']:.2f} of its {grant['cap']:.2f} USD")
        return ("--max-budget-usd", f"{usd:.4f}")

    async def _conversation(self, task: ClaimedTask) -> Conversation:
        """The CLI conversation a task speaks in: a thread's own, or the one an adopted thread continues (in
        its own directory and config directory; forked on the first turn when a live process held it)."""
        if task.session_id is None:
            return Conversation(False, self.own)
        cli = await self.store.session_cli(task.session_id)
        sub, workdir, cli_session, fork_from = self.own, None, str(task.session_id), None
        if cli is not None and cli["adopted_session_id"]:
            if cli["cli_config_dir"]:
                sub = replace(self.own, config_dir=Path(cli["cli_config_dir"]))
            workdir = Path(cli["cli_workdir"]) if cli["cli_workdir"] else None
            cli_session = cli["cli_session_id"] or cli_session
            fork_from = cli["cli_fork_from"]
        # a thread's turn resumes its conversation only if the CLI stored it: a first turn that failed before
        # that starts it again (a fork: forks it again)
        resume = await asyncio.to_thread(substrate.session_stored, sub, cli_session)
        return Conversation(resume, sub, cli_session, None if resume else fork_from, workdir)

    async def _attachments(self, task: ClaimedTask, worktree: Path | None) -> tuple[dict[str, Any], ...] | str:
        """The files the user sent, handed over: written into a project worker's worktree (its brief names
        them), else content blocks of its user message; or why they could not be placed."""
        if not task.attachment_ids:
            return ()
        files = await self.store.attachments(task.attachment_ids)
        if worktree is not None:
            try:
                await asyncio.to_thread(user_input.place_in_worktree, worktree, files)
            except OSError as exc:
                return f"could not place the files the user sent in the worktree: {exc}"
            return ()
        # up to 20 MiB to base64-encode: off the event loop, which reads every running task's output
        return tuple(await asyncio.to_thread(user_input.content_blocks, task.brief, files))

    async def _worktree(self, task: ClaimedTask) -> Path | str | None:
        """A worker of a project runs in a git worktree of its own, never in the project's checkout: its path,
        None for any other task, or why it could not be made."""
        try:
            return await projects.prepare_worktree(self.store.pool, self.writer, task.id, self.worktree_root)
        except (worktrees.GitError, OSError) as exc:
            return f"could not make the worker's git worktree: {exc}"
