"""The only code that knows the `claude` CLI: command lines, environment, stream-json lines, status.

Ground truth is what the CLI was observed to do (docs/claude-cli.md and the tests against the real
binary): stdout is JSON lines but must be parsed tolerantly; a result's `is_error` changed meaning
between 2.1.x versions, so an `error_*` subtype is a failure whatever `is_error` says, and `subtype:
"success"` is not success when `is_error` is set; SIGTERM exits 143 with no result line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import orjson

from executor import gates
from executor.run import user_input
from shared import journal, lifeline, threads

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

_TYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,40}")  # whole names (fullmatch: no trailing newline)
_API_ERROR_TEXT = re.compile(r"\bAPI Error: (\d{3})\b")


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
    # its message exists (executor/run/warm.py)
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


class Line(NamedTuple):
    """One typed stdout line (a named tuple: one is built per line of a flood, and a tuple is the cheapest)."""

    event_type: str
    payload: Any
    obj: dict[str, Any] | None
    # the line's own JSON text when jsonb can store it as printed
    payload_json: str | None = None


# A line's "type" (a system line's "subtype") → its event type. A stream has a handful of distinct ones, so
# each is checked against _TYPE_NAME once; bounded, so a stream of ever-new names is typed, just not cached.
_TYPE_CACHE_MAX = 256
_kind_types: dict[str, str] = {}
_system_types: dict[str, str] = {}


def _event_type(cache: dict[str, str], name: str, prefix: str, fallback: str) -> str:
    found = cache.get(name)
    if found is None:
        found = prefix + name if _TYPE_NAME.fullmatch(name) else fallback
        if len(cache) < _TYPE_CACHE_MAX:
            cache[name] = found
    return found


def _parse(text: str) -> tuple[Any, bool]:
    """(value, whether the text is storable as is); (None, False) when it is not JSON."""
    try:
        return orjson.loads(text), journal.storable_json(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text), False  # e.g. lone surrogates, which orjson refuses
    except ValueError:
        return None, False


def classify(raw: bytes) -> Line:
    """Type one stdout line. Anything that is not a JSON object is kept verbatim as stream.unparsed."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n").removeprefix("\ufeff")
    obj, storable = _parse(text)
    if not isinstance(obj, dict):
        payload: dict[str, Any] = {"line": text}
        if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
            payload["invalid_utf8"] = True
        return Line("stream.unparsed", payload, None)
    as_is = text if storable else None
    kind = obj.get("type")
    if not isinstance(kind, str):
        return Line("stream.other", obj, obj, as_is)
    if kind == "system":
        sub = obj.get("subtype")
        if not isinstance(sub, str):
            return Line("stream.system", obj, obj, as_is)
        return Line(_event_type(_system_types, sub, "stream.system.", "stream.system"), obj, obj, as_is)
    return Line(_event_type(_kind_types, kind, "stream.", "stream.other"), obj, obj, as_is)


@dataclass
class TurnFacts:
    """What the stream showed, accumulated line by line (pure; no I/O)."""

    substrate_session_id: str | None = None
    result: dict[str, Any] | None = None
    rate_limited: bool = False
    auth_failed: bool = False
    lines: int = 0
    unparsed: int = 0
    last_text: str = ""
    # the CLI's "[Request interrupted by user…]" line: SIGINT or a control-protocol interrupt
    interrupted: bool = False
    # completed tool calls: what tells a budget stop with work done (partial) from one without
    tool_results: int = 0

    def feed(self, line: Line) -> None:
        self.lines += 1
        obj = line.obj
        if obj is None:
            self.unparsed += line.event_type == "stream.unparsed"
            return
        sid = obj.get("session_id")
        if isinstance(sid, str) and sid and self.substrate_session_id is None:
            self.substrate_session_id = sid
        read = self._readers.get(str(obj.get("type")))
        if read is not None:
            read(self, obj)

    def _api_error(self, error: Any, status: Any) -> None:
        """An API error the CLI reported: a rate limit (429) or a failed login (401)."""
        if error in ("rate_limit", "rate_limit_error") or status == 429:
            self.rate_limited = True
        elif error == "authentication_failed" or status == 401:
            self.auth_failed = True

    def _system(self, obj: dict[str, Any]) -> None:
        if obj.get("subtype") == "api_retry":
            self._api_error(obj.get("error"), obj.get("error_status"))

    def _assistant(self, obj: dict[str, Any]) -> None:
        self._api_error(obj.get("error"), obj.get("api_error_status"))
        texts = [b.get("text", "") for b in (obj.get("message") or {}).get("content") or []
                 if isinstance(b, dict) and b.get("type") == "text"]
        if texts and not obj.get("is_api_error_message"):
            self.last_text = "\n".join(texts)

    def _user(self, obj: dict[str, Any]) -> None:
        content = (obj.get("message") or {}).get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for b in blocks:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "tool_result":
                self.tool_results += 1
            elif b.get("type") == "text" and str(b.get("text", "")).startswith(INTERRUPTED_MARK):
                self.interrupted = True

    def _rate_limit_event(self, obj: dict[str, Any]) -> None:
        if ((obj.get("rate_limit_info") or {}).get("status")) == "rejected":
            self.rate_limited = True

    def _result(self, obj: dict[str, Any]) -> None:
        self.result = obj
        self._api_error(obj.get("api_error_type"), obj.get("api_error_status"))
        # older CLIs (2.1.29) give no api_error_status and no api_retry line without retries: only the text
        said = _API_ERROR_TEXT.search(str(obj.get("result") or "")) if obj.get("is_error") else None
        if said:
            self._api_error(None, int(said.group(1)))

    # what each kind of line can tell (the other kinds only count)
    _readers: ClassVar[dict[str, Callable[[TurnFacts, dict[str, Any]], None]]] = {
        "system": _system, "assistant": _assistant, "user": _user, "rate_limit_event": _rate_limit_event,
        "result": _result,
    }

    @property
    def permission_denials(self) -> list[dict[str, Any]]:
        denials = (self.result or {}).get("permission_denials") or []
        return [d for d in denials if isinstance(d, dict)]

    def result_summary(self) -> dict[str, Any] | None:
        if self.result is None:
            return None
        keys = ("subtype", "is_error", "terminal_reason", "api_error_status", "num_turns", "stop_reason",
                "duration_ms", "total_cost_usd", "errors")
        return {k: self.result[k] for k in keys if k in self.result}


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str
    reason: str


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


