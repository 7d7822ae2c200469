"""Every spawn in a bubblewrap sandbox: the `claude` process and everything its tools start see only their own
tree, their own MCP config and a private /tmp, no other process, and no network but the ways out the spawn's
gateway (executor/sandbox/gateway.py) gives it.

Inside: the whole filesystem read-only; the data directory, the CLI's HOME, /run (PostgreSQL's and other
sockets), the operator's environment files and every other spawn's files hidden under empty tmpfs; the task's
tree writable (for a project worktree, the repository parts a commit needs, with the files git would obey —
config, hooks, the worktree's links — read-only, so nothing a worker writes runs later outside); a PID namespace
of its own (other processes' /proc is gone); a network namespace of its own whose only ways out are loopback
ports forwarded over Unix sockets to the gateway (the harness MCP, a local model server, an allowlisting proxy
for everything else). Threat model and what remains: docs/threat-model.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from executor.sandbox.limits import SpawnLimits
from shared import errors

# Inside the sandbox: where the gateway's sockets appear, and the port of the allowlisting proxy.
SOCKETS_INSIDE = "/run/petal-sandbox"
PROXY_PORT = 3128
# Paths no spawn sees, whatever the operator set (their environment files; the system's PostgreSQL data).
ALWAYS_HIDDEN = (Path("/etc/petal-dispatch"), Path("/var/lib/postgresql"), Path("/run"), Path("/var/run"),
                 Path("/root"), Path("/home"), Path("/dev/shm"), Path("/var/tmp"))
# What to install where the sandbox cannot run (Debian and Ubuntu package names).
INSTALL_HINT = "apt-get install bubblewrap socat"
# In the sandbox, before the CLI: one forwarder per loopback port (`port=socket`: TCP → the gateway's Unix
# socket), and the CLI started only once each one accepts (its MCP connection must not race the forwarder's bind).
# The shell itself tries each port (a connect: no process started per try), pausing 0.2 ms between tries with a
# `read` that times out on a pty nothing is ever written to (a pause without a process, leaving the cores to the
# forwarders' start), for 10 s at most. A subshell and a `sleep` per try had the CLI start some 5 ms after the
# forwarders were listening.
# A sandbox started ahead of its command (ARGV_FD set: executor/run/ahead.py) reads it from that descriptor once
# the forwarders accept: each argument NUL-terminated, then an empty one; without that last one (an end of file
# with nothing, or a write cut short) it ends without starting anything. Bash 5 or newer (EPOCHSECONDS).
# The launcher then waits for the CLI (passing a stop's signal on) and exits with its status, rather than exec it:
# bubblewrap's init ends the sandbox when its first child ends, so a CLI that dies for any reason takes the
# forwarders with it — also when the executor died while bubblewrap was still starting, before the sandbox's init
# had asked to die with its parent (seen once: an init and its forwarders outlived a killed executor).
_LAUNCHER = r"""
ports=()
while [ "$1" != "--" ]; do
  port=${1%%=*}
  socat "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$SOCKETS/${1#*=}" </dev/null >/dev/null &
  ports+=("$port"); shift
done
shift
{ exec {pause}<>/dev/ptmx; } 2>/dev/null || pause=
deadline=$((EPOCHSECONDS + 10))
for p in "${ports[@]}"; do
  until { : >"/dev/tcp/127.0.0.1/$p"; } 2>/dev/null || ((EPOCHSECONDS > deadline)); do
    if [ -n "$pause" ]; then read -r -t 0.0002 -u "$pause"; else sleep 0.001; fi
  done
