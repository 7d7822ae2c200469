"""Thread identity shared by both services."""

import uuid

# A chat message without a thread goes to this one; the executor creates it on first use.
DEFAULT_THREAD_ID = uuid.uuid5(uuid.NAMESPACE_URL, "petal-dispatch:default-thread")


# The hand-back runs unsandboxed, as the user: nothing a worker could have written may configure it. Only the
# user's own settings (not the tree's .claude/settings.json hooks nor .claude/settings.local.json), and no MCP server
# but those of petal's own config, which names none (not the tree's .mcp.json, nor a user- or local-scope one in
# .claude.json). Observed on 2.1.328: docs/claude-cli.md "What the CLI reads from its config and the tree". And the
# permission mode named: `--resume` restores the mode a `permission-mode` line of the conversation's file names (a
# spawn can append one to its own: acceptEdits, auto), and a mode on the command line wins over it.
HANDBACK_FLAGS = ("--setting-sources", "user", "--strict-mcp-config", '--mcp-config={"mcpServers":{}}',
                  "--permission-mode", "manual")


def resume_command(workdir: str, config_dir: str | None, session_id: str, cli: str = "claude") -> str:
    """The shell command that continues a thread's CLI conversation in a terminal: in its directory, with
    its config directory when that is not the default one, the CLI the executor runs (`claude`, or its path when a
    terminal's `claude` would be another or none), and without settings or MCP servers from the tree or the CLI's
    state file (HANDBACK_FLAGS)."""
    import shlex

    env = f"CLAUDE_CONFIG_DIR={shlex.quote(config_dir)} " if config_dir else ""
    return (f"cd {shlex.quote(workdir)} && {env}{shlex.quote(cli)} --resume {shlex.quote(session_id)} "
            f"{shlex.join(HANDBACK_FLAGS)}")
