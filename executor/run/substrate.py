"""What the `claude` CLI is given: its command line, environment and MCP config, and where it keeps a
conversation (what it prints, and the status its exit makes, are executor/run/stream.py's).

Ground truth is what the CLI was observed to do (docs/claude-cli.md and the tests against the real binary).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor import gates
from executor.run import user_input
from shared import lifeline, threads

# Environment that keeps the CLI from calling home; the executor's own environment passes through.
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
}
# Set on every child so the supervisor can find a task's processes, orphans included, by environment.
TASK_ENV_VAR = "PETAL_TASK_ID"
ROLE_MARKER = "[petal-role: {role}]"
# The permission path (docs/claude-cli.md "Permission path"): an `ask` rule per gated tool sends every call of
# it to the harness MCP's tool, which decides — also the calls the CLI would auto-allow as read-only (`cat .env`)
# and pre-allowed ones (ask rules outrank allow rules, --allowedTools too, and acceptEdits). No hook: the
# CLI spawning one per call cost 9–22 ms p50, a failing one fails open, and a project's `disableAllHooks` turned
# it off. An ask rule has no transport to fail; the tool itself fails closed.
PERMISSION_TOOL = "mcp__harness__permission_prompt"
GATED_TOOLS = ("Bash", "Write", "Edit", "MultiEdit", "NotebookEdit")


def _read_rule(pattern: str) -> str:
    """The gate's fnmatch pattern of a secret path as a CLI `Read(...)` rule (gitignore style: `//` starts an
    absolute path, `**` spans directories; fnmatch's `*` spans them too)."""
    if not pattern.startswith("/"):
        pattern = "/**/" + pattern.removeprefix("*/")
    if pattern.endswith("/*"):
        pattern = pattern[:-1] + "**"
    return f"Read(/{pattern})"


# Reads are not asked for in general (every Read, Glob and Grep would cost a round trip), only reads of the
# paths the gate calls secret, wherever they are (observed on 2.1.328: `Read(//**/.env)` sends a Read of the
# tree's `.env`, of one outside it or under HOME to the tool, a project's `allow: ["Read"]` and the role's
# `--allowedTools Read` notwithstanding, and leaves other reads alone).
READ_ASK_RULES = tuple(dict.fromkeys(
    [_read_rule(name) for name in gates.SECRET_NAMES]
    + [_read_rule(f"{d}/*") for d in gates.SECRET_DIRS]
    + [_read_rule(path) for path in gates.SECRET_PATHS]))
# Per the CLI's settings schema, sandbox auto-allow passes Bash calls by everything but deny rules and
# command-specific ask rules: off, so a project's sandbox settings cannot open that door.
_ASK_RULES = [*GATED_TOOLS, *READ_ASK_RULES]



@dataclass(frozen=True)
class SubstrateConfig:
    claude_bin: str = "claude"
    # One config directory for every run: `--resume` needs the same one across turns.
    config_dir: Path | None = None
    # the CLI's environment (an API key among it): never in a log line
    base_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    # The CLI's own knobs; by default a dead API holds a turn silently for over ten minutes.
    max_retries: int | None = None
    api_timeout_ms: int | None = None
    byte_stream_idle_timeout_ms: int | None = None
    # appended to every command line (e.g. --model, --include-partial-messages)
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpawnSpec:
    role: str
    prompt: str
    session_uuid: str
    resume: bool = False
    allowed_tools: tuple[str, ...] = ()
    system_prompt: str = ""
    mcp_config: Path | None = None
    json_schema: dict[str, Any] | None = None
    extra_args: tuple[str, ...] = ()
    # the user message as content blocks (a turn with attachments): fed as stream-json input, not as text
    content: tuple[dict[str, Any], ...] = ()
    # a new conversation that starts as a copy of this one (`--fork-session`): an adopted thread's first turn
    # while a live process held the conversation
    fork_from: str | None = None
    # the message goes as one stream-json line whatever it holds: a warm turn's process is started before
    # its message exists (executor/run/spawn/warm_pool.py)
    stream_input: bool = False


