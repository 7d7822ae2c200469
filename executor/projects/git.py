"""The executor's own git: one program, found once among the system's directories, run so that nothing a
spawn wrote can choose a program for it to run.

The executor runs git outside every sandbox, in trees and repositories spawns wrote: a worker's worktree and
its private repository, and a project's checkout (which a thread's spawn may have as its workdir). So:
- the program is `git` from /usr/bin, /bin or /usr/local/bin, resolved once — never through the executor's
  PATH, which starts with its venv (a workdir holding the service's checkout could plant `.venv/bin/git`) —
  and every git child gets a PATH of system directories only;
- the system's and the user's config and attributes files are not read, nor replacement refs;
- command-scope config (GIT_CONFIG_COUNT, which wins over every file) turns off what runs a program,
  whatever the repository's config, its `config.worktree` or a file either includes says: hooks, fsmonitor,
  signing, ssh, credential and alternate-refs helpers, and each filter and merge driver the config defines.
  A driver cannot be switched off by one blanket setting, so git itself is asked which ones the config
  defines (with the same environment, so includes and conditions resolve as they will) before a command runs;
- diffs and logs are run with --no-ext-diff --no-textconv (`NO_DRIVERS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shared import errors, lifeline

# Where the executor's git may come from, in this order: directories only root writes on a sane system, and
# that no spawn can write (the sandbox mounts / read-only).
SYSTEM_DIRS = ("/usr/bin", "/bin", "/usr/local/bin")
# The PATH of every git child (git's own helpers come from its exec-path, which it puts first)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# GIT_CONFIG_GLOBAL came in 2.32 (GIT_CONFIG_COUNT in 2.31)
MIN_VERSION = (2, 32)
# A git command that takes longer than this is killed (a network filesystem, a huge repository).
GIT_TIMEOUT_S = 120.0
VERSION_TIMEOUT_S = 20.0
# Passed to every command that may show a diff: external diff and textconv drivers are programs.
NO_DRIVERS = ("--no-ext-diff", "--no-textconv")
# Off whatever the repository's config says (each is a program git would run, or a walk into a nested
# repository whose own config would choose one).
FIXED_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("core.attributesFile", os.devnull),
    ("core.sshCommand", "false"),
    ("core.askPass", ""),
    ("core.alternateRefsCommand", "true"),
    ("credential.helper", ""),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("merge.verifySignatures", "false"),
    ("log.showSignature", "false"),
    ("diff.external", ""),
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("diff.ignoreSubmodules", "all"),
    ("status.submoduleSummary", "false"),
    ("protocol.allow", "never"),
    # what a fetch brings in is checked object by object (hash, connectivity, well-formed trees)
    ("transfer.fsckObjects", "true"),
    # no repack or gc started in the background by a command of ours
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
)
# A driver's settings: empty commands (git then runs none) and a filter that may be absent. A merge driver
# set to `false` fails, so a path that needed it conflicts and the merge is refused and undone.
_DRIVER_OFF = {"filter": (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")),
               "merge": (("driver", "false"),)}
_DRIVER_KEYS = r"^(filter|merge)\."
_VERSION = re.compile(r"git version (\d+)\.(\d+)")


class GitError(errors.PetalError):
    """A git command failed (the message carries its stderr), or git cannot be run safely."""


@dataclass(frozen=True, slots=True)
class Result:
    rc: int
    out: str
    err: str
    # stdout went on past the command's `limit`: `out` is its first part, and the command was stopped there
    cut: bool = False


def _safe(path: str) -> bool:
    """Neither the file nor its directory writable by anyone but its owner."""
    try:
        return not any(os.stat(p).st_mode & (stat.S_IWGRP | stat.S_IWOTH) for p in (path, os.path.dirname(path)))
    except OSError:
        return False


@functools.cache
def program() -> str:
    """The absolute path of the git the executor runs, resolved once (GitError: none fit, or too old)."""
    candidates = (shutil.which("git", path=directory) for directory in SYSTEM_DIRS)
    real = next((r for r in (os.path.realpath(c) for c in candidates if c is not None) if _safe(r)), None)
    if real is None:
        raise GitError(f"git is not installed in {', '.join(SYSTEM_DIRS)} (or is writable by others there): "
                       "install it (apt-get install git)")
    try:
        out = subprocess.run([real, "version"], env=base_env(), capture_output=True, text=True, check=False,
                             timeout=VERSION_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"{real} cannot run: {exc}") from None
    m = _VERSION.search(out)
    if m is None or (int(m[1]), int(m[2])) < MIN_VERSION:
        raise GitError(f"{real} is {out.strip() or 'not git'}: git {'.'.join(map(str, MIN_VERSION))} or newer "
                       "is needed")
    return real


def base_env() -> dict[str, str]:
    """What every git child runs with: never the services' settings or credentials, no GIT_* the executor
    was started with, a PATH of system directories, and no config or attributes but the repository's."""
    env = {k: v for k, v in lifeline.child_env(os.environ).items()
           if not k.upper().startswith("GIT_") and k.upper() not in ("EDITOR", "VISUAL", "PAGER")}
    env.update(PATH=SYSTEM_PATH, LC_ALL="C", GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1",
               GIT_CONFIG_GLOBAL=os.devnull, GIT_ATTR_NOSYSTEM="1", GIT_NO_REPLACE_OBJECTS="1",
               # local files only, overriding every config scope: a repository's `protocol.ext.allow` with a
               # `url.<x>.insteadOf` would otherwise turn the settlement's fetch into a command (ext::)
               GIT_ALLOW_PROTOCOL="file")
    return env


