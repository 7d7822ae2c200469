"""Warm turns as a way to a task's process (the pool that keeps them: warm_pool.py): started for a thread's next
turn before its message (`WarmStarter`, the pool's), handed to the turn when it was started exactly as the turn
would be spawned and its conversation has not moved on since (`WarmWay`, the spawner's)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from executor.journal.writer import JournalWriter
from executor.run import process, substrate
from executor.run.credentials import Credentials
from executor.run.spawn.launch import Launcher
from executor.run.spawn.warm_pool import Warm, WarmPool
from executor.run.spawn.way import Plan, Started
from executor.run.task_rows import ClaimedTask, RoleProfile, Template
from shared import logs
from shared.models import NewEvent

log = logs.get(__name__)


class WarmStarter:
    """Making and ending warm processes, for the pool."""

    def __init__(self, launcher: Launcher, credentials: Credentials, profile: Callable[[str], Awaitable[RoleProfile]],
                 writer: JournalWriter, own: substrate.SubstrateConfig, default_workdir: Path):
        self.launcher = launcher
        self.credentials = credentials
        self.profile = profile  # a role's profile (TaskStore.role_profile)
        self.writer = writer
        self.own = own  # the executor's own CLI config: a warm process runs in it
        self.default_workdir = default_workdir

    async def start(self, template: Template) -> Warm | None:
        """A thread's next turn's process, started now and left waiting on stdin (None if it cannot be)."""
        session = str(template.session_id)
        transcript = await asyncio.to_thread(substrate.session_state, self.own, session)
        workdir = Path(template.workdir or self.default_workdir)
        if transcript is None or not workdir.is_dir():
            return None  # no conversation to resume yet (a first turn spawns cold), or nowhere to run
        profile = await self.profile(template.role)
        spawn_id = uuid.uuid4()
        written = self.credentials.write(f"mcp-warm-{spawn_id}.json") if profile.use_mcp else None
        mcp_path, digest = written if written is not None else (None, None)
        spec = substrate.SpawnSpec(
            role=template.role, prompt="", session_uuid=session, resume=True,
            allowed_tools=tuple(template.allowed_tools if template.allowed_tools is not None
                                else profile.allowed_tools),
            system_prompt=profile.system_prompt, mcp_config=mcp_path, stream_input=True)
        cmd = substrate.build_command(self.own, spec)
        try:
            proc, gateway = await self.launcher.launch(spawn_id, template.project_id, workdir, spec, cmd, self.own)
        except OSError as exc:
            log.warning("warm_turn_not_started", thread=session, error=str(exc))
            return None
        log.info("warm_turn_started", thread=session, pid=proc.pid, spawn_id=str(spawn_id))
        await self.writer.put(NewEvent("warm.started", {"pid": proc.pid, "spawn_id": str(spawn_id)},
                                       session_id=template.session_id, project_id=template.project_id))
        return Warm(session_id=template.session_id, spawn_id=spawn_id, proc=proc, spec=spec, cmd=cmd,
                    workdir=workdir, project_id=template.project_id, mcp_config=mcp_path, digest=digest,
                    gateway=gateway, transcript=transcript)

    async def end(self, w: Warm, reason: str) -> None:
        """A warm process no turn will take: its process group ended (SIGTERM, the grace, SIGKILL), its
        config (and the credential in it, never bound to a task) deleted, its sandbox closed."""
        rss = await asyncio.to_thread(process.tree_rss, w.proc.pid) if w.alive else None
        if w.alive:
            self.launcher.terminate(w.proc, w.gateway)
            await self.launcher.ended_or_killed(w.proc)
        await self.launcher.release(w.mcp_config, w.gateway, w.spawn_id)
        log.info("warm_turn_retired", thread=str(w.session_id), reason=reason, rss_bytes=rss)
        await self.writer.put(NewEvent("warm.retired", {
            "pid": w.proc.pid, "spawn_id": str(w.spawn_id), "reason": reason, "rss_bytes": rss,
            "age_s": round(time.monotonic() - w.started, 3), "exit_code": w.proc.returncode},
            session_id=w.session_id, project_id=w.project_id))


class WarmWay:
    """The thread's warm process as its turn's (spawner.Way)."""

    unused = "warm_turn_unused"

    def __init__(self, pool: WarmPool, own: substrate.SubstrateConfig):
        self.pool = pool
        self.own = own

    async def take(self, task: ClaimedTask) -> Warm | None:
        return self.pool.take(task.session_id)

    async def misfit(self, warm: Warm, task: ClaimedTask, plan: Plan) -> str | None:
        """Not started exactly as this turn would be spawned, or its conversation moved on since (it read it at
        its start)."""
        spec = plan.spec
        expected = substrate.build_command(self.own, substrate.SpawnSpec(
            role=task.role, prompt="", session_uuid=str(task.session_id), resume=True,
            allowed_tools=spec.allowed_tools, system_prompt=spec.system_prompt, mcp_config=warm.mcp_config,
            stream_input=True, extra_args=spec.extra_args))
        unchanged = await asyncio.to_thread(substrate.conversation_unchanged, self.own, str(task.session_id),
                                            warm.transcript)
        return ("spawn_differs" if expected != warm.cmd or plan.workdir != warm.workdir
                or task.project_id != warm.project_id else
                "conversation_moved_on" if not unchanged else None)

    def hand_over(self, warm: Warm, plan: Plan) -> Started:
        """It runs already: the turn's message goes on its stdin as one stream-json line."""
        return Started(warm.proc, warm.cmd, warm.gateway,
                       replace(plan.spec, mcp_config=warm.mcp_config, stream_input=True),
                       spawn_id=warm.spawn_id, way="warm", since=warm.started)

    def release(self, warm: Warm, reason: str) -> None:
        self.pool.give_back(warm, reason)