done
[ -z "$pause" ] || exec {pause}>&-
unset SOCKETS pause deadline
if [ -n "${ARGV_FD:-}" ]; then
  mapfile -d '' -t argv <&"$ARGV_FD"
  exec {ARGV_FD}<&-
  unset ARGV_FD
  ((${#argv[@]} > 1)) && [ -z "${argv[-1]}" ] || exit 0
  unset 'argv[-1]'
  set -- "${argv[@]}"
  unset argv
fi
"$@" <&0 &
cli=$!
trap 'kill -TERM "$cli" 2>/dev/null' TERM
trap 'kill -INT "$cli" 2>/dev/null' INT
while :; do
  wait "$cli"; status=$?
  kill -0 "$cli" 2>/dev/null || break
done
exit "$status"
"""


class SandboxUnavailable(errors.ConfigError):
    """The sandbox cannot run here: said in one line with the cause and the fix."""


@dataclass(frozen=True)
class SandboxPolicy:
    """One executor's sandbox: the programs it needs and what every spawn must not see."""

    bwrap: str
    socat: str
    bash: str
    # hidden (an empty tmpfs in its place) in every spawn: the data directory, the CLI's HOME, …
    hidden: tuple[Path, ...] = ()
    # the hosts (host or host:port, "*.example.org" for subdomains) every spawn's tools may reach
    allow: tuple[str, ...] = ()
    # read-only in every spawn though inside a hidden directory (the CLI's install in a home's cache)
    exposed: tuple[Path, ...] = ()
    # each spawn's pids, memory and /tmp size (executor/sandbox/limits.py)
    limits: SpawnLimits = SpawnLimits()

    @classmethod
    def find(cls, *, hidden: Sequence[Path] = (), allow: Sequence[str] = (), exposed: Sequence[Path] = (),
             path: str | None = None, limits: SpawnLimits | None = None) -> SandboxPolicy:
        """The policy with the programs found on `path`; SandboxUnavailable naming what is missing."""
        found = {name: shutil.which(name, path=path) for name in ("bwrap", "socat", "bash")}
        missing = [name for name, where in found.items() if where is None]
        if missing:
            raise SandboxUnavailable(
                f"the worker sandbox needs {' and '.join(missing)}, not found on PATH: install with "
                f"`{INSTALL_HINT}` (or set PETAL_SANDBOX=off to run workers unsandboxed)")
        policy = cls(bwrap=str(found["bwrap"]), socat=str(found["socat"]), bash=str(found["bash"]),
                     hidden=tuple(dict.fromkeys(Path(p).resolve() for p in (*ALWAYS_HIDDEN, *hidden))),
                     allow=tuple(allow), exposed=tuple(dict.fromkeys(Path(p).resolve() for p in exposed)),
                     limits=limits or SpawnLimits())
        policy.check()
        return policy

    def check(self) -> None:
        """Start an empty sandbox with every namespace a spawn gets: SandboxUnavailable with bubblewrap's own
        reason when the kernel refuses (user namespaces disabled, a container without the privilege)."""
        argv = [self.bwrap, "--die-with-parent", *_NAMESPACES, "--ro-bind", "/", "/", "--proc", "/proc",
                *_PROC_READ_ONLY, "--dev", "/dev", *tmp_args(self.limits), "--tmpfs", "/tmp", "--", "/bin/true"]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"the worker sandbox cannot start: {exc}") from None
        if subprocess.run([self.bash, "-c", "((BASH_VERSINFO[0] >= 5))"], check=False, timeout=20).returncode:
            raise SandboxUnavailable(f"the worker sandbox's launcher needs bash 5 or newer ({self.bash} is older)")
        if res.returncode != 0 and "--size" in res.stderr:
            raise SandboxUnavailable(
                f"this bubblewrap ({self.bwrap}) cannot size a spawn's /tmp (no --size, or a setuid install): "
                "install bubblewrap 0.7 or newer, or set PETAL_SPAWN_TMP_SIZE=max to leave /tmp unsized")
        if res.returncode != 0:
            why = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
            raise SandboxUnavailable(
                f"the worker sandbox cannot start ({why}): bubblewrap needs unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1, or user.max_user_namespaces > 0) — or set "
                "PETAL_SANDBOX=off to run workers unsandboxed")


# A user namespace of its own with every capability dropped and no further user namespace: run by root,
# bubblewrap would otherwise keep root's capabilities inside (mount, remount / read-write, write sysctls).
_NAMESPACES = ("--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--unshare-pid", "--unshare-ipc",
               "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")


def tmp_args(limits: SpawnLimits) -> list[str]:
    """bubblewrap's size for the next --tmpfs (the spawn's /tmp): unsized, a tmpfs may take half the RAM."""
    return ["--size", str(limits.tmp_size)] if limits.tmp_size is not None else []


# The kernel's knobs stay read-only whoever runs the sandbox (a uid 0 inside still owns them by their mode).
_PROC_READ_ONLY = ("--ro-bind", "/proc/sys", "/proc/sys", "--ro-bind-try", "/proc/sysrq-trigger",
                   "/proc/sysrq-trigger")


@dataclass(frozen=True)
class Mount:
    kind: str  # --bind, --ro-bind, --tmpfs
    path: Path  # where it appears inside
    source: Path | None = None  # what is bound there (None: the same path outside)

    def args(self) -> list[str]:
        if self.kind == "--tmpfs":
            return [self.kind, str(self.path)]
        return [self.kind, str(self.source or self.path), str(self.path)]


@dataclass(frozen=True)
class SpawnBox:
    """What one spawn may see and reach."""

    workdir: Path
    # writable besides the tree (the CLI's config directory: its sessions and settings)
    writable: tuple[Path, ...] = ()
    # read-only even where something above would make them visible or writable (its own MCP config)
    readonly: tuple[Path, ...] = ()
    # hidden though inside the tree or a writable directory (other conversations in the CLI's config directory)
    hidden: tuple[Path, ...] = ()
    # (inside, outside): a directory of the spawn's own shown in another's place (its conversations' directory)
    bound: tuple[tuple[Path, Path], ...] = ()
    # loopback ports forwarded in: port → the gateway's socket for it
    ports: tuple[int, ...] = ()
    sockets_dir: Path | None = None


def git_parts(workdir: Path) -> tuple[list[Path], list[Path]]:
    """For a git worktree: (what a commit writes in the repository, what git obeys and must stay read-only).

    A worktree's `.git` is a file naming its directory under the repository's `.git/worktrees/`; a commit there
    writes objects, its branch ref and reflogs in the repository. The repository's config and hooks, and the
    worktree's links to it (`.git`, `commondir`, `gitdir`), stay read-only: a worker that could change them
    would choose the config (an fsmonitor command, a hook) of the next git command the executor runs there."""
    dot_git = workdir / ".git"
    if not dot_git.is_file() or dot_git.is_symlink():
        return [], []
    try:
        text = dot_git.read_text()
    except OSError:
        return [], []
    if not text.startswith("gitdir:"):
        return [], []
    gitdir = (workdir / text.removeprefix("gitdir:").strip()).resolve()
    common_file = gitdir / "commondir"
    try:
        common = (gitdir / common_file.read_text().strip()).resolve() if common_file.is_file() else gitdir
    except OSError:
        return [], []
    # Only the layout the executor makes for a project worker (executor/projects/worktrees.py `store_of`): its
    # private repository `<tree>.git` beside the tree, the worktree's directory under its `worktrees/`. A `.git`
    # file is something any spawn can write in its tree (a shared working directory's next turn would obey it):
    # never let it choose what the next sandbox mounts.
    store = workdir.with_name(f"{workdir.name}.git")
    if store.is_symlink() or not store.is_dir() or common != store.resolve() or gitdir.parent != common / "worktrees":
        return [], []
    writable = [gitdir, common / "objects", common / "logs"]
    branch = _branch_dir(gitdir, common)
    if branch is not None:
        writable.append(branch)
    # alternates would lend the repository objects from wherever a worker points them
    (common / "objects" / "info").mkdir(parents=True, exist_ok=True)
    # HEAD too: pointed at the base branch, the executor's commit of uncommitted work would land there
    readonly = [common, dot_git, gitdir / "commondir", gitdir / "gitdir", gitdir / "config.worktree",
                gitdir / "hooks", gitdir / "HEAD", common / "objects" / "info", *_alternates(common / "objects")]
    return [p for p in writable if p.exists()], [p for p in readonly if p.exists()]


def _alternates(objects: Path, depth: int = 0) -> list[Path]:
    """The object stores a worker's private repository borrows (executor/projects/worktrees.py: the project's),
    read-only: seen, so the base commit's objects are there, but never written. The alternates file is the
    executor's, read-only in every spawn; git follows alternates five deep, and so does this."""
    try:
        lines = (objects / "info" / "alternates").read_text().splitlines()
    except OSError:
        return []
    found = [(objects / line.strip()).resolve() for line in lines if line.strip() and not line.startswith("#")]
    found = [p for p in found if p.is_dir()]
    return found + [q for p in found if depth < 4 for q in _alternates(p, depth + 1)]


def _branch_dir(gitdir: Path, common: Path) -> Path | None:
    """The directory of the worktree's branch ref (a commit writes `<ref>.lock` beside it)."""
    try:
        head = (gitdir / "HEAD").read_text().strip()
    except OSError:
        return None
    if not head.startswith("ref: refs/heads/"):
        return None
    ref = common / head.removeprefix("ref: ")
    heads = common / "refs" / "heads"
    # a name with `..` (or a link on the way) would bind a directory outside the repository read-write
    if ".." in Path(head.removeprefix("ref: ")).parts or not ref.parent.resolve().is_relative_to(heads.resolve()):
        return None
    ref.parent.mkdir(parents=True, exist_ok=True)
    return ref.parent


def wrap(policy: SandboxPolicy, box: SpawnBox, argv: Sequence[str], *, argv_fd: int | None = None) -> list[str]:
    """`argv` as run inside the spawn's sandbox; with `argv_fd`, the command line is read from that descriptor
    (the child's, passed to it open) once the sandbox is up, and `argv` must be empty."""
    if argv_fd is not None and argv:
        raise ValueError("a sandbox reads its command from argv_fd or is given it, not both")
    mounts: list[Mount] = [Mount("--tmpfs", p) for p in policy.hidden if _is_real_dir(p)]
    mounts += [Mount("--bind", box.workdir)]
    mounts += [Mount("--bind", p) for p in box.writable]
    mounts += [Mount("--tmpfs", p) for p in box.hidden]
    mounts += [Mount("--ro-bind", p) for p in box.readonly]
    mounts += [Mount("--bind", inside, outside) for inside, outside in box.bound]
    # a parent's mount first, so what is bound inside a hidden directory stays visible (a worktree inside the
    # data directory) and what is hidden inside a bound one stays hidden (the data directory inside the tree)
    mounts.sort(key=lambda m: len(m.path.parts))
    args = [policy.bwrap, "--die-with-parent", *_NAMESPACES, "--ro-bind", "/", "/", "--dev", "/dev",
            "--proc", "/proc", *_PROC_READ_ONLY, *tmp_args(policy.limits), "--tmpfs", "/tmp"]
    for m in mounts:
        args += m.args()
    if box.sockets_dir is not None:
        args += ["--bind", str(box.sockets_dir), SOCKETS_INSIDE]
    args += ["--chdir", str(box.workdir), "--setenv", "SOCKETS", SOCKETS_INSIDE, "--setenv", "TMPDIR", "/tmp"]
    if argv_fd is not None:
        args += ["--setenv", "ARGV_FD", str(argv_fd)]
    forwards = [f"{port}={port}.sock" for port in box.ports]
    if box.sockets_dir is not None:
        forwards.append(f"{PROXY_PORT}=proxy.sock")
    args += ["--", policy.bash, "-c", _LAUNCHER, "petal-sandbox", *forwards, "--", *argv]
    return args


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
        # a fork reads the conversation it copies (the CLI does not write it: observed, docs/claude-cli.md)
        source = real / f"{fork_from}.jsonl"
        if fork_from and source.is_file() and not (private / source.name).exists():
            os.link(source, private / source.name)
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
    finally:
        forget_spawn(config_home, key)


def _is_real_dir(path: Path) -> bool:
    """A directory that is not a symlink (a tmpfs is mounted on the link's target, which is listed itself)."""
    return path.is_dir() and not path.is_symlink()


def install_root(binary: str, path: str | None) -> Path | None:
    """Where the CLI is installed (its npm prefix, or its directory): kept visible when it lies in a hidden
    directory, such as a cache in the service user's home."""
    found = shutil.which(binary, path=path)
    if found is None:
        return None
    real = Path(found).resolve()
    parts = real.parts
    if "node_modules" in parts:
        return Path(*parts[:parts.index("node_modules")])
    return real.parent


def proxy_env(port: int = PROXY_PORT) -> dict[str, str]:
    """Proxy variables for inside: everything not on loopback goes through the gateway's proxy."""
    url = f"http://127.0.0.1:{port}"
    no_proxy = "127.0.0.1,localhost,::1"
    return {"HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url,
            "ALL_PROXY": url, "NO_PROXY": no_proxy, "no_proxy": no_proxy}


def visible(path: Path, policy: SandboxPolicy) -> bool:
    """Whether `path` lies outside every hidden directory."""
    real = path.resolve()
    return not any(real == h or h in real.parents for h in policy.hidden)


_LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
# Where the CLI itself goes besides its model API: OAuth token refreshes.
CLI_AUTH_HOSTS = ("console.anthropic.com:443", "platform.claude.com:443")


def loopback_port(url: str | None) -> tuple[int, tuple[str, int]] | tuple[None, None]:
    """(port, (host, port)) of a loopback URL the CLI must reach (forwarded into the sandbox), else Nones."""
    if not url:
        return None, None
    parts = urlsplit(url)
    if parts.hostname not in _LOOPBACK_NAMES:
        return None, None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return port, ("127.0.0.1" if parts.hostname != "::1" else "::1", port)


def cli_hosts(env: Mapping[str, str]) -> list[str]:
    """The hosts the CLI's own traffic goes to through the proxy: its model API (unless on loopback, which is
    forwarded) and its OAuth refresh."""
    base = env.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
    parts = urlsplit(base)
    hosts = list(CLI_AUTH_HOSTS)
    if parts.hostname and parts.hostname not in _LOOPBACK_NAMES:
        hosts.append(f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}")
    return hosts
