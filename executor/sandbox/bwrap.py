"""Every spawn in a bubblewrap sandbox: the `claude` process and everything its tools start see only their own
tree, their own MCP config and a private /tmp, no other process, and no network but the ways out the spawn's
gateway (executor/sandbox/gateway.py) gives it.

Inside: the whole filesystem read-only; the data directory, the CLI's HOME, /run (PostgreSQL's and other
sockets), the operator's environment files and every other spawn's files hidden under empty tmpfs; the task's
tree writable (for a project worktree, the repository parts a commit needs, with the files git would obey —
config, hooks, the worktree's links — read-only, so nothing a worker writes runs later outside); a PID namespace
of its own (other processes' /proc is gone); a network namespace of its own whose only ways out are loopback
ports forwarded over Unix sockets to the gateway (the harness MCP, a local model server, an allowlisting proxy
for everything else). What a spawn sees of the CLI's config directory is cliconfig.py's (config_view), a project
worktree's git parts git_view.py's (git_parts); executor/run/isolation.py puts both in the spawn's box. Threat
model and what remains: docs/threat-model.md.
"""

from __future__ import annotations

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
# A sandbox started ahead of its command (ARGV_FD set: executor/run/spawn/ahead.py) reads it from that descriptor once
# the forwarders accept: each argument NUL-terminated, then an empty one; without that last one (an end of file
# with nothing, or a write cut short) it ends without starting anything. Bash 5 or newer (EPOCHSECONDS).
# The launcher then waits for the CLI (passing a stop's signal on) and exits with its status, rather than exec it.
# Whatever way it ends, it ends its forwarders first: bubblewrap's init waits for every process of the sandbox, and
# only its parent's end (the outer bubblewrap, gone when the CLI's status is read or the executor dies) takes it
# down. When the executor died while bubblewrap was still starting, before the init had asked to die with its
# parent, nothing did: the launcher found no command (an end of file on ARGV_FD) and ended, and the init waited on
# its forwarders for good (seen after a killed executor: an init and three forwarders, a quarter of an hour on).
_LAUNCHER = r"""
ports=() forwarders=()
trap 'kill "${forwarders[@]}" 2>/dev/null' EXIT
while [ "$1" != "--" ]; do
  port=${1%%=*}
  socat "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$SOCKETS/${1#*=}" </dev/null >/dev/null &
  forwarders+=($!) ports+=("$port"); shift
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
        # read-only: its sockets are connected to, never made, inside; written, it would be space on the host's /tmp
        # outside the spawn's sized one
        args += ["--ro-bind", str(box.sockets_dir), SOCKETS_INSIDE]
    args += ["--chdir", str(box.workdir), "--setenv", "SOCKETS", SOCKETS_INSIDE, "--setenv", "TMPDIR", "/tmp"]
    if argv_fd is not None:
        args += ["--setenv", "ARGV_FD", str(argv_fd)]
    forwards = [f"{port}={port}.sock" for port in box.ports]
    if box.sockets_dir is not None:
        forwards.append(f"{PROXY_PORT}=proxy.sock")
    args += ["--", policy.bash, "-c", _LAUNCHER, "petal-sandbox", *forwards, "--", *argv]
    return args


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
