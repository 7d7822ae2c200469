"""Thread identity shared by both services."""

import uuid

# A chat message without a thread goes to this one; the executor creates it on first use.
DEFAULT_THREAD_ID = uuid.uuid5(uuid.NAMESPACE_URL, "petal-dispatch:default-thread")


def resume_command(workdir: str, config_dir: str | None, session_id: str) -> str:
    """The shell command that continues a thread's CLI conversation in a terminal: in its directory, with
    its config directory when that is not the default one."""
    import shlex

    env = f"CLAUDE_CONFIG_DIR={shlex.quote(config_dir)} " if config_dir else ""
    return f"cd {shlex.quote(workdir)} && {env}claude --resume {shlex.quote(session_id)}"