def build_command(config: SubstrateConfig, spec: SpawnSpec) -> list[str]:
    cmd = [config.claude_bin, "-p", "--output-format", "stream-json", "--verbose"]
    # The operator's own flags come first: where one names a flag the harness sets below (a permission
    # mode, settings), the CLI takes the last, the harness's, so none weakens the gate.
    cmd += [*config.extra_args, *spec.extra_args]
    # Only the user's settings and the harness's own (--settings): a working directory's .claude/settings.json
    # is written by whoever worked there before (a worker in the directory an orchestrator's turns run in would
    # plant hooks that run in the next turn, with its credential).
    cmd += ["--setting-sources", "user"]
    # The harness chooses the conversation id so it is known before the process starts.
    if spec.resume:
        cmd += ["--resume", spec.session_uuid]
    elif spec.fork_from:
        # observed on 2.1.328: the fork takes the id given with --session-id (docs/claude-cli.md)
        cmd += ["--resume", spec.fork_from, "--fork-session", "--session-id", spec.session_uuid]
    else:
        cmd += ["--session-id", spec.session_uuid]
    cmd += ["--append-system-prompt", "\n\n".join(p for p in (ROLE_MARKER.format(role=spec.role), spec.system_prompt) if p)]
    if spec.mcp_config is not None:
        # --mcp-config is variadic: the "=" form keeps it from swallowing the next argument.
        cmd += [f"--mcp-config={spec.mcp_config}", "--strict-mcp-config"]
    allowed = spec.allowed_tools
    if spec.mcp_config is not None:
        # the harness is there to answer: every non-read-only call goes through its gate, and no
        # allowed-tools entry (a profile's or a dispatch's) pre-allows a way around it
        cmd += permission_args(deny_rules(config))
        allowed = tuple(t for t in allowed if t.split("(", 1)[0].strip() not in GATED_TOOLS)
    else:
        cmd += ["--settings", json.dumps({"permissions": {"deny": deny_rules(config)}})]
    if allowed:
        cmd += ["--allowedTools", ",".join(allowed)]
    if spec.json_schema is not None:
        # The CLI refuses a "$schema" naming Draft 2020-12 ("no schema with key or ref"); the keywords we
        # use mean the same in its default draft, and our own gate validates as 2020-12.
        cli_schema = {k: v for k, v in spec.json_schema.items() if k != "$schema"}
        cmd += ["--json-schema", json.dumps(cli_schema)]
    if spec.content or spec.stream_input:
        # images and documents travel only inside a user message of the stream-json input
        cmd += ["--input-format", "stream-json"]
    # The prompt is not on the command line (another process of the user reads /proc/<pid>/cmdline): `-p` with
    # no prompt argument reads it from stdin, which the runner writes and closes.
    return cmd


def stdin_input(spec: SpawnSpec) -> bytes:
    """What the runner writes on the CLI's stdin before closing it: the prompt as text, or, for a message
    with content blocks, that message as one stream-json line."""
    if spec.content or spec.stream_input:
        return user_input.stream_json_line(spec.content or ({"type": "text", "text": spec.prompt},))
    return spec.prompt.encode()


def permission_args(deny: list[str] | None = None) -> list[str]:
    """The flags that send every Bash/edit call to the harness's permission tool. The default mode: not
    bypassPermissions (which skips asking) nor dontAsk (which denies instead of asking)."""
    settings = {"permissions": {"ask": _ASK_RULES, "deny": deny or []},
                "sandbox": {"autoAllowBashIfSandboxed": False}}
    return ["--permission-prompt-tool", PERMISSION_TOOL, "--permission-mode", "default",
            "--settings", json.dumps(settings)]


def deny_rules(config: SubstrateConfig) -> list[str]:
    """What the CLI's own tools (Read, Grep, Glob, Edit, Write run inside the CLI, not in a shell) never touch,
    whatever the gate would say: the CLI's config directory (its login, other conversations, the settings every
    spawn obeys) and /proc (the CLI's own environment holds its API key). The sandbox hides the rest."""
    home = config_home(config).resolve()
    return [f"{tool}(/{path})" for path in (f"{home}/**", "/proc/**") for tool in ("Read", "Edit")]


def build_env(config: SubstrateConfig, task_id: str) -> dict[str, str]:
    env = lifeline.child_env(config.base_env)  # never the services' settings or database credentials
    env.update(QUIET_ENV)
    env[TASK_ENV_VAR] = task_id
    if config.config_dir is not None:
        env["CLAUDE_CONFIG_DIR"] = str(config.config_dir)
    knobs = {
        "CLAUDE_CODE_MAX_RETRIES": config.max_retries,
        "API_TIMEOUT_MS": config.api_timeout_ms,
        "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS": config.byte_stream_idle_timeout_ms,
    }
    env.update({k: str(v) for k, v in knobs.items() if v is not None})
    return env


def config_home(config: SubstrateConfig) -> Path:
    """The CLI's config directory: CLAUDE_CONFIG_DIR, else ~/.claude of the HOME it runs with."""
    if config.config_dir is not None:
        return Path(config.config_dir)
    if config.base_env.get("CLAUDE_CONFIG_DIR"):
        return Path(config.base_env["CLAUDE_CONFIG_DIR"])
    return Path(config.base_env.get("HOME") or Path.home()) / ".claude"


