"""A terminal session in the sandbox a thread's turn gets (`petal-dispatch claude --sandbox`).

The same sandbox as any spawn (executor/run/isolation.py): its gateway (the only ways out: the harness MCP, the
model's API, the operator's allowlist), the CLI's config seen as a spawn sees it (the login read-only, a private
copy of its state, only its own conversation), writes only in the session's directory. Two things are the
session's own: the permission hook reaches the executor through a socket of the session's own in the gateway's
directory, which answers the hook and nothing else (never the terminal socket, which takes keys); and the hook is
a copy of shared/terminal_hook.py run by the system's Python (neither the package nor its virtual
environment is in sight inside).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from executor.run import substrate
from executor.run.isolation import Isolation
from executor.sandbox import bwrap, cliconfig
from executor.sandbox.gateway import Gateway
from shared import terminal_hook

HOOK_SOCKET = "terminal-hook.sock"
HOOK_SCRIPT = "terminal_hook.py"
SYSTEM_PYTHON = Path("/usr/bin/python3")

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
# Connections the hook socket serves at once. The CLI runs its hook for one dialog at a time; a process in the
# sandbox can connect too, and each connection held open is a descriptor of the executor's.
HOOK_CONNECTIONS = 4


def limited(serve: Serve, most: int = HOOK_CONNECTIONS) -> Serve:
    """`serve`, for at most `most` connections at once: one more is closed as it comes."""
    open_now = 0

    async def serve_limited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now
        if open_now >= most:
            writer.close()
            return
        open_now += 1
        try:
            await serve(reader, writer)
        finally:
            open_now -= 1

    return serve_limited


@dataclasses.dataclass
class Boxed:
    isolation: Isolation
    sub: substrate.SubstrateConfig  # the user's environment and config directory, as the sandbox sees them
    gateway: Gateway
    hooks: asyncio.AbstractServer
    task_id: uuid.UUID
    cwd: Path
    session_id: str

    @classmethod
    async def open(cls, isolation: Isolation, base: substrate.SubstrateConfig, env: dict[str, str],
                   task_id: uuid.UUID, cwd: str, session_id: str, serve_hook: Serve) -> Boxed:
        sub = dataclasses.replace(base, base_env=env, config_dir=None)
        gateway = await isolation.open_gateway(task_id, None)
        try:
            shutil.copyfile(terminal_hook.__file__, gateway.directory / HOOK_SCRIPT)
            hooks = await asyncio.start_unix_server(limited(serve_hook), path=str(gateway.directory / HOOK_SOCKET))
        except BaseException:
            await gateway.close()
            raise
        return cls(isolation, sub, gateway, hooks, task_id, Path(cwd), session_id)

    @staticmethod
    def hook_command() -> str:
        return f"{SYSTEM_PYTHON} -I -S {bwrap.SOCKETS_INSIDE}/{HOOK_SCRIPT}"

    @staticmethod
    def hook_socket() -> Path:
        return Path(bwrap.SOCKETS_INSIDE) / HOOK_SOCKET

    def conversation(self) -> Path:
        """Where the sandboxed CLI's conversation is written, seen from outside (its private directory)."""
        return cliconfig.spawn_sessions(substrate.config_home(self.sub), self.task_id.hex) / f"{self.session_id}.jsonl"

    def wrap(self, cmd: list[str], env: dict[str, str], mcp: Path | None) -> tuple[list[str], dict[str, str]]:
        return self.isolation.wrap(self.gateway, self.cwd, mcp, cmd, env, self.task_id, self.session_id,
                                   substrate_config=self.sub)

    async def close(self) -> None:
        """After the CLI's exit: its ways out closed, its conversation kept where `--resume` finds it."""
        self.hooks.close()
        await self.gateway.close()
        await asyncio.to_thread(self.isolation.keep_session, self.cwd, self.session_id, self.task_id,
                                substrate_config=self.sub)
        await asyncio.to_thread(self.isolation.drop_cgroup, self.task_id)
