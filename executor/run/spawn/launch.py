"""Starting the CLI, the one way a process of any spawn comes to be (cold, warm or ahead), and giving back what a
start left that no run took."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

from executor.run import process, substrate
from executor.run.isolation import Isolation
from executor.sandbox.gateway import Gateway
from shared import lifeline


class Launcher:
    def __init__(self, isolation: Isolation | None, stop_grace_s: float):
        self.isolation = isolation  # None: unsandboxed (the operator's explicit PETAL_SANDBOX=off)
        self.stop_grace_s = stop_grace_s

    async def launch(self, spawn_id: uuid.UUID, project_id: uuid.UUID | None, workdir: Path,
                     spec: substrate.SpawnSpec, cmd: list[str], sub: substrate.SubstrateConfig,
                     argv_fd: int | None = None) -> tuple[asyncio.subprocess.Process, Gateway | None]:
        """Start the CLI (inside its sandbox, unless the operator turned that off) with the CLI config `sub` (an
        adopted conversation's own); OSError if it cannot be, with nothing of it left behind (its gateway, its
        MCP config and the credential the config holds). With `argv_fd` the sandbox starts ahead of the CLI,
        whose command line it reads from that descriptor (`cmd` names only its program)."""
        env = substrate.build_env(sub, str(spawn_id))
        gateway: Gateway | None = None
        try:
            argv = cmd
            if self.isolation is not None:
                gateway = await self.isolation.open_gateway(spawn_id, project_id)
                # a spare's spec names no conversation: it is linked in when a thread takes it
                argv, env = self.isolation.wrap(gateway, workdir, spec.mcp_config, cmd, env, spawn_id,
                                                spec.session_uuid or None,
                                                substrate_config=sub, fork_from=spec.fork_from, argv_fd=argv_fd)
            # if the executor dies, its workers die with it; SIGTERM, not SIGKILL: the CLI then ends its
            # Bash-tool children itself (they run in their own session, out of reach of a group signal)
            argv, preexec = lifeline.spawn_dying_with_parent(argv, signal.SIGTERM, path=env.get("PATH"))
            proc = await asyncio.create_subprocess_exec(
                *argv,
                # the prompt goes on stdin, never in argv (another process's /proc/<pid>/cmdline)
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=workdir,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,
                pass_fds=(argv_fd,) if argv_fd is not None else (),
            )
        except OSError:
            if gateway is not None and self.isolation is not None:
                await gateway.close()
                self.isolation.forget_spawn(spawn_id)
            if spec.mcp_config is not None:
                spec.mcp_config.unlink(missing_ok=True)
            raise
        return proc, gateway

    def terminate(self, proc: asyncio.subprocess.Process, gateway: Gateway | None) -> bool:
        """SIGTERM to what runs (inside its sandbox: never bubblewrap itself, whose death would SIGKILL the
        rest); False if it is gone."""
        if gateway is not None and self.isolation is not None:
            return process.signal_inside(proc.pid, signal.SIGTERM, self.isolation.policy.bwrap)
        return process.signal_group(proc.pid, signal.SIGTERM)

    async def ended_or_killed(self, proc: asyncio.subprocess.Process) -> None:
        """Until a process told to end has, or the grace is over and its group is killed."""
        try:
            await asyncio.wait_for(proc.wait(), self.stop_grace_s)
        except TimeoutError:
            process.signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def reap_unstarted(self, proc: asyncio.subprocess.Process, gateway: Gateway | None,
                             spawn_id: uuid.UUID) -> None:
        await proc.wait()
        await self.release(None, gateway, spawn_id)

    async def release(self, mcp_config: Path | None, gateway: Gateway | None, spawn_id: uuid.UUID) -> None:
        """What a spawn no run took leaves: its config (and the credential in it), its sandbox's gateway and
        private conversation directory."""
        if mcp_config is not None:
            mcp_config.unlink(missing_ok=True)
        if gateway is not None and self.isolation is not None:
            await gateway.close()
            await asyncio.to_thread(self.isolation.drop_cgroup, spawn_id)
            self.isolation.forget_spawn(spawn_id)