def state_file(config: SubstrateConfig) -> Path:
    """Where the CLI keeps its global state (`.claude.json`): in its config directory when CLAUDE_CONFIG_DIR is
    set, else in the HOME it runs with (observed on 2.1.328)."""
    if config.config_dir is not None or config.base_env.get("CLAUDE_CONFIG_DIR"):
        return config_home(config) / ".claude.json"
    return Path(config.base_env.get("HOME") or Path.home()) / ".claude.json"


def resume_command(config: SubstrateConfig, workdir: Path, session_uuid: str) -> str:
    """The shell command that continues a conversation in a terminal (CLAUDE_CONFIG_DIR only when it is not
    the service user's ~/.claude, which a terminal of that user reads anyway)."""
    home = config_home(config)
    default = Path(config.base_env.get("HOME") or Path.home()) / ".claude"
    return threads.resume_command(str(workdir), None if home == default else str(home), session_uuid,
                                  handback_cli(config))


def handback_cli(config: SubstrateConfig) -> str:
    """How the hand-back names the CLI: `claude` when that is the one a terminal of this user finds on PATH, else
    the executor's own by its path (the pinned install, when no `claude` is on PATH), so the command works as
    pasted."""
    ours = shutil.which(config.claude_bin, path=config.base_env.get("PATH"))
    on_path = shutil.which("claude", path=config.base_env.get("PATH"))
    if ours is None or (on_path is not None and Path(on_path).resolve() == Path(ours).resolve()):
        return "claude"
    return str(Path(ours).absolute())


def _stored(config: SubstrateConfig, session_uuid: str) -> Iterator[Path]:
    """Where the CLI keeps the conversation: `projects/<its working directory, mangled>/<uuid>.jsonl`."""
    return (config_home(config) / "projects").glob(f"*/{session_uuid}.jsonl")


def session_stored(config: SubstrateConfig, session_uuid: str) -> bool:
    """Whether the CLI keeps a transcript of this conversation, i.e. whether `--resume` can find it.

    The CLI stores it as projects/<cwd slug>/<id>.jsonl once it has taken the first prompt; a run refused
    before that (a whitespace-only prompt) or killed right after its init line stored nothing, and
    `--resume` of it fails with "No conversation found" while `--session-id` starts it afresh.
    """
    return any(_stored(config, session_uuid))


def session_state(config: SubstrateConfig, session_uuid: str) -> tuple[int, int] | None:
    """The stored conversation's (inode, size), None when there is none: a process started with `--resume`
    read it at its start (observed: docs/claude-cli.md "Warm turns"), so a warm one is usable only while this
    has not changed. The CLI touches the file's time when it resumes, so the time is no sign."""
    for path in _stored(config, session_uuid):
        try:
            st = path.stat()
        except OSError:
            continue
        return st.st_ino, st.st_size
    return None


# Lines the CLI appends to a stored conversation as the session's own metadata, again now and then (not a
# message of it): a process resuming it may write one before its input (observed: the permission mode, once
# a conversation had grown some turns long; docs/claude-cli.md "Warm turns").
SESSION_METADATA = frozenset({"mode", "atis-latch"})


def conversation_unchanged(config: SubstrateConfig, session_uuid: str, since: tuple[int, int] | None) -> bool:
    """Whether the stored conversation is what it was at `since` (its (inode, size) from `session_state`) but
    for session metadata lines appended after it: what a process that resumed it at `since` read of it is
    still the whole conversation."""
    for path in _stored(config, session_uuid):
        try:
            with path.open("rb") as f:
                st = os.fstat(f.fileno())
                if since is None or (st.st_ino, st.st_size) == since:
                    return since is not None
                if st.st_ino != since[0] or st.st_size < since[1]:
                    return False  # replaced or cut: not the conversation it read
                f.seek(since[1])
                added = f.read()
        except OSError:
            continue
        try:
            lines = [json.loads(line) for line in added.splitlines() if line.strip()]
        except ValueError:
            return False  # a line being written, or not from the start of one
        return added.endswith(b"\n") and all(isinstance(d, dict) and d.get("type") in SESSION_METADATA
                                              for d in lines)
    return since is None


def mcp_config(url: str, credential: str, timeout_ms: int | None) -> dict[str, Any]:
    """A per-spawn MCP config naming the harness server. Without "type": "http" the CLI skips it.

    The CLI sends every configured header on every request (docs/claude-cli.md): the credential goes
    as a bearer token and is the caller's only identity. It is written literally, not as a ${VAR}
    reference, so it never sits in the process environment where the CLI's children would inherit it.
    `timeout` is the server's hard limit per call and also raises the CLI's idle limit to it.
    """
    server: dict[str, Any] = {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {credential}"}}
    if timeout_ms is not None:
        server["timeout"] = timeout_ms
    return {"mcpServers": {"harness": server}}
