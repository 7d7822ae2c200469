"""Sandboxes started ahead as a way to a task's process (the pool that keeps them: ahead_pool.py): a thread's next
turn's sandbox started before its claim, its launcher waiting for the command line (`AheadStarter`, the pool's),
handed to the turn when the turn spawns as the sandbox was started for and its conversation has not moved on since
it was linked (`AheadWay`, the spawner's): the command line built as for a cold spawn goes to its launcher then."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from executor.run import process, substrate
from executor.run.credentials import Credentials
from executor.run.isolation import Isolation
from executor.run.spawn.ahead_pool import Ahead, AheadPool, SpareStale
from executor.run.spawn.launch import Launcher
from executor.run.spawn.way import Plan, Started
from executor.run.task_rows import ClaimedTask, RoleProfile
from executor.sandbox.gateway import Gateway
from shared import aio, logs

log = logs.get(__name__)


class AheadStarter:
    """Starting, handing over and ending sandboxes ahead, for the pool (only sandboxed spawns start ahead)."""

    def __init__(self, launcher: Launcher, isolation: Isolation | None, credentials: Credentials,
                 profile: Callable[[str], Awaitable[RoleProfile]], own: substrate.SubstrateConfig,
                 default_workdir: Path):
        self.launcher = launcher
        self.isolation = isolation  # None: unsandboxed, and none is started ahead
        self.credentials = credentials
        self.profile = profile  # a role's profile (TaskStore.role_profile)
        self.own = own  # the executor's own CLI config: a sandbox ahead is for a spawn in it
        self.default_workdir = default_workdir

    async def start(self, session_id: uuid.UUID | None, role: str) -> Ahead | None:
        """A thread's next turn's sandbox (`session_id` None: a spare, for no thread yet), started now with its
        launcher waiting for the command (None when the turn will not spawn as a plain cold spawn here:
        unsandboxed, no stored conversation)."""
        if self.isolation is None:
            return None
        # each wait here is on the way to the sandbox's start, which must come before the turn's claim to pay
        profile, transcript = await asyncio.gather(
            self.profile(role),
            asyncio.to_thread(substrate.session_state, self.own, str(session_id)) if session_id is not None
            else aio.resolved(None))
        if transcript is None and session_id is not None:
            return None  # a first turn: it starts its conversation (cold)
        workdir = self.default_workdir
        spawn_id = uuid.uuid4()
        # a spare's config files as before its mounts are made: one replaced later is found when a thread comes
        config_state = self.isolation.config_state() if session_id is None else ()
        written = self.credentials.write(f"mcp-ahead-{spawn_id}.json") if profile.use_mcp else None
        mcp_path, digest = written if written is not None else (None, None)
        spec = substrate.SpawnSpec(role=role, prompt="", session_uuid=str(session_id) if session_id else "",
                                   resume=True, mcp_config=mcp_path)
        program = substrate.build_command(self.own, spec)[0]
        read_end, write_end = os.pipe()
        launched: tuple[asyncio.subprocess.Process, Gateway | None] | None = None
        try:
            try:
                launched = await self.launcher.launch(spawn_id, None, workdir, spec, [program], self.own,
                                                      argv_fd=read_end)
            finally:
                os.close(read_end)
            proc, gateway = launched
            assert gateway is not None  # sandboxed
            command, _ = await asyncio.get_running_loop().connect_write_pipe(
                asyncio.Protocol, os.fdopen(write_end, "wb", buffering=0))
        except BaseException as exc:
            # nothing of it is left: its process (an end of file for its launcher, then a kill), its gateway,
            # its config (the launcher removes what it made itself when the start fails)
            with contextlib.suppress(OSError):
                os.close(write_end)
            if launched is not None:
                process.signal_group(launched[0].pid, signal.SIGKILL)
                await asyncio.shield(self.launcher.reap_unstarted(launched[0], launched[1], spawn_id))
            if mcp_path is not None:
                mcp_path.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                log.warning("ahead_not_started", thread=str(session_id), error=str(exc))
                return None
            raise
        return Ahead(session_id=session_id, role=role, spawn_id=spawn_id, proc=proc, command=command,
                     program=program, workdir=workdir, mcp_config=mcp_path, digest=digest, gateway=gateway,
                     transcript=transcript, spare=session_id is None, config_state=config_state)

    async def link(self, spare: Ahead, session_id: uuid.UUID) -> Ahead | None:
        """A spare sandbox as the thread's: its conversation linked in (None when it cannot go into a spare).
        Its state is read before the link: a conversation replaced in between is found moved on when taken.
        SpareStale: a config file it shows was replaced since it started."""
        isolation = self.isolation
        assert isolation is not None  # spares are sandboxes
        session = str(session_id)

        def link() -> tuple[int, int] | None:
            if isolation.config_state() != spare.config_state:
                raise SpareStale(f"a CLI config file was replaced since spare {spare.spawn_id} started")
            state = substrate.session_state(self.own, session)
            return state if state is not None and isolation.link_conversation(
                spare.workdir, session, spare.spawn_id) else None

        transcript = await asyncio.to_thread(link)
        return None if transcript is None else replace(spare, session_id=session_id, transcript=transcript)

    async def end(self, ahead: Ahead, reason: str) -> None:
        """A sandbox no turn will take: its launcher told there is no command (an end of file), so the sandbox
        ends; ended by signal after the grace; its config (and the credential in it, never bound) deleted."""
        ahead.command.close()
        await self.launcher.ended_or_killed(ahead.proc)
        await self.launcher.release(ahead.mcp_config, ahead.gateway, ahead.spawn_id)
        log.info("ahead_retired", thread=str(ahead.session_id), reason=reason, spawn_id=str(ahead.spawn_id))


class AheadWay:
    """The thread's sandbox started ahead as its turn's (spawner.Way)."""

    unused = "ahead_unused"

    def __init__(self, pool: AheadPool, own: substrate.SubstrateConfig, mcp_served: bool):
        self.pool = pool
        self.own = own
        self.mcp_served = mcp_served  # whether the executor serves the harness (a spawn's MCP config names it)

    async def take(self, task: ClaimedTask) -> Ahead | None:
        return await self.pool.take(task.session_id)

    async def misfit(self, ahead: Ahead, task: ClaimedTask, plan: Plan) -> str | None:
        """Not started for a spawn such as this turn's, or its conversation moved on since it was linked."""
        transcript = await asyncio.to_thread(substrate.session_state, self.own, str(task.session_id))
        # a spawn has an MCP config when its role uses the harness and the executor serves it
        mcp_wanted = plan.use_mcp and self.mcp_served
        return ("spawn_differs" if plan.workdir != ahead.workdir or task.project_id is not None
                or plan.spec.fork_from or task.role != ahead.role or mcp_wanted != (ahead.mcp_config is not None)
                else "conversation_moved_on" if transcript != ahead.transcript else None)

    def hand_over(self, ahead: Ahead, plan: Plan) -> Started:
        """The CLI's command line, built as for a cold spawn, to the sandbox's launcher: the CLI starts at once."""
        spec = replace(plan.spec, mcp_config=ahead.mcp_config)
        cmd = substrate.build_command(plan.substrate, spec)
        ahead.give(cmd)
        return Started(ahead.proc, cmd, ahead.gateway, spec, spawn_id=ahead.spawn_id, way="ahead",
                       since=ahead.started, shown={"spare": ahead.spare})

    def release(self, ahead: Ahead, reason: str) -> None:
        self.pool.give_back(ahead, reason)
