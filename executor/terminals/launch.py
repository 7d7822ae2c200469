"""How a terminal session's `claude` is started: the user's arguments, a conversation id known before it starts,
the harness MCP, the permission hook, and the user's environment (pure, but for finding the conversation
`--continue` means)."""

from __future__ import annotations

import json
import shlex
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from executor.terminals.follow import conversation_file
from shared import terminal_hook, threads

# the hook's own timeout: a permission prompt may wait on the phone as long as the terminal's dialog would
HOOK_TIMEOUT_S = 86_400
_NAMING = ("--resume", "-r", "--session-id")
_CONTINUE = ("--continue", "-c")


@dataclass(frozen=True)
class Plan:
    session_id: str  # the conversation the session speaks in
    user_args: list[str]  # as the user gave them
    args: list[str]  # what the CLI is given of them (with the conversation named)
    config_dir: Path


def config_dir(env: dict[str, str]) -> Path:
    return Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else Path(env.get("HOME", "~")) / ".claude"


def _named(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        for flag in _NAMING:
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def _latest(config: Path, cwd: str) -> str | None:
    folder = conversation_file(config, cwd, "x").parent
    files = sorted(folder.glob("*.jsonl"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    return files[-1].stem if files else None


def plan(argv: list[str], cwd: str, env: dict[str, str]) -> Plan | str:
    """The session's conversation and arguments, or why it cannot start."""
    if any(a in ("-p", "--print") for a in argv):
        return "-p runs without a terminal: run `claude -p` directly, or send the message from the page"
    config = config_dir(env)
    named = _named(argv)
    if named is not None:
        try:
            return Plan(str(uuid.UUID(named)), argv, argv, config)
        except ValueError:
            return f"{named!r} is not a conversation id (a UUID)"
    if any(a in _CONTINUE for a in argv):  # the directory's latest conversation, named (so it is known here)
        latest = _latest(config, cwd)
        if latest is None:
            return f"no conversation to continue in {cwd}"
        rest = [a for a in argv if a not in _CONTINUE]
        return Plan(latest, argv, [*rest, "--resume", latest], config)
    session_id = str(uuid.uuid4())
    return Plan(session_id, argv, [*argv, "--session-id", session_id], config)


def hook_command(python: str = "") -> str:
    """The permission hook: shared/terminal_hook.py run by its path (self-contained), isolated from the session's
    environment's Python settings."""
    return f"{shlex.quote(python or sys.executable)} -I -S {shlex.quote(terminal_hook.__file__)}"


def command(claude_bin: str, p: Plan, mcp_config: Path | None, hook: str) -> list[str]:
    settings = {"hooks": {"PermissionRequest": [{"matcher": "*", "hooks": [
        {"type": "command", "command": hook, "timeout": HOOK_TIMEOUT_S}]}]}}
    cmd = [claude_bin, *p.args, "--settings", json.dumps(settings)]
    if mcp_config is not None:
        cmd.append(f"--mcp-config={mcp_config}")  # the "=" form: the flag is variadic
    return cmd


def environment(env: dict[str, str], socket: Path, thread_id: uuid.UUID, token: str) -> dict[str, str]:
    """The user's environment, less the CLI's own auto-update (observed: a fresh interactive session ran
    `npm install --global` of the newest CLI), plus where the permission hook asks."""
    return {**env, "DISABLE_AUTOUPDATER": "1", "PETAL_TERMINAL_SOCKET": str(socket),
            "PETAL_TERMINAL_ID": str(thread_id), "PETAL_TERMINAL_TOKEN": token}


def resume_command(cwd: str, p: Plan, cli: str) -> str:
    return threads.resume_command(cwd, str(p.config_dir), p.session_id, cli)
