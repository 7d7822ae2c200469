"""Push a worker's reviewed commit to its project's push remote (migration 0046), in a sandbox whose only way out
is that remote.

- The remote is the user's (`projects.push_remote`, shared/remotes.py), never read from a repository's config; the
  refspec names the reviewed commit itself (`<head_commit>:refs/heads/<branch>`), not a ref a spawn could move.
- git pushes from a repository of the executor's own, written for this push in a private temporary directory (no
  hooks, no config but its format), whose object store borrows the project's read-only (an alternate). The project's config — a `remote.*.url`, a `url.*.insteadOf` or `pushInsteadOf`, a `core.hooksPath`
  a spawn with the checkout as its workdir wrote — is never read, and none of its hooks can run.
- The hardening of executor/projects/git.py: its program, no system or user config, its FIXED_OVERRIDES as
  command-scope config (no hooks, fsmonitor, ssh, credential helpers, signing), one protocol allowed (`file` for a
  path, the URL's scheme otherwise). A push to a path starts the remote's receive-pack with git's repository
  environment cleared, command-scope config included: the same overrides go on its own command line
  (`--receive-pack`), so the remote repository's hooks and helpers do not run either.
- Sandboxed (bubblewrap, with the policy and per-spawn limits of the executor's Isolation): everything read-only,
  the project's object store and the push's own repository read-only and visible even inside a hidden directory,
  no process of the executor's in sight, and out only to the remote: a path remote is the one directory bound
  writable, with no network at all; a network remote is reached through a gateway whose allowlist is its host:port
  alone (NO_PROXY empty: a loopback remote goes through the gateway too).
- With the sandbox off (the operator's PETAL_SANDBOX=off) the same command runs unsandboxed, hardened the same way,
  as the merge does.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import shlex
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from executor.projects import git
from executor.sandbox import bwrap, limits
from executor.sandbox.gateway import Gateway, parse_allowlist
from shared import lifeline, remotes
from shared.protected import overlap

PUSH_TIMEOUT_S = 300.0
TAIL_LINES = 20
LINE_CHARS = 500
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_BRANCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,200}")
# besides git.FIXED_OVERRIDES: nothing pushed but the one refspec, nothing signed
PUSH_OVERRIDES = (("push.gpgSign", "false"), ("push.recurseSubmodules", "no"), ("push.followTags", "false"))
# the remote's receive-pack (a path remote): every object it receives checked, nothing run in the background
RECEIVE_OVERRIDES = (*git.FIXED_OVERRIDES, ("receive.fsckObjects", "true"), ("receive.autogc", "false"))


class Sandboxes(Protocol):
    """What the push takes of the executor's Isolation (executor/run/isolation.py): the sandbox's policy and the
    per-spawn limits it can set here."""

    @property
    def policy(self) -> bwrap.SandboxPolicy: ...

    @property
    def cgroups(self) -> limits.CgroupTree | None: ...

    @property
    def rlimits(self) -> tuple[int | None, int | None]: ...


@dataclass(frozen=True)
class PushResult:
    ok: bool
    exit_code: int | None  # None: killed (timed out)
    tail: list[str]  # git's last lines (stdout and stderr)
    sandboxed: bool
    duration_s: float
    timed_out: bool = False

    def payload(self) -> dict[str, object]:
        return asdict(self)


def check_target(remote: remotes.Remote, project: Path,
                 protected: Sequence[tuple[str, Path]] = ()) -> Path | None:
    """A path remote's repository as it is now (symbolic links resolved), None for a network remote; ValueError
    when it is no repository, or is where a spawn or the service writes: the project's own repository (a thread's
    spawn may have the checkout as its workdir) or what no worker may write (`protected`)."""
    if remote.path is None:
        return None
    resolved = Path(remote.path).resolve()
    if not resolved.is_dir():
        raise ValueError(f"push_remote {remote.url} does not exist or is not a directory")
    if not ((resolved / "HEAD").is_file() and (resolved / "objects").is_dir()) and not (resolved / ".git").exists():
        raise ValueError(f"push_remote {resolved} is not a git repository (make one: git init --bare {resolved})")
    project = project.resolve()
    if resolved == project or resolved.is_relative_to(project) or project.is_relative_to(resolved):
        raise ValueError(f"push_remote {resolved} is the project's repository, or inside it or around it: spawns "
                         "may write there")
    why = overlap(resolved, protected, home=Path.home().resolve())
    if why is not None:
        raise ValueError(f"push_remote {resolved} {why}")
    return resolved


async def objects_of(repo: Path) -> Path:
    """The project's object store (the hardened git of executor/projects/git.py, which runs nothing the
    repository's config names)."""
    found = await (await git.Git.at(repo))("rev-parse", "--path-format=absolute", "--git-path", "objects")
    return Path(found.out.strip())