def config_env(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Command-scope config as environment variables (no quoting: a key or value may hold `=` or spaces)."""
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def driver_overrides(listing: str) -> list[tuple[str, str]]:
    """The settings that switch off each filter and merge driver named in `git config -z --get-regexp`'s
    output (`section.<subsection>.variable`, the subsection case-sensitive and possibly holding dots)."""
    drivers = dict.fromkeys((key[:key.index(".")], key[key.index(".") + 1:key.rindex(".")])
                            for key in (entry.partition("\n")[0] for entry in listing.split("\0"))
                            if key.count(".") >= 2)
    return [(f"{section}.{name}.{var}", value) for section, name in drivers for var, value in _DRIVER_OFF[section]]


async def _drain(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """A stream read to its end, keeping its first `limit` bytes; whether there was more."""
    kept = bytearray()
    more = False
    while chunk := await stream.read(1 << 16):
        room = limit - len(kept)
        kept += chunk[:max(room, 0)]
        more = more or len(chunk) > room
    return bytes(kept), more


async def _capped(proc: asyncio.subprocess.Process, limit: int) -> tuple[bytes, bytes, bool]:
    """stdout's first `limit` bytes, the command stopped once it goes past them (a diff of what a spawn committed
    can be gigabytes: never held whole), and stderr's first MiB."""
    assert proc.stdout is not None and proc.stderr is not None
    err = asyncio.ensure_future(_drain(proc.stderr, 1 << 20))
    out = bytearray()
    while len(out) <= limit and (chunk := await proc.stdout.read(1 << 16)):
        out += chunk
    cut = len(out) > limit
    if cut:
        with contextlib.suppress(ProcessLookupError):  # it may have ended on its own meanwhile
            proc.kill()
    await proc.wait()
    return bytes(out[:limit]), (await err)[0], cut