_CANCEL_CODES = {128 + signal.SIGTERM, 128 + signal.SIGINT}
_CANCEL_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_ABORTED = {"aborted_streaming", "aborted_tools"}
# the text of the synthetic user line an interrupt leaves ("… for tool use" during a tool)
INTERRUPTED_MARK = "[Request interrupted by user"
# a run the CLI stopped on a budget; with work done it is `partial`, else `failed`
_BUDGET_STOPS = {"error_max_turns": "max_turns", "error_max_budget_usd": "max_budget_usd"}


def derive_status(
    returncode: int | None, facts: TurnFacts, *, stop_requested: bool = False, imported: bool = False,
    gate_denials: int = 0,
) -> Outcome:
    """Exit → status (design.md, D-11). `returncode` < 0 means death by signal -N (asyncio's form);
    None means unknown (an imported transcript). `gate_denials` counts the harness's own `gate.decided`
    refusals: a gate that failed or timed out is missing from the CLI's permission_denials."""
    result = facts.result
    failed_run = (result is None or bool(result.get("is_error")) or returncode not in (0, None)
                  or str(result.get("subtype")).startswith("error_"))
    if stop_requested:
        return Outcome("cancelled", "stop_requested")
    if failed_run and facts.rate_limited:
        return Outcome("rate_limited", "rate_limit")
    if failed_run and facts.auth_failed:
        return Outcome("rate_limited", "auth_failed")
    by_process = _process_outcome(returncode)
    if by_process is not None:
        return by_process
    if result is None:
        if facts.interrupted:  # the CLI sometimes exits after an interrupt without its result line
            return Outcome("cancelled", "interrupted")
        return Outcome("crashed" if imported else "failed", "no_result")
    by_result = _result_outcome(result, facts, returncode)
    if by_result is not None:
        return by_result
    if gate_denials:
        return Outcome("gated", "gate_decisions")
    if facts.permission_denials:
        return Outcome("gated", "permission_denials")
    return Outcome("success", str(result.get("terminal_reason") or "completed"))


def _process_outcome(returncode: int | None) -> Outcome | None:
    """What the exit alone says: a signal, or a shell's 128+N code."""
    if returncode is not None and returncode < 0:
        sig = -returncode
        return Outcome("cancelled" if sig in _CANCEL_SIGNALS else "crashed", f"signal {signal_name(sig)}")
    if returncode in _CANCEL_CODES:
        return Outcome("cancelled", f"exit {returncode}")
    if returncode is not None and returncode > 128:
        return Outcome("crashed", f"exit {returncode}")
    return None


def _result_outcome(result: dict[str, Any], facts: TurnFacts, returncode: int | None) -> Outcome | None:
    """What the result line says of an unsuccessful run: an interrupt, a budget stop, an error."""
    terminal = result.get("terminal_reason")
    subtype = result.get("subtype")
    # is_error of an interrupt or a max-turns stop was false in 2.1.29 and is true since: read the subtype
    if terminal in _ABORTED or (subtype == "error_during_execution" and facts.interrupted):
        return Outcome("cancelled", str(terminal or "interrupted"))
    if subtype in _BUDGET_STOPS:
        return Outcome("partial" if facts.tool_results else "failed", _BUDGET_STOPS[subtype])
    if isinstance(subtype, str) and subtype.startswith("error_"):
        return Outcome("failed", str(terminal or subtype))
    if result.get("is_error") or returncode not in (0, None):
        return Outcome("failed", str(terminal or subtype or f"exit {returncode}"))
    return None