async def push(sandboxes: Sandboxes | None, objects: Path, remote: remotes.Remote, target: Path | None,
               commit: str, branch: str, timeout_s: float = PUSH_TIMEOUT_S) -> PushResult:
    """Push `commit` (whose objects are in `objects`) to `refs/heads/<branch>` on `remote` (`target`: a path
    remote's repository as check_target found it), sandboxed unless `sandboxes` is None."""
    if not _COMMIT.fullmatch(commit) or not _BRANCH.fullmatch(branch) or ".." in branch:
        raise ValueError(f"not a commit and branch to push: {commit!r} {branch!r}")
    started = time.monotonic()
    scratch = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="petal-push-"))
    gateway: Gateway | None = None
    cgroup: limits.SpawnCgroup | None = None
    try:
        repo = await asyncio.to_thread(_own_repository, scratch, objects, commit)
        argv = _push_argv(repo, remote, target, commit, branch)
        env = {**git.base_env(), **git.config_env([*git.FIXED_OVERRIDES, *PUSH_OVERRIDES]), "HOME": str(scratch),
               "GIT_ALLOW_PROTOCOL": "file" if target is not None else str(remote.scheme)}
        if sandboxes is not None:
            if target is None:
                gateway = await Gateway.open(scratch / "gw", {}, parse_allowlist([remote.allow_entry]),
                                             label=f"push {branch}")
                env.update(bwrap.proxy_env(), NO_PROXY="", no_proxy="")
            box = bwrap.SpawnBox(workdir=target or scratch, readonly=(repo, objects),
                                 sockets_dir=gateway.directory if gateway is not None else None)
            argv = bwrap.wrap(sandboxes.policy, box, argv)
            cgroup = sandboxes.cgroups.make(f"push-{uuid.uuid4().hex}", sandboxes.policy.limits) \
                if sandboxes.cgroups is not None else None
            nproc, data = sandboxes.rlimits
            argv = limits.enter_argv(sandboxes.policy.bash, cgroup.procs if cgroup is not None else (), argv,
                                     nproc=nproc, data=data)
        rc, tail, timed_out = await _run(argv, env, scratch, timeout_s)
    finally:
        if gateway is not None:
            await gateway.close()
        if cgroup is not None:
            await asyncio.to_thread(_drop, cgroup)
        await asyncio.to_thread(shutil.rmtree, scratch, True)
    return PushResult(rc == 0 and not timed_out, rc if rc is not None and rc >= 0 else None, tail,
                      sandboxes is not None, round(time.monotonic() - started, 3), timed_out)


def _own_repository(scratch: Path, objects: Path, commit: str) -> Path:
    """An empty bare repository of the push's own whose object store borrows the project's: written here file by
    file (no git runs in a directory whose parents a spawn might have given a `.git`), as `git init --bare
    --template=` would leave it."""
    repo = scratch / "push.git"
    for sub in ("objects/info", "objects/pack", "refs/heads", "refs/tags"):
        (repo / sub).mkdir(parents=True)
    (repo / "HEAD").write_text("ref: refs/heads/main\n")
    formats = "\trepositoryformatversion = 1\n[extensions]\n\tobjectformat = sha256\n" if len(commit) == 64 \
        else "\trepositoryformatversion = 0\n"
    (repo / "config").write_text(f"[core]\n\tbare = true\n{formats}")
    (repo / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    return repo


def _push_argv(repo: Path, remote: remotes.Remote, target: Path | None, commit: str, branch: str) -> list[str]:
    program = git.program()
    argv = [program, f"--git-dir={repo}", "push", "--porcelain", "--no-verify", "--recurse-submodules=no"]
    if target is not None:  # run through a shell by git: each word quoted
        pairs = [arg for key, value in RECEIVE_OVERRIDES for arg in ("-c", f"{key}={value}")]
        argv.append(f"--receive-pack={shlex.join([program, *pairs, 'receive-pack'])}")
    return [*argv, str(target) if target is not None else remote.url, f"{commit}:refs/heads/{branch}"]


async def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> tuple[int | None, list[str], bool]:
    """(exit code, the last lines, timed out): the process group killed at the timeout."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    argv, preexec = lifeline.spawn_dying_with_parent(argv, signal.SIGTERM, path=env.get("PATH"))
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        cwd=cwd, env=env, start_new_session=True, preexec_fn=preexec, limit=1 << 20)
    assert proc.stdout is not None
    stdout = proc.stdout

    async def read() -> None:
        async for raw in stdout:
            line = raw.decode(errors="replace").rstrip()
            if line:
                tail.append(line[:LINE_CHARS])

    try:
        await asyncio.wait_for(asyncio.gather(read(), proc.wait()), timeout_s)
    except TimeoutError:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await proc.wait()
        tail.append(f"… the push was stopped after {timeout_s:g} s")
        return None, list(tail), True
    return proc.returncode, list(tail), False


def _drop(cgroup: limits.SpawnCgroup) -> None:
    cgroup.kill()
    cgroup.remove()
