"""A task's process started now, for it: its credential granted, its command line built, the CLI launched."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from executor.run import substrate
from executor.run.credentials import Credentials
from executor.run.spawn.launch import Launcher
from executor.run.spawn.way import Beside, Plan, Started
from executor.run.task_rows import ClaimedTask
from shared import aio


class Cold:
    def __init__(self, launcher: Launcher, credentials: Credentials):
        self.launcher = launcher
        self.credentials = credentials

    async def acquire(self, task: ClaimedTask, plan: Plan, beside: Beside) -> Started | str:
        """The task's process, or why it could not be started (nothing of it is left then)."""
        mcp_path, _ = await asyncio.gather(
            self.credentials.grant(task.id, plan.session_id) if plan.use_mcp else aio.resolved(None), beside())
        spec = replace(plan.spec, mcp_config=mcp_path)
        cmd = substrate.build_command(plan.substrate, spec)
        try:
            proc, gateway = await self.launcher.launch(task.id, task.project_id, plan.workdir, spec, cmd,
                                                       plan.substrate)
        except OSError as exc:
            return f"could not start {cmd[0]}: {exc}"
        return Started(proc, cmd, gateway, spec)