async def _run(cwd: Path, env: Mapping[str, str], args: Iterable[str], limit: int | None = None) -> Result:
    args = list(args)
    proc = await asyncio.create_subprocess_exec(
        program(), "-C", str(cwd), *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=dict(env))
    cut = False
    try:
        if limit is None:
            out, err = await asyncio.wait_for(proc.communicate(), GIT_TIMEOUT_S)
        else:
            out, err, cut = await asyncio.wait_for(_capped(proc, limit), GIT_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise GitError(f"git {' '.join(args)} timed out after {GIT_TIMEOUT_S:.0f}s") from None
    return Result(0 if cut else proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                  cut)


@dataclass(frozen=True, slots=True)
class Git:
    """git run at one directory, with the drivers its repository's config defines switched off (asked once,
    by `at`: the callers run a sequence of commands while nothing else writes that config)."""

    cwd: Path
    env: Mapping[str, str]

    @classmethod
    async def at(cls, cwd: Path, layout: Mapping[str, str] | None = None) -> Git:
        env = {**base_env(), **(layout or {}), **config_env(FIXED_OVERRIDES)}
        found = await _run(cwd, env, ("config", "-z", "--get-regexp", _DRIVER_KEYS))
        # 1: none defined (or no repository here: then the command itself says so)
        if found.rc not in (0, 1):
            raise GitError(f"git config in {cwd} failed: {found.err.strip()}")
        return cls(cwd, {**base_env(), **(layout or {}),
                         **config_env([*FIXED_OVERRIDES, *driver_overrides(found.out)])})

    @classmethod
    async def checkout(cls, repo: Path) -> Git:
        """git at a project's checkout with its work tree named rather than found: `repo`, whatever a spawn that had
        the checkout as its workdir wrote in its `.git` (a `core.worktree` naming another directory: the
        environment wins over every config file), so what the executor's git writes lands in the checkout. The
        repository is the one `repo/.git` leads to (a directory, or a linked worktree's `gitdir:` file).

        Raises:
            GitError: `repo` has no `.git` of its own (git would look for one in the directories above).
        """
        repo = repo.absolute()
        if not os.path.lexists(repo / ".git"):
            raise GitError(f"{repo} has no .git: not a checkout")
        found = await _run(repo, {**base_env(), **config_env(FIXED_OVERRIDES)}, ("rev-parse", "--absolute-git-dir"))
        if found.rc != 0 or not found.out.strip():
            raise GitError(f"git cannot read the repository of {repo}: {found.err.strip()}")
        return await cls.at(repo, {"GIT_DIR": found.out.strip(), "GIT_WORK_TREE": str(repo)})

    async def __call__(self, *args: str, check: bool = True, limit: int | None = None) -> Result:
        """The command's result (`limit`: keep at most this much of its stdout, stopping it past that)."""
        res = await _run(self.cwd, self.env, args, limit)
        if check and res.rc != 0:
            raise GitError(f"git {' '.join(args)} failed: {res.err.strip() or res.out.strip()}")
        return res

    def with_user_config(self) -> Git:
        """The same with the user's own config (~/.gitconfig) read: for values only (an identity), never
        for a command that could run something."""
        return Git(self.cwd, {k: v for k, v in self.env.items() if k != "GIT_CONFIG_GLOBAL"})


# cat-file's output is read in pieces of this size: a large blob is hashed without holding it whole
_CHUNK = 1 << 20


async def verify_objects(g: Git, tip: str, base: str | None) -> int:
    """Check that every object `tip` brings over `base` — its commits, trees and blobs, `tip` itself
    first — still hashes to its id (a loose object rewritten in place, or a pack changed, would not);
    how many were checked.

    Raises:
        GitError: an object is missing or no longer hashes to its id.
    """
    algorithm = (await g("rev-parse", "--show-object-format")).out.strip() or "sha1"
    listed = (await g("rev-list", "--objects", "--no-object-names", tip, *(("--not", base) if base else ()))).out
    ids = list(dict.fromkeys([tip, *listed.split()]))
    proc = await asyncio.create_subprocess_exec(
        program(), "-C", str(g.cwd), "cat-file", "--batch", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=dict(g.env))
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    async def feed() -> None:
        try:
            stdin.write("".join(f"{oid}\n" for oid in ids).encode())
            await stdin.drain()
            stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died: what it wrote says why

    async def check() -> None:
        for oid in ids:
            header = (await stdout.readline()).decode("ascii", "replace").split()
            if len(header) != 3 or header[0] != oid:
                raise GitError(f"object {oid} is missing from the repository ({' '.join(header[1:]) or 'no answer'})")
            kind, size = header[1], int(header[2])
            digest = hashlib.new(algorithm, f"{kind} {size}\0".encode())
            left = size
            while left:
                chunk = await stdout.read(min(left, _CHUNK))
                if not chunk:
                    raise GitError(f"object {oid} could not be read whole")
                digest.update(chunk)
                left -= len(chunk)
            await stdout.readexactly(1)  # the newline after each object
            if digest.hexdigest() != oid:
                raise GitError(f"object {oid} ({kind}) no longer hashes to its id: it was changed after it was "
                               "recorded")

    feeding = asyncio.ensure_future(feed())
    try:
        await asyncio.wait_for(check(), GIT_TIMEOUT_S)
    except TimeoutError:
        raise GitError(f"checking {len(ids)} objects timed out after {GIT_TIMEOUT_S:.0f}s") from None
    except asyncio.IncompleteReadError:
        raise GitError("git cat-file ended before every object was read") from None
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await feeding
    return len(ids)
