"""A spawn's view of the CLI's config directory (bwrap.py mounts it): its login and what every spawn obeys
read-only, its own copy of the CLI's state file, and only its own conversation; after the spawn, its new
conversation kept for the next turn's `--resume` and the rest of what it left discarded."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

# The CLI cuts a long directory name for its conversations to this many characters and adds a hash of the path.
SLUG_MAX = 200


def session_dir(config_home: Path, workdir: Path) -> Path:
    """Where the CLI keeps the conversations started in `workdir`: every character but letters and digits of the
    absolute path as "-"; past 200 characters, the first 200, "-", and the path's Java-style string hash in
    base 36 (observed on 2.1.328: a 264-character path gave 200 + "-ab5c1e")."""
    slug = re.sub(r"[^A-Za-z0-9]", "-", str(workdir))
    if len(slug) <= SLUG_MAX:
        return config_home / "projects" / slug
    return config_home / "projects" / f"{slug[:SLUG_MAX]}-{_base36(abs(_string_hash(str(workdir))))}"


def _string_hash(text: str) -> int:
    """JavaScript's `hash = (hash << 5) - hash + charCode | 0` over UTF-16 code units (a signed 32-bit int)."""
    h = 0
    units = text.encode("utf-16-le")
    for i in range(0, len(units), 2):
        h = (h * 31 + int.from_bytes(units[i:i + 2], "little")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out or "0"


@dataclass(frozen=True)
class ConfigView:
    """How a spawn sees the CLI's config directory."""

    hidden: tuple[Path, ...]
    writable: tuple[Path, ...]
    readonly: tuple[Path, ...]
    # the spawn's own conversations directory, shown where the CLI looks for its working directory's
    bound: tuple[tuple[Path, Path], ...]


# The login: read-only in every spawn, so no spawn replaces or destroys what its siblings and the user's own
# terminal log in with. The CLI inside would refresh an OAuth login that has expired and, unable to save it, go on
# with the new token in memory while the file keeps the refresh token it spent (observed: docs/claude-cli.md, "What
# the CLI reads from its config and the tree"): an unattended service logs in with token mode or an API key.
CLI_LOGIN = ".credentials.json"
# The CLI's global state (`.claude.json`: user- and local-scope MCP servers, per-project trust and approvals) is
# loaded by every later CLI, the user's terminal included: a spawn gets a private copy of the keys a headless run
# needs (who is logged in; a key saved by /login), discarded after it, never the user's file. The CLI runs without
# one, and quietly without saving when it cannot write it (observed).
CLI_STATE = ".claude.json"
STATE_KEYS = ("userID", "oauthAccount", "primaryApiKey", "customApiKeyResponses", "hasCompletedOnboarding",
              "lastOnboardingVersion")
# What in the config directory every spawn obeys (hooks and permissions in settings, the user's standing
# instructions, their agents, commands and skills): read-only, so no worker plants something for the next one.
# The two files are made empty where missing, so a worker cannot create them either.
OBEYED_CONFIG = {"settings.json": "{}\n", "CLAUDE.md": ""}
OBEYED_DIRS = ("agents", "commands", "skills", "output-styles")
# Per spawn, under the config directory (hard links need the same file system): its own conversations directory.
SPAWNS_DIR = ".petal-spawns"


def spawn_sessions(config_home: Path, key: str) -> Path:
    return config_home / SPAWNS_DIR / key


def spawn_state(config_home: Path, key: str) -> Path:
    """A spawn's private copy of the CLI's state file (STATE_KEYS of the user's), shown in place of it."""
    return config_home / SPAWNS_DIR / f"{key}{CLI_STATE}"


def private_state(user_state: Path, copy: Path) -> None:
    """Write the spawn's copy: only STATE_KEYS of the user's state file (an unreadable one gives an empty copy)."""
    try:
        data = json.loads(user_state.read_text())
    except (OSError, ValueError):
        data = {}
    kept = {k: data[k] for k in STATE_KEYS if isinstance(data, dict) and k in data}
    copy.unlink(missing_ok=True)
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(kept, f)


def forget_spawn(config_home: Path, key: str) -> None:
    """What a spawn had of the config directory, once it is over: its conversations directory and state copy."""
    shutil.rmtree(spawn_sessions(config_home, key), ignore_errors=True)
    spawn_state(config_home, key).unlink(missing_ok=True)


def config_view(config_home: Path, workdir: Path, session_uuid: str | None, key: str, *,
                fork_from: str | None = None, state_file: Path | None = None) -> ConfigView:
    """A spawn's view of the CLI's config directory, on a whitelist: an empty tmpfs in its place, with its login
    read-only, its own copy of the CLI's state file (`state_file`, where the CLI reads it: in the config directory
    by default, `~/.claude.json` when the CLI runs without CLAUDE_CONFIG_DIR), what every spawn obeys read-only, and
    in its working directory's conversations
    directory only its own conversation: a private directory holding a hard link to the conversation's file (and
    its side directory) when it goes on, where the CLI appends, and where it starts a new one
    (`keep_session` moves that into place after the exit). Everything else the CLI writes goes with the spawn,
    and no spawn sees another conversation, of its own directory or any other, whenever it was started.
    `session_uuid` None: a spare's, whose conversation is linked in later (`link_conversation`)."""
    config_home.mkdir(parents=True, exist_ok=True)
    for name, empty in OBEYED_CONFIG.items():
        if not (config_home / name).exists():
            (config_home / name).write_text(empty)
    real = session_dir(config_home, workdir)
    real.mkdir(parents=True, exist_ok=True)
    private = spawn_sessions(config_home, key)
    if private.exists():
        shutil.rmtree(private)
    private.mkdir(parents=True, mode=0o700)
    bound = [(real, private)]
    if session_uuid is not None:
        _link_transcript(real, private, session_uuid)
        # a fork reads the conversation it copies (the CLI does not write it: observed, docs/claude-cli.md). A copy,
        # not a link: that conversation is the user's, live in their own terminal, and a process in the sandbox
        # could write through a link into the history that terminal goes on from
        source = real / f"{fork_from}.jsonl"
        if fork_from and source.is_file() and not source.is_symlink() and not (private / source.name).exists():
            shutil.copyfile(source, private / source.name)
        if (real / session_uuid).is_dir():
            (private / session_uuid).mkdir()
            bound.append((real / session_uuid, real / session_uuid))
    state_file = state_file or config_home / CLI_STATE
    copy = spawn_state(config_home, key)
    private_state(state_file, copy)
    # a mount point needs a file there or a directory the sandbox makes (the config directory is an empty tmpfs);
    # elsewhere (a visible, read-only HOME without the file) the CLI runs without one
    if state_file.is_file() or state_file.parent == config_home:
        bound.append((state_file, copy))
    readonly = [config_home / name for name in (CLI_LOGIN, *OBEYED_CONFIG, *OBEYED_DIRS)
                if (config_home / name).exists()]
    return ConfigView(hidden=(config_home,), writable=(), readonly=tuple(readonly), bound=tuple(bound))


def _link_transcript(real: Path, private: Path, session_uuid: str) -> None:
    transcript = real / f"{session_uuid}.jsonl"
    if transcript.is_file():
        os.link(transcript, private / transcript.name)


def link_conversation(config_home: Path, workdir: Path, session_uuid: str, key: str) -> bool:
    """A conversation that goes on, linked into a started spawn's private conversations directory (a spare's, which
    showed none until now: the directory is bound, so the link shows inside). False, with nothing linked, when it
    cannot be: it is not stored, or it has a side directory, which needs a mount of its own, fixed at the start."""
    real = session_dir(config_home, workdir)
    if (real / session_uuid).exists() or not (real / f"{session_uuid}.jsonl").is_file():
        return False
    _link_transcript(real, spawn_sessions(config_home, key), session_uuid)
    return True


def config_state(config_home: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, device, inode) of each CLI config file a spawn's view mounts from `config_home` by name (its login,
    what every spawn obeys; its state file is a copy made at its start): a mount shows the file it was made on, so
    a file replaced since (a rename: a new login, edited settings) changes this, and a sandbox started before shows the old one."""
    state = []
    for name in (CLI_LOGIN, *OBEYED_CONFIG, *OBEYED_DIRS):
        with contextlib.suppress(FileNotFoundError):
            st = (config_home / name).stat()
            state.append((name, st.st_dev, st.st_ino))
    return tuple(state)


def keep_session(config_home: Path, workdir: Path, session_uuid: str, key: str) -> None:
    """After the spawn: its conversation, if it started one, into its working directory's conversations directory
    (a conversation that went on was appended in place, through the hard link); nothing else it left there."""
    private = spawn_sessions(config_home, key)
    real = session_dir(config_home, workdir)
    try:
        for name in (f"{session_uuid}.jsonl", session_uuid):
            made, there = private / name, real / name
            if (made.is_file() or made.is_dir()) and not made.is_symlink() and not there.exists():
                os.replace(made, there)
        side = real / session_uuid  # kept now, or kept before and bound into this spawn writable
        if side.is_dir() and not side.is_symlink():
            _files_only(side)
        conversation = real / f"{session_uuid}.jsonl"
        if conversation.is_file() and not conversation.is_symlink():
            _manual_on_resume(conversation, session_uuid)
    finally:
        forget_spawn(config_home, key)


# `claude --resume` restores the permission mode the conversation's last `permission-mode` line names (observed on
# 2.1.328; the CLI writes one when a session starts or its mode changes, a headless turn none)
MODE_MARK = b"permission-mode"
ASKING_MODES = ("default", "plan")  # "default" is the CLI's name for manual mode in the file
_CHUNK = 1 << 20


def _manual_on_resume(conversation: Path, session_uuid: str) -> None:
    """A spawn can append a `permission-mode` line to its own conversation (acceptEdits, auto: edits and commands
    without asking), and the user's own `claude --resume` of it (an adopted conversation is their file) would start
    in that mode. When the file's last mention of a mode is not a line naming one that asks, the CLI's own line for
    manual mode is appended after it."""
    last = _last_mark(conversation)
    if last is None:
        return
    line = _line_at(conversation, last)
    try:
        said = json.loads(line) if line is not None else None
    except ValueError:
        said = None
    if isinstance(said, dict) and said.get("type") == "permission-mode" and said.get("permissionMode") in ASKING_MODES:
        return
    with conversation.open("ab") as f:
        f.write(json.dumps({"type": "permission-mode", "permissionMode": "default", "sessionId": session_uuid},
                           separators=(",", ":")).encode() + b"\n")


def _last_mark(path: Path) -> int | None:
    """The offset of the file's last MODE_MARK, read a chunk at a time (a line may be any length)."""
    found, offset, tail = None, 0, b""
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            data = tail + chunk
            at = data.rfind(MODE_MARK)
            if at >= 0:
                found = offset - len(tail) + at
            tail = data[-(len(MODE_MARK) - 1):]
            offset += len(chunk)
    return found


def _line_at(path: Path, at: int, most: int = 64 * 1024) -> bytes | None:
    """The line holding offset `at`, or None when it is longer than `most` bytes either side (no mode line is)."""
    with path.open("rb") as f:
        start = max(0, at - most)
        f.seek(start)
        data = f.read(at - start + most)
    before, after = data[:at - start], data[at - start:]
    head = before.rfind(b"\n")
    end = after.find(b"\n")
    if (head < 0 and start > 0) or (end < 0 and len(after) == most):
        return None
    return before[head + 1:] + (after if end < 0 else after[:end])


def _files_only(tree: Path) -> None:
    """Leave only directories and regular files in a spawn's side directory (its subagents' conversations, tool
    results kept as files) before it is kept: it is the spawn's to fill, and the user's unsandboxed CLI resumes
    with it and reads some of its files (`archived.json`, `remote-agents`: a FIFO would hang it, a link would send
    the read elsewhere)."""
    for root, dirs, files in os.walk(tree):  # links to directories are listed in `dirs`, never followed
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                os.unlink(path)
                with contextlib.suppress(ValueError):
                    dirs.remove(name)
